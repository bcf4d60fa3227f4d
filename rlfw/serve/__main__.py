"""Serve a policy and its adapters: `python -m rlfw.serve model.path=<base> serve.adapters_path=<adapters>`.

Starts Ray Serve LLM's OpenAI-compatible app (`ray.serve.llm.build_openai_app`, vLLM engines) on
serve.host:serve.port (127.0.0.1:8000): `model="<id>"` is the base, `model="<id>:<name>"` the adapter
under `<serve.adapters_path>/<name>/`, loaded on first request and cached. rlfw's ingress checks the
API key, adapter names and images first (`rlfw.serve.ingress`). A local adapters folder is served to
Ray from an S3 server on 127.0.0.1 (`rlfw.serve.adapters.LoopbackS3`); put adapters there with
`python -m rlfw.serve.export`.

    python -m rlfw.serve serve.adapters_path=adapters                    # the shipped base + ./adapters/*
    python -m rlfw.serve.export outputs/<run>/exports/global_step_400 adapters --name grpo400
    python -m rlfw.eval eval.base_url=http://127.0.0.1:8000/v1 eval.model=tiny_vl_maze_sft:grpo400
    python -m rlfw.serve serve.print_config=deploy/out serve.adapters_path=s3://bucket/adapters \\
        model.path=/shared/models/qwen3vl_8b_maze_sft serve.model_id=qwen3vl-8b-maze   # files for a cluster

Needs the vLLM environment with Ray Serve (`bash scripts/setup.sh --vllm`). Ctrl-C stops it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rlfw.config import ServeRunConfig, register_configs
from rlfw.validation import validate_serve

register_configs()


def _block_dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):  # serveConfigV2, a YAML document in a string: readable as a block
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return Dumper


def write_config(cfg: ServeRunConfig) -> list[Path]:
    """serve_config.yaml and rayservice.yaml under serve.print_config."""
    import yaml

    from rlfw.config import repo_root
    from rlfw.serve.app import rayservice, serve_config

    out = Path(cfg.serve.print_config)
    out.mkdir(parents=True, exist_ok=True)
    url = cfg.serve.adapters_path
    template = yaml.safe_load((Path(repo_root()) / "deploy" / "kuberay" / "rayservice.yaml").read_text())
    files = [out / "serve_config.yaml", out / "rayservice.yaml"]
    files[0].write_text(yaml.safe_dump(serve_config(cfg, url), sort_keys=False))
    files[1].write_text(yaml.dump(rayservice(cfg, url, template), Dumper=_block_dumper(), sort_keys=False))
    return files


def wait_ready(base: str, timeout_s: float, api_key: str | None) -> list[str]:
    """Poll GET /v1/models until it answers; the model ids it lists."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{base}/v1/models", headers=headers), timeout=10) as r:
                return [m["id"] for m in json.loads(r.read())["data"]]
        except Exception as exc:  # not up yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"the endpoint {base} did not come up within {timeout_s:.0f} s ({exc})") from exc
            time.sleep(2)


def run_serve(cfg: ServeRunConfig) -> None:
    validate_serve(cfg)
    s = cfg.serve
    if s.print_config:
        for f in write_config(cfg):
            print(f"rlfw.serve: wrote {f}", flush=True)
        return

    import ray
    from ray import serve
    from ray.serve.llm import build_openai_app

    from rlfw.serve.adapters import LoopbackS3, is_remote
    from rlfw.serve.app import builder_args, model_id_of

    store, url, env = None, s.adapters_path, {}
    if url and not is_remote(url):
        store = LoopbackS3(url).start()
        url, env = store.url, store.env
        os.environ.update(env)  # before Ray starts, so every Ray worker inherits it
        print(f"rlfw.serve: adapters of {s.adapters_path} served to Ray as {url} from {store.endpoint}", flush=True)
    api_key = os.environ.get(s.api_key_env) or None
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        if s.ray_address:
            ray.init(address=s.ray_address)
        else:
            ray.init(num_cpus=s.num_cpus or 4 + 2 * s.replicas, include_dashboard=False)
        serve.start(http_options={"host": s.host, "port": s.port})
        t0 = time.monotonic()
        app = build_openai_app(builder_args(cfg, url, api_key, env, base_source=str(Path(cfg.model.path).resolve())))
        serve.run(app, name=model_id_of(cfg), route_prefix="/", blocking=False)
        models = wait_ready(f"http://{s.host}:{s.port}", s.startup_timeout_s, api_key)
        print(f"rlfw.serve: ready in {time.monotonic() - t0:.0f} s at http://{s.host}:{s.port}/v1 "
              f"(models: {', '.join(models)}){'; API key required' if api_key else ''}", flush=True)
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("rlfw.serve: stopping", flush=True)
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            if store is not None:
                store.stop()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="serve")
def main(cfg: DictConfig) -> None:
    run_serve(OmegaConf.to_object(cfg))


if __name__ == "__main__":
    main()
