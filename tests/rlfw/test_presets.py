"""A few steps of each shipped preset, run as a user runs it, so that a preset that stops working
(a renamed key, a checkpoint that no longer loads, a setting that no longer takes effect) fails here."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *overrides: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_main_job_preset_runs_two_steps(tmp_path):
    """The RL stage of the README's main job, `experiment=maze_from_sft_dagger`: maze_from_sft's
    settings plus the oracle term and the speed settings (tests/rlfw/test_oracle_term.py checks it differs from
    maze_from_sft in nothing else). Without the compile, whose two minutes would buy two steps
    nothing; tests/rlfw/test_train_speed.py (slow) checks the compiled forward."""
    out = tmp_path / "run"
    proc = _run("rlfw.run", "experiment=maze_from_sft_dagger", "trainer.total_steps=2", "trainer.eval_interval=2",
                "trainer.heldout_eval_size=32", "trainer.ckpt_interval=2", "logger=console", f"trainer.output_dir={out}",
                "model.compile=false")
    rows = _rows(out)
    start = next(r for r in rows if r["step"] == 0)
    assert start["eval/maze/pass_at_1"] == 26 / 64  # the shipped checkpoint's recorded eval64 score
    train = [r for r in rows if "policy/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert train[0]["train/episodes"] == 64  # 8 mazes x 8 samples
    # four mini-batches per step (or fewer if target_kl stopped the step): the preset's settings hold
    assert train[0]["policy/optimizer_steps"] <= 4 and train[-1]["policy/optimizer_steps"] > train[0]["policy/optimizer_steps"]
    assert train[0]["policy/lr"] == 5e-4 and train[1]["policy/lr"] < 5e-4  # cosine from the peak
    assert all(r["train/oracle_states"] > 0 and r["policy/oracle_loss"] > 0 for r in train)  # the term is on
    assert (out / "checkpoints" / "global_step_2" / "manifest.json").exists()
    assert "| heldout |" in proc.stdout and (out / "pass_at_1.png").exists()


def test_sft_maze_preset_runs_and_writes_a_loadable_checkpoint(tmp_path):
    from rlfw.models import load_policy

    out = tmp_path / "sft"
    _run("rlfw.sft", "experiment=sft_maze", "sft.steps=20", "sft.eval_interval=20", "sft.eval_size=8",
         "logger=console", f"sft.output_dir={out}")
    losses = [r["sft/loss"] for r in _rows(out) if "sft/loss" in r]
    assert len(losses) == 2 and losses[1] < losses[0]
    model, processor = load_policy(out / "checkpoint")
    assert model.config.text_config.num_hidden_layers == 6 and processor.crop_px == 8  # the preset's architecture
    assert json.loads((out / "checkpoint" / "rlfw_sft.json").read_text())["step"] == 20
