"""`python -m rlfw.serve`'s config: checked before Ray starts, and `serve.print_config` writes the
same application as a Ray Serve config file and a KubeRay RayService that validates against the
CRD. No Ray Serve is needed (the running server is tested in tests/vllm/test_serve.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlfw.config import ServeRunConfig, register_configs, repo_root
from rlfw.validation import ConfigError, validate_serve

ROOT = Path(repo_root())
register_configs()
# The command in deploy/kuberay/rayservice.yaml's header that writes its serveConfigV2
CLUSTER = ["model=qwen3_vl_8b", "model.path=/shared/models/qwen3vl_8b_maze_sft", "serve.model_id=qwen3vl-8b-maze",
           "serve.adapters_path=s3://rlfw-example-bucket/rlfw/exports/qwen3vl_8b_maze", "serve.accelerator=gpu",
           "serve.memory_utilization=0.9", "serve.max_model_len=32768", "serve.replicas=2"]


def compose_serve(*overrides: str) -> ServeRunConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="serve", overrides=list(overrides)))


def _adapter(folder: Path, rank: int = 8) -> None:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "base_model_name_or_path": "x"}))
    (folder / "adapter_model.safetensors").write_bytes(b"")


@pytest.mark.parametrize("overrides, message", [
    (["model.path=null"], "model.path is not set"),
    (["model.path=/nonexistent/base"], "no such model folder"),
    (["serve.adapters_path=/nonexistent/adapters"], "serve.adapters_path=/nonexistent/adapters: no such folder"),
    (["serve.adapters_path={tmp}/empty"], "holds no <name>/adapter_config.json"),
    (["serve.adapters_path={tmp}/bad_name"], "adapter name 'a b'"),
    (["serve.adapters_path={tmp}/rank32", "serve.max_lora_rank=16"], "has rank 32 > serve.max_lora_rank=16"),
    (["serve.adapters_path=http://example.com/a"], "a local folder or one of s3://"),
    (["serve.print_config={tmp}/out", "serve.adapters_path={tmp}/rank32"], "a cluster reads adapters from remote"),
    (["serve.adapters_path={tmp}/rank32", "serve.ray_address=auto"], "the replicas of a cluster"),
    (["serve.model_id=a:b"], "hold no ':'"),
    (["serve.port=0"], "serve.port=0: must be in 1..65535"),
    (["serve.replicas=0"], "serve.replicas=0 must be >= 1"),
    (["serve.accelerator=tpu"], "serve.accelerator"),
    (["serve.memory_utilization=1.5"], "serve.memory_utilization=1.5"),
])
def test_bad_config_fails_before_ray_starts(tmp_path, overrides, message):
    (tmp_path / "empty").mkdir()
    _adapter(tmp_path / "bad_name" / "a b")
    _adapter(tmp_path / "rank32" / "grpo", rank=32)
    with pytest.raises(ConfigError) as err:
        validate_serve(compose_serve(*[o.format(tmp=tmp_path) for o in overrides]))
    assert message in str(err.value)


def test_the_local_adapters_set_the_rank_and_the_base_id_is_the_folder_name(tmp_path):
    from rlfw.serve.app import builder_args, model_id_of

    _adapter(tmp_path / "ad" / "small", rank=4)
    _adapter(tmp_path / "ad" / "large", rank=16)
    cfg = compose_serve(f"serve.adapters_path={tmp_path / 'ad'}")
    validate_serve(cfg)
    args = builder_args(cfg, "s3://rlfw-adapters/lora", api_key="k")
    (llm,) = args["llm_configs"]
    assert model_id_of(cfg) == "tiny_vl_maze_sft" == llm["model_loading_config"]["model_id"]
    assert llm["engine_kwargs"]["max_lora_rank"] == 16 and llm["engine_kwargs"]["enable_lora"] is True
    assert llm["lora_config"]["dynamic_lora_loading_path"] == "s3://rlfw-adapters/lora"
    assert args["ingress_cls_config"]["ingress_cls"] == "rlfw.serve.ingress:GuardedIngress"
    assert args["ingress_cls_config"]["ingress_extra_kwargs"]["api_key"] == "k"


def test_print_config_writes_a_serve_config_and_a_valid_rayservice(tmp_path):
    from tests.rlfw.test_kuberay import errors

    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "rlfw.serve", *CLUSTER, f"serve.print_config={out}",
                    f"hydra.run.dir={tmp_path / 'h'}"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    config = yaml.safe_load((out / "serve_config.yaml").read_text())
    service = yaml.safe_load((out / "rayservice.yaml").read_text())
    assert errors(service) == []
    (app,) = config["applications"]
    assert app["import_path"] == "rlfw.serve.app:build_app"
    assert yaml.safe_load(service["spec"]["serveConfigV2"])["applications"] == config["applications"]
    (llm,) = app["args"]["llm_configs"]
    assert llm["model_loading_config"] == {"model_id": "qwen3vl-8b-maze", "model_source": "/shared/models/qwen3vl_8b_maze_sft"}
    assert llm["engine_kwargs"]["max_lora_rank"] == 32 and llm["engine_kwargs"]["dtype"] == "bfloat16"  # model.lora.rank
    assert llm["accelerator_config"] == {"kind": "gpu"} and llm["deployment_config"]["num_replicas"] == 2
    extra = app["args"]["ingress_cls_config"]["ingress_extra_kwargs"]
    assert "api_key" not in extra and extra["api_key_env"] == "RLFW_SERVE_API_KEY"  # no secret in a file
    # the shipped manifest is this command's output
    shipped = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text())
    assert yaml.safe_load(shipped["spec"]["serveConfigV2"]) == yaml.safe_load(service["spec"]["serveConfigV2"])
