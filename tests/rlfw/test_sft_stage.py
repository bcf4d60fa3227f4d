"""Config.sft_stage: continued SFT, then RL from its checkpoint, in one `rlfw.run` (preset
experiment=maze_sft_then_dagger). RL must start from the stage's weights, not model.path's; a
resubmitted job must reuse a finished stage; bad stage settings are refused before work starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlfw.validation import ConfigError
from tests.rlfw import procs
from tests.rlfw.inprocess import compose_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_preset_is_the_dagger_preset_after_an_sft_stage(tmp_path):
    """maze_sft_then_dagger = maze_from_sft_dagger + the stage, both sized by wall time, junction labels
    weighed 10; nothing else."""
    dagger = compose_config(tmp_path, "experiment=maze_from_sft_dagger")
    staged = compose_config(tmp_path, "experiment=maze_sft_then_dagger")
    assert dagger.sft_stage is None
    s = staged.sft_stage
    assert (s.lr, s.decay_fraction, s.eval_interval, s.states) == (5e-4, 1.0, 0, "all_squares")
    assert s.junction_fraction == 0.5 and s.compile is True  # the stage compiled, RL eager (model.compile)
    assert (s.schedule, s.max_minutes) == ("minutes", 28)  # both halves sized by wall time; steps are caps
    assert s.output_dir == str(tmp_path / "sft_stage")  # inside the run's folder, so a resubmitted job finds it
    t = staged.trainer
    assert (t.schedule, t.max_minutes, staged.model.compile) == ("minutes", 12, False)
    assert staged.algo.oracle_tag_weights == {"junction": 10} and dagger.algo.oracle_tag_weights == {}
    staged.sft_stage, staged.model.compile = None, dagger.model.compile
    staged.algo.oracle_tag_weights = dagger.algo.oracle_tag_weights
    t.total_steps, t.max_minutes, t.schedule = (dagger.trainer.total_steps, dagger.trainer.max_minutes,
                                                dagger.trainer.schedule)
    assert staged == dagger


def test_the_stage_group_turns_it_on_for_any_preset_and_off_for_this_one(tmp_path):
    """sft_stage=oracle gives the preset's stage to any run, its keys then set one by one from the command
    line (a bare sft_stage.steps= has no node to land on); ~sft_stage removes the preset's stage."""
    staged = compose_config(tmp_path, "experiment=maze_sft_then_dagger")
    mine = compose_config(tmp_path, "experiment=maze_from_sft_dagger", "sft_stage=oracle", "sft_stage.steps=300")
    assert mine.sft_stage.steps == 300 and mine.sft_stage.output_dir == str(tmp_path / "sft_stage")
    mine.sft_stage.steps = staged.sft_stage.steps
    assert mine.sft_stage == staged.sft_stage
    assert compose_config(tmp_path, "experiment=maze_sft_then_dagger", "~sft_stage").sft_stage is None


def test_the_stage_alone_is_compiled(tmp_path):
    """The preset's sft_stage.compile=true compiles the stage's training forward while RL keeps
    model.compile (false); sft_stage.compile=false leaves both eager."""
    from rlfw.config import sft_stage_config

    cfg = compose_config(tmp_path, "experiment=maze_sft_then_dagger")
    assert cfg.model.compile is False and sft_stage_config(cfg).sft.compile is True
    cfg = compose_config(tmp_path, "experiment=maze_sft_then_dagger", "sft_stage.compile=false")
    assert sft_stage_config(cfg).sft.compile is False


def test_a_staged_run_starts_from_its_stage_checkpoint_and_others_from_model_path(tmp_path):
    """rl_start_model: what merge_adapter and failure_analysis take as a run's base, from its config."""
    from rlfw.config import rl_start_model

    staged = compose_config(tmp_path, "experiment=maze_sft_then_dagger")
    assert rl_start_model(staged) == str(tmp_path / "sft_stage" / "checkpoint")
    plain = compose_config(tmp_path, "experiment=maze_sft_then_dagger", "~sft_stage")
    assert rl_start_model(plain) == plain.model.path


def test_bad_stage_settings_are_refused_under_their_own_keys(tmp_path):
    with pytest.raises(ConfigError) as err:
        compose_config(tmp_path, "experiment=maze_sft_then_dagger", "sft_stage.steps=0", "sft_stage.states=path")
    assert "sft_stage.steps=0 must be >= 1" in str(err.value) and "sft_stage.states='path'" in str(err.value)


def _weights(folder: Path) -> dict:
    return load_file(str(next(folder.glob("*.safetensors"))))


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlfw.run", "experiment=maze_sft_then_dagger", "sft_stage.steps=4",
           "sft_stage.batch_size=8", "sft_stage.compile=false",  # a 4-step stage would only pay the compile
           "trainer.total_steps=1", "trainer.eval_interval=1", "trainer.heldout_eval_size=0",
           "env.eval_set=eval64", "trainer.ckpt_interval=1", "trainer.max_minutes=null", "trainer.schedule=steps",
           "algo.tasks_per_step=2", "algo.tasks_per_optimizer_step=2", "logger=console", f"trainer.output_dir={out}",
           *extra]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(out, *extra), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_rl_starts_from_the_stage_checkpoint_and_a_rerun_reuses_it(tmp_path):
    out = tmp_path / "run"
    proc = _run(out)
    final = out / "sft_stage" / "checkpoint"
    record = json.loads((final / "rlfw_sft.json").read_text())
    assert record["step"] == 4 and "its SFT stage" in record["command"]
    assert f"model: starting from {final}" in proc.stdout  # RL's start is the stage's checkpoint
    # the stage trained: its weights moved away from the shipped checkpoint's
    shipped, staged = _weights(ROOT / "checkpoints" / "tiny_vl_maze_sft"), _weights(final)
    assert shipped.keys() == staged.keys()
    assert any(not torch.equal(shipped[k], staged[k]) for k in shipped)
    start = next(json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["step"] == 0)
    assert "eval/maze/pass_at_1" in start  # RL's step-0 evaluation scores the stage
    mtime = (final / "rlfw_sft.json").stat().st_mtime_ns
    proc = _run(out, "trainer.resume_mode=latest")
    assert "SFT stage already done" in proc.stdout and f"model: starting from {final}" in proc.stdout
    assert (final / "rlfw_sft.json").stat().st_mtime_ns == mtime  # not trained again


def test_a_killed_stage_continues_when_the_run_resumes(tmp_path):
    """SIGKILL in the stage once its state at step 2 is saved; the run resubmitted with
    trainer.resume_mode=latest continues the stage from there (not from step 0), then runs RL."""
    out, every = tmp_path / "run", "sft_stage.ckpt_interval=2"
    saved = out / "sft_stage" / "train_state" / "global_step_2" / "manifest.json"
    procs.kill_when(_cmd(out, every), ROOT, saved.exists)
    assert not (out / "sft_stage" / "checkpoint").exists()
    done = _run(out, every, "trainer.resume_mode=latest")
    assert "resumed from" in done.stdout, done.stdout[-3000:]
    assert f"{out / 'sft_stage' / 'train_state' / 'global_step_2'} (step 2)" in done.stdout
    assert "changed setting" not in done.stdout  # only trainer.resume_mode differs, which the stage does not compare
    assert json.loads((out / "sft_stage" / "checkpoint" / "rlfw_sft.json").read_text())["step"] == 4
    assert not (out / "sft_stage" / "train_state").exists()
    assert any(json.loads(line)["step"] == 1 for line in (out / "metrics.jsonl").read_text().splitlines())  # RL ran
