"""The training loop's bookkeeping, run in this process (tests/rlfw/inprocess.py): what it publishes,
keeps and logs."""

import json

import pytest

from tests.rlfw.inprocess import compose_config, train_in_process


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_checkpoint_pruning_keeps_the_inference_exports(tmp_path):
    """ckpt every 5, export every 10, keep 2 checkpoints: step 10's export outlives step 10's checkpoint."""
    out = tmp_path / "run"
    cfg = compose_config(out, "experiment=debug", "trainer.total_steps=20", "trainer.eval_interval=0",
                         "trainer.ckpt_interval=5", "trainer.hf_save_interval=10", "trainer.max_ckpts_to_keep=2")
    train_in_process(cfg)
    assert sorted(p.name for p in (out / "checkpoints").glob("global_step_*")) == ["global_step_15", "global_step_20"]
    for step in (10, 20):
        export = out / "exports" / f"global_step_{step}"
        assert (export / "adapter_model.safetensors").exists() and (export / "tokenizer.json").exists()


def test_exports_are_pruned_by_their_own_setting(tmp_path):
    out = tmp_path / "run"
    cfg = compose_config(out, "experiment=debug", "trainer.total_steps=3", "trainer.eval_interval=0",
                         "trainer.hf_save_interval=1", "trainer.max_exports_to_keep=2")
    train_in_process(cfg)
    assert sorted(p.name for p in (out / "exports").iterdir()) == ["global_step_2", "global_step_3"]


def test_a_non_finite_loss_stops_the_run_before_the_weights_are_published(tmp_path, nan_policy_loss):
    out = tmp_path / "run"
    cfg = compose_config(out, "experiment=debug", "trainer.eval_interval=0", f"algo.policy_loss_type={nan_policy_loss}")
    with pytest.raises(FloatingPointError, match="nothing of this step was published"):
        train_in_process(cfg)
    assert (out / "lora_sync" / "LATEST").read_text() == "0"  # the engines still have the starting weights
    assert not (out / "lora_sync" / "v1").exists()


def test_eval_all_means_the_same_sets_at_every_evaluation(tmp_path):
    """Held-out mazes are evaluated only first and last; eval/all covers the sets evaluated every
    time, so at step 0 (where held-out is evaluated too) it still equals the env's own set."""
    out = tmp_path / "run"
    cfg = compose_config(out, "trainer.total_steps=2", "trainer.eval_interval=1", "trainer.heldout_eval_size=32",
                         "trainer.eval_save_episodes=0", "algo.n_samples_per_prompt=2", "algo.tasks_per_step=2",
                         "algo.tasks_per_optimizer_step=2", "logger=console", "logger.console=false")
    train_in_process(cfg)  # the default start: the shipped SFT checkpoint, so pass@1 is not all zeros
    evals = [r for r in _rows(out) if "eval/all/pass_at_1" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert [("eval/heldout/pass_at_1" in r) for r in evals] == [True, False, True]
    for r in evals:
        for metric in ("pass_at_1", "turns_mean", "wall_bump_rate"):
            assert r[f"eval/all/{metric}"] == r[f"eval/maze/{metric}"], (r["step"], metric)
    # the held-out set scores differently, so a mix of both would have shown
    assert evals[0]["eval/heldout/pass_at_1"] != evals[0]["eval/maze/pass_at_1"]


def test_max_minutes_makes_the_step_that_passes_it_the_last(tmp_path):
    """A limit that step 1 already passes: step 1 is evaluated (held-out too), checkpointed and
    exported as the last step, and step 2 of the 5 never runs."""
    out = tmp_path / "run"
    cfg = compose_config(out, "experiment=debug", "trainer.total_steps=5", "trainer.eval_interval=4",
                         "trainer.heldout_eval_size=4", "trainer.ckpt_interval=4", "trainer.hf_save_interval=4",
                         "trainer.max_minutes=0.0001", "trainer.eval_save_episodes=0")
    train_in_process(cfg)
    rows = _rows(out)
    assert max(r["step"] for r in rows) == 1
    assert [r["step"] for r in rows if "eval/heldout/pass_at_1" in r] == [0, 1]
    assert [p.name for p in (out / "checkpoints").glob("global_step_*")] == ["global_step_1"]
    assert [p.name for p in (out / "exports").iterdir()] == ["global_step_1"]
    assert "past trainer.max_minutes=0.0001; this step is the last" in (out / "run.log").read_text()


def test_schedule_by_minutes_puts_the_cosine_on_the_time_budget(tmp_path):
    """trainer.schedule=minutes with a step cap far beyond the time: the run ends at the step past
    max_minutes, and its LR falls step by step with the time spent, not with total_steps (where the
    cosine over 10,000 steps would still be at its peak)."""
    out = tmp_path / "run"
    cfg = compose_config(out, "experiment=debug", "trainer.total_steps=10000", "trainer.eval_interval=0",
                         "trainer.schedule=minutes", "trainer.max_minutes=0.1", "algo.lr_schedule=cosine",
                         "algo.lr=1e-3")
    train_in_process(cfg)
    lrs = [r["policy/lr"] for r in _rows(out) if "policy/lr" in r]
    assert 2 <= len(lrs) < 10000
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.9 * lrs[0] and lrs[0] <= 1e-3, lrs
    assert "past trainer.max_minutes=0.1; this step is the last" in (out / "run.log").read_text()
