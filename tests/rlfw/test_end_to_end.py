"""A 2-step GRPO run through Ray, as a user runs it: `python -m rlfw.run experiment=debug`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


def test_debug_run_through_ray_updates_policy_and_engine(tmp_path):
    out = tmp_path / "run"
    # entropy bonus: a random-init policy almost never solves a maze, so rewards (and GRPO
    # advantages) are all zero; the bonus makes every trainable parameter receive a gradient.
    cmd = [sys.executable, "-m", "rlfw.run", "experiment=debug", "logger=default", "algo.entropy_coef=0.01",
           f"trainer.output_dir={out}"]
    env = dict(os.environ, WANDB_SILENT="true")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"outputs in {out}" in proc.stdout

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    evals = [r for r in rows if "eval/maze/pass_at_1" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2]
    for r in train:
        for key in ["policy/loss", "policy/entropy", "policy/grad_norm", "timing/generate", "timing/env",
                    "timing/train", "timing/sync"]:
            assert key in r, key
        assert r["policy/engine_weights_version"] == r["step"]  # the engine loaded this step's adapter
        # each worker's peak memory, measured in its own process (a Ray actor: not the driver's)
        assert 50 < r["memory/trainer_peak_rss_mb"] < 16_000 and 50 < r["memory/engine_peak_rss_mb"] < 16_000
    assert "eval/maze/solvable_fraction" in evals[0] and "eval/all/pass_at_1" in evals[0]

    # every trainable (LoRA) tensor changed: B left zero at step 1, A moved at step 2
    v1 = load_file(str(out / "lora_sync" / "v1" / "adapter_model.safetensors"))
    v2 = load_file(str(out / "lora_sync" / "v2" / "adapter_model.safetensors"))
    assert v1.keys() == v2.keys() and len(v1) > 0
    for name in v1:
        assert not torch.equal(v1[name], v2[name]), f"{name} did not change"
        if "lora_B" in name:
            assert v1[name].abs().sum() > 0

    assert (out / "eval" / "step_000002" / "maze" / "episodes.jsonl").exists()
    assert list((out / "eval" / "step_000000" / "maze").glob("*.gif"))
    assert list((out / "tensorboard").glob("events.*"))
    assert list((out / "wandb").glob("offline-run-*"))
