"""Ray Serve LLM's OpenAI app from an rlfw config: the builder arguments, a Serve config file and a
KubeRay RayService manifest, all from one function (`builder_args`), so what runs here and what a
cluster deploys are the same application.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlfw.config import ServeRunConfig
from rlfw.serve.adapters import is_remote, local_adapters

INGRESS = "rlfw.serve.ingress:GuardedIngress"


def model_id_of(cfg: ServeRunConfig) -> str:
    return cfg.serve.model_id or Path(cfg.model.path.rstrip("/")).name


def adapter_rank(cfg: ServeRunConfig) -> int:
    """serve.max_lora_rank, else the largest rank in a local adapters folder, else model.lora.rank."""
    s = cfg.serve
    if s.max_lora_rank:
        return s.max_lora_rank
    ranks = [int(c.get("r", 0)) for c in local_adapters(s.adapters_path).values()] \
        if s.adapters_path and not is_remote(s.adapters_path) else []
    return max(ranks or [cfg.model.lora.rank or 8])


def accelerator(cfg: ServeRunConfig) -> str:
    if cfg.serve.accelerator != "auto":
        return cfg.serve.accelerator
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def builder_args(cfg: ServeRunConfig, adapters_url: str | None, api_key: str | None,
                 env_vars: dict[str, str] | None = None, base_source: str | None = None) -> dict:
    """`build_openai_app`'s argument: one LLMConfig (the base, with dynamic LoRA loading from
    `adapters_url`) behind rlfw's guarded ingress."""
    s = cfg.serve
    kind = accelerator(cfg)
    engine = {"dtype": cfg.model.dtype, "gpu_memory_utilization": s.memory_utilization,
              "max_model_len": s.max_model_len, "seed": cfg.seed}
    if kind == "cpu":
        engine["enforce_eager"] = True  # no CUDA graphs on the CPU backend
    if adapters_url:
        engine.update(enable_lora=True, max_lora_rank=adapter_rank(cfg), max_loras=s.max_adapters_per_replica)
    engine.update(s.engine_kwargs)
    llm = {
        "model_loading_config": {"model_id": model_id_of(cfg), "model_source": base_source or cfg.model.path},
        "accelerator_config": {"kind": kind},
        "engine_kwargs": engine,
        "deployment_config": {"num_replicas": s.replicas},
    }
    if adapters_url:
        llm["lora_config"] = {"dynamic_lora_loading_path": adapters_url,
                              "max_num_adapters_per_replica": s.max_adapters_per_replica}
    if env_vars:
        llm["runtime_env"] = {"env_vars": dict(env_vars)}
    ingress_kwargs = {"api_key": api_key, "max_image_pixels": s.max_image_pixels, "max_image_bytes": s.max_image_bytes,
                      "max_images": s.max_images, "allow_remote_images": s.allow_remote_images}
    args = {"llm_configs": [llm],
            "ingress_cls_config": {"ingress_cls": INGRESS, "ingress_extra_kwargs": ingress_kwargs}}
    if env_vars:
        args["ingress_deployment_config"] = {"ray_actor_options": {"runtime_env": {"env_vars": dict(env_vars)}}}
    return args


def serve_config(cfg: ServeRunConfig, adapters_url: str | None) -> dict:
    """A Ray Serve config file (`serve deploy serve_config.yaml`) for this application. The API key
    is read on the cluster from the environment variable serve.api_key_env (set it in the pods)."""
    args = builder_args(cfg, adapters_url, api_key=None)
    args["ingress_cls_config"]["ingress_extra_kwargs"].pop("api_key")
    args["ingress_cls_config"]["ingress_extra_kwargs"]["api_key_env"] = cfg.serve.api_key_env
    return {
        "http_options": {"host": "0.0.0.0", "port": cfg.serve.port},
        "applications": [{"name": model_id_of(cfg), "route_prefix": "/",
                          "import_path": "rlfw.serve.app:build_app", "args": args}],
    }


def build_app(args: dict):
    """Ray Serve's import path for a config file: `args` as `builder_args` makes them, with the API
    key taken from the environment variable the ingress arguments name (`api_key_env`)."""
    import os

    from ray.serve.llm import build_openai_app

    args = json.loads(json.dumps(args))  # a plain copy
    extra = args.get("ingress_cls_config", {}).get("ingress_extra_kwargs", {})
    if "api_key_env" in extra:
        extra["api_key"] = os.environ.get(extra.pop("api_key_env")) or None
    return build_openai_app(args)


def rayservice(cfg: ServeRunConfig, adapters_url: str | None, template: dict) -> dict:
    """A KubeRay RayService: `template`'s rayClusterConfig (deploy/kuberay/rayservice.yaml) with this
    application as serveConfigV2."""
    import yaml

    out = json.loads(json.dumps(template))
    config = serve_config(cfg, adapters_url)
    out["spec"]["serveConfigV2"] = yaml.safe_dump({"applications": config["applications"]}, sort_keys=False)
    for group in [out["spec"]["rayClusterConfig"]["headGroupSpec"], *out["spec"]["rayClusterConfig"]["workerGroupSpecs"]]:
        for c in group["template"]["spec"]["containers"]:
            c["image"] = cfg.serve.image
    return out
