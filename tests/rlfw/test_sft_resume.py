"""A killed SFT run continues from its last saved state (sft.ckpt_interval, sft.resume_mode=latest) to
the uninterrupted run's checkpoint, bit for bit; a finished run is not trained again; a change to the
model is refused and other changes are reported."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlfw.checkpoint import CheckpointError
from rlfw.sft import TRAIN_STATE, run_sft
from rlfw.validation import ConfigError
from tests.rlfw import procs
from tests.rlfw.test_sft import _cfg

ROOT = Path(__file__).resolve().parents[2]
TINY = ["env.max_turns=4", "env.eval_set=eval64", "model.tiny.num_layers=1", "model.tiny.hidden_size=64",
        "model.tiny.intermediate_size=128", "model.tiny.vision_depth=1", "model.tiny.image_crop_px=8"]


def _sft(out: Path, *extra: str, kill_when=None) -> str:
    """`python -m rlfw.sft` on a tiny policy: 40 steps, evaluated at 20 and 40, its state saved every 5
    steps; with `kill_when`, SIGKILL once it holds. Returns the output of a run that ended by itself."""
    cmd = [sys.executable, "-m", "rlfw.sft", *TINY, "sft.steps=40", "sft.batch_size=8", "sft.lr=3e-3",
           "sft.warmup_steps=5", "sft.eval_interval=20", "sft.eval_size=4", "sft.ckpt_interval=5",
           "sft.torch_threads=1", "logger=console", f"sft.output_dir={out}", f"hydra.run.dir={out}/hydra", *extra]
    if kill_when is None:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout + proc.stderr
    procs.kill_when(cmd, ROOT, kill_when)
    return ""


def _history(out: Path) -> list[dict]:
    """The logged metrics without wall-clock ones (rows that held only those drop out)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not k.startswith("timing/") and k != "sft/states_per_s"} for r in rows]
    return [r for r in rows if len(r) > 1]


def test_killed_sft_resumes_to_the_uninterrupted_result(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _sft(straight)
    assert not (straight / TRAIN_STATE).exists()  # the final checkpoint replaces the saved state
    _sft(killed, kill_when=lambda: (killed / TRAIN_STATE / "global_step_10" / "manifest.json").exists())
    assert not (killed / "checkpoint").exists()
    output = _sft(killed, "sft.resume_mode=latest")
    resumed_at = int(output.split("(step ")[1].split(")")[0])
    assert "resumed from" in output and 10 <= resumed_at < 40, output[-3000:]
    a = load_file(str(straight / "checkpoint" / "model.safetensors"))
    b = load_file(str(killed / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert _history(straight) == _history(killed)  # the same losses, LRs and evaluations, each step once
    info = json.loads((killed / "checkpoint" / "rlfw_sft.json").read_text())
    assert info["step"] == 40 and "eval/heldout/pass_at_1" in info


def test_a_finished_run_is_not_trained_again(tmp_path):
    cfg = _cfg(tmp_path, steps=4, batch_size=4, eval_interval=4, eval_size=4, ckpt_interval=2)
    first = run_sft(cfg)
    record = tmp_path / "checkpoint" / "rlfw_sft.json"
    mtime = record.stat().st_mtime_ns
    cfg.sft.resume_mode = "latest"
    again = run_sft(cfg)
    assert record.stat().st_mtime_ns == mtime
    assert again == {k: v for k, v in first.items() if k.startswith("eval/")}


class _StopAt:
    """Raise KeyboardInterrupt at the start of step `n` (as a Ctrl-C between steps would)."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __call__(self):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt


def test_a_changed_model_is_refused_and_other_changes_are_reported(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, steps=8, batch_size=4, eval_interval=0, ckpt_interval=2)
    monkeypatch.setattr("rlfw.sft.raise_if_signalled", _StopAt(6))
    with pytest.raises(KeyboardInterrupt):
        run_sft(cfg)
    log = (tmp_path / "run.log").read_text()
    assert "stopped in step 6" in log and "sft.resume_mode=latest" in log
    monkeypatch.undo()
    cfg.sft.resume_mode = "latest"
    changed = _cfg(tmp_path, steps=8, batch_size=4, eval_interval=0, ckpt_interval=2, resume_mode="latest")
    changed.model.tiny.hidden_size = 32
    with pytest.raises(CheckpointError, match=r"model\.tiny\.hidden_size.*sft\.resume_mode=none"):
        run_sft(changed)
    cfg.sft.lr = 2e-3
    run_sft(cfg)
    out = capsys.readouterr().out
    assert "(step 4)" in out and "warning: resuming with a changed setting: sft.lr" in out
    assert "changed setting: sft.resume_mode" not in out  # the resume's own change is no news
    assert json.loads((tmp_path / "checkpoint" / "rlfw_sft.json").read_text())["step"] == 8
    # rows after the state resumed from were dropped and logged again by the resumed run: each step once
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6, 8], steps


@pytest.mark.parametrize("key, value, message", [("resume_mode", "auto", "sft.resume_mode='auto' is not one of"),
                                                 ("ckpt_interval", -1, "sft.ckpt_interval=-1 must be >= 0")])
def test_bad_resume_settings_are_refused(tmp_path, key, value, message):
    with pytest.raises(ConfigError, match=message):
        run_sft(_cfg(tmp_path, **{key: value}))
