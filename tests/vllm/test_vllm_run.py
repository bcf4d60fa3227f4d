"""`python -m rlfw.run experiment=debug cluster.engine_backend=vllm` through Ray, in the vLLM
environment, with one engine and with two."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.vllm


def _run(out: Path, *overrides: str) -> list[dict]:
    # the shipped checkpoint: vLLM's CPU attention has no kernel for the debug model's head_dim of 16
    proc = subprocess.run([sys.executable, "-m", "rlfw.run", "experiment=debug", "model=tiny_vl_sft",
                           "cluster.engine_backend=vllm", "cluster.vllm.memory_utilization=0.15",
                           # LoRA rank 8: vLLM's CPU LoRA kernels slow down with max_lora_rank (32 is ~5x slower)
                           "model.lora.rank=8", "env.eval_size=16",
                           f"trainer.output_dir={out}", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]


@pytest.fixture(scope="module")
def one_engine(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("one") / "run")


def test_debug_run_trains_through_ray_with_the_vllm_engine(one_engine):
    assert [r["step"] for r in one_engine] == [1, 2]
    for r in one_engine:
        assert r["policy/engine_weights_version"] == r["step"]  # vLLM serves this step's adapter
        assert r["policy/rollout_logp_abs_diff"] < 1e-4  # ... and samples from the trainer's weights


def test_two_engines_give_the_episodes_of_one(one_engine, tmp_path):
    """Each request samples from (step seed, episode, turn), whichever engine serves it."""
    two = _run(tmp_path / "run", "cluster.num_engines=2")
    assert [r["step"] for r in two] == [1, 2]
    for a, b in zip(one_engine, two):
        same = {k: a[k] for k in a if k.startswith("train/")}
        assert same == {k: b[k] for k in same}, (same, b)
        for k in ("policy/loss", "policy/entropy", "policy/grad_norm"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
