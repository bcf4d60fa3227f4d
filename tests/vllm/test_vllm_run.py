"""`python -m rlfw.run experiment=debug cluster.engine_backend=vllm` through Ray, in the vLLM environment."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
def test_debug_run_trains_through_ray_with_the_vllm_engine(tmp_path):
    # the shipped checkpoint: vLLM's CPU attention has no kernel for the debug model's head_dim of 16
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlfw.run", "experiment=debug", "model=tiny_vl_sft",
                           "cluster.engine_backend=vllm", f"trainer.output_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["policy/engine_weights_version"] == r["step"]  # vLLM serves this step's adapter
        assert r["policy/rollout_logp_abs_diff"] < 1e-4  # ... and samples from the trainer's weights
