"""GRPO through Ray, as a user runs it: `python -m rlfw.run experiment=debug ...`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlfw.run", "experiment=debug", f"trainer.output_dir={out}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, WANDB_SILENT="true", **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_grpo_through_ray_trains_the_shipped_policy_on_a_real_signal(tmp_path):
    """From the shipped SFT checkpoint at 20 turns, groups have episodes that succeed and episodes
    that fail (dynamic sampling keeps only those, as DAPO): nonzero advantages, and with no entropy
    bonus every LoRA tensor moves by the policy gradient alone; the engine samples from each
    step's adapter."""
    out = tmp_path / "run"
    proc = _run(out, "model=tiny_vl_sft", "env.max_turns=20", "algo.n_samples_per_prompt=4",
                "algo.dynamic_sampling=resample", "logger=default")
    assert f"outputs in {out}" in proc.stdout
    assert "model: starting from" in proc.stdout + proc.stderr

    rows = _rows(out)
    train = [r for r in rows if "train/reward_mean" in r]
    evals = [r for r in rows if "eval/maze/pass_at_1" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2]
    assert evals[0]["eval/maze/pass_at_1"] > 0.2  # the shipped start, not a random policy
    assert all(r["train/advantage_abs_mean"] > 0 for r in train)
    for r in train:
        for key in ["policy/loss", "policy/entropy", "policy/grad_norm", "timing/generate", "timing/env",
                    "timing/train", "timing/sync"]:
            assert key in r, key
        assert r["policy/engine_weights_version"] == r["step"]  # the engine loaded this step's adapter
        assert r["policy/rollout_logp_abs_diff"] < 1e-3  # ... and sampled from the trainer's weights
        # each worker's peak memory, measured in its own process (a Ray actor: not the driver's)
        assert 50 < r["memory/trainer_peak_rss_mb"] < 16_000 and 50 < r["memory/engine_peak_rss_mb"] < 16_000

    # every trainable (LoRA) tensor changed: B left zero at step 1, A moved at step 2
    v1 = load_file(str(out / "lora_sync" / "v1" / "adapter_model.safetensors"))
    v2 = load_file(str(out / "lora_sync" / "v2" / "adapter_model.safetensors"))
    assert v1.keys() == v2.keys() and len(v1) > 0
    for name in v1:
        assert not torch.equal(v1[name], v2[name]), f"{name} did not change"
        if "lora_B" in name:
            assert v1[name].abs().sum() > 0

    # the run folder keeps what a later reader needs, although trainer.output_dir was set
    from rlfw.config_io import load_run_config

    assert load_run_config(out).env.max_turns == 20
    assert "model: starting from" in (out / "run.log").read_text()
    assert (out / "eval" / "step_000002" / "maze" / "episodes.jsonl").exists()
    assert list((out / "eval" / "step_000000" / "maze").glob("*.gif"))
    assert list((out / "tensorboard").glob("events.*"))
    assert list((out / "wandb").glob("offline-run-*"))


USER_ALGOS = '''
import torch
from rlfw.algos import get_policy_loss, register_adv_est, register_policy_loss


@register_adv_est("batch_mean")
def batch_mean(rewards, group_ids, *, eps=1e-6):
    return rewards - rewards.mean()  # one baseline for the whole batch


@register_policy_loss("counted_ppo")
def counted_ppo(logp, old_logp, advantages, mask, **kw):
    loss, stats = get_policy_loss("ppo")(logp, old_logp, advantages, mask, **kw)
    stats["user_loss_calls"] = torch.tensor(1.0)  # logged as policy/user_loss_calls: it ran in the trainer
    return loss, stats
'''


def test_a_users_grpo_variant_trains_through_ray_with_algo_module(tmp_path):
    """The README's 'Adding a GRPO variant': a user's module named by algo.module is imported in the
    driver (the estimator, and validation) and in the trainer worker (the loss)."""
    (tmp_path / "my_algos.py").write_text(USER_ALGOS)
    out = tmp_path / "run"
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    _run(out, "algo.module=my_algos", "algo.advantage_estimator=batch_mean", "algo.policy_loss_type=counted_ppo",
         "trainer.eval_interval=0", "algo.entropy_coef=0.01", env={"PYTHONPATH": path})
    train = [r for r in _rows(out) if "policy/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["policy/user_loss_calls"] == 1.0 for r in train)
