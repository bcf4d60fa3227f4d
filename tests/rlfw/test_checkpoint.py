"""Checkpoints are complete, verified and found again; a killed run resumes to the same result."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlfw import checkpoint, storage
from rlfw.config import Config, LoraConfig, ModelConfig
from tests.rlfw import procs
from tests.rlfw.procs import worker_pids

ROOT = Path(__file__).resolve().parents[2]


class FakePolicy:
    """Stands in for the trainer worker: writes a tensor file through fsspec like the real one."""

    def __init__(self, value: float):
        self.value = value

    def save_checkpoint(self, url: str, storage_options: dict) -> dict:
        import io

        import fsspec

        buf = io.BytesIO()
        torch.save({"w": torch.full((64,), self.value)}, buf)
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
        return storage.write_file(fs, path, buf.getvalue())


def _cfg(rank: int = 16) -> Config:
    return Config(model=ModelConfig(name="tiny_vl", lora=LoraConfig(rank=rank)))


def test_save_writes_manifest_pointer_and_prunes(tmp_path):
    store = checkpoint.CheckpointStore(str(tmp_path))
    for step in (1, 2, 3):
        store.save(step, FakePolicy(step), _cfg(), max_to_keep=2)
    assert (tmp_path / checkpoint.POINTER).read_text() == "3"
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    assert store.verify(f"{store.root}/global_step_3") is None
    found = store.find_resume(log=lambda m: None)
    assert found.step == 3


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "no_manifest"])
def test_damaged_latest_is_reported_and_skipped(tmp_path, damage):
    store = checkpoint.CheckpointStore(str(tmp_path))
    for step in (1, 2):
        store.save(step, FakePolicy(step), _cfg(), max_to_keep=0)
    victim = tmp_path / "global_step_2"
    state = victim / checkpoint.POLICY_STATE
    if damage == "truncate":
        state.write_bytes(state.read_bytes()[:100])
    elif damage == "corrupt":
        data = bytearray(state.read_bytes())
        data[-10] ^= 0xFF
        state.write_bytes(bytes(data))
    else:
        (victim / checkpoint.MANIFEST).unlink()
    messages = []
    found = store.find_resume(log=messages.append)
    assert found.step == 1
    assert "global_step_2" in messages[0] and "falling back" in messages[0]


def test_half_written_step_is_ignored(tmp_path):
    store = checkpoint.CheckpointStore(str(tmp_path))
    store.save(1, FakePolicy(1), _cfg(), max_to_keep=0)
    (tmp_path / "global_step_2.tmp").mkdir()  # a crash while writing step 2
    (tmp_path / "global_step_2.tmp" / "policy_state.pt").write_bytes(b"partial")
    assert store.find_resume(log=print).step == 1


def test_config_change_that_alters_meaning_is_refused(tmp_path):
    store = checkpoint.CheckpointStore(str(tmp_path))
    path = store.save(1, FakePolicy(1), _cfg(rank=16), max_to_keep=0)
    store.check_config(path, _cfg(rank=16), allow_changes=False)
    with pytest.raises(checkpoint.CheckpointError, match="model.lora.rank: checkpoint 16, now 8"):
        store.check_config(path, _cfg(rank=8), allow_changes=False)
    store.check_config(path, _cfg(rank=8), allow_changes=True)


def test_preflight_rejects_unwritable_location(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match="not writable"):
        checkpoint.preflight(str(blocker / "ckpts"))


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlfw.run", "experiment=debug", "trainer.total_steps=4", "trainer.ckpt_interval=1",
            "trainer.eval_interval=2", "algo.entropy_coef=0.01", f"trainer.output_dir={out}", *extra]


def _run(out: Path, *extra: str, kill_when=None) -> subprocess.CompletedProcess | None:
    cmd = _cmd(out, *extra)
    if kill_when is None:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc
    procs.kill_when(cmd, ROOT, kill_when)
    return None


def _history(out: Path) -> list[dict]:
    """Logged metrics without wall-clock timings and process memory (rows that only carried those
    drop out): what must repeat exactly after a resume."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not k.startswith(("timing/", "memory/"))} for r in rows]
    return [r for r in rows if len(r) > 1]


# How far the engine's log-probs of the sampled tokens are from the trainer's: float rounding (about
# 1e-7), which the resumed run's fresh engine process can round differently while it samples the
# same tokens and the update stays bit for bit the same (seen once in about 20 runs: 9.9e-8 against 8.9e-8).
ROUNDING_METRICS = ("policy/rollout_logp_abs_diff",)


def _assert_same_result(a: Path, b: Path) -> None:
    """The same final adapter, bit for bit on CPU, and the same metrics history (the rounding
    diagnostics within 1e-6)."""
    final_a = load_file(str(a / "lora_sync" / "v4" / "adapter_model.safetensors"))
    final_b = load_file(str(b / "lora_sync" / "v4" / "adapter_model.safetensors"))
    for name in final_a:
        assert torch.equal(final_a[name], final_b[name]), name
    history_a, history_b = _history(a), _history(b)
    exact = lambda rows: [{k: v for k, v in r.items() if k not in ROUNDING_METRICS} for r in rows]
    assert exact(history_a) == exact(history_b)
    for row_a, row_b in zip(history_a, history_b):
        for key in ROUNDING_METRICS:
            assert (key in row_a) == (key in row_b), (row_a["step"], key)
            if key in row_a:
                assert row_a[key] == pytest.approx(row_b[key], abs=1e-6), (row_a["step"], key)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted reference run (with an inference export at the end)."""
    out = tmp_path_factory.mktemp("straight") / "run"
    _run(out, "trainer.hf_save_interval=4")
    return out


def _kill_points(out: Path) -> dict:
    ck = out / "checkpoints"
    return {
        # step 3's rollout is under way once step 2's checkpoint has landed
        "rollout": lambda: (ck / "global_step_2" / "manifest.json").exists(),
        # step 3's update is done and its adapter is being published to the engines
        "sync": lambda: (out / "lora_sync" / "v3").exists(),
        # step 3's checkpoint folder is being written
        "checkpoint_write": lambda: (ck / "global_step_3.tmp").exists() or (ck / "global_step_3").exists(),
    }


@pytest.mark.parametrize("moment", [
    "rollout",
    pytest.param("sync", marks=pytest.mark.slow),
    pytest.param("checkpoint_write", marks=pytest.mark.slow),
])
def test_killed_run_resumes_to_the_uninterrupted_result(straight, tmp_path, moment):
    killed = tmp_path / "killed"
    _run(killed, kill_when=_kill_points(killed)[moment])
    latest = checkpoint.CheckpointStore(str(killed / "checkpoints")).find_resume(lambda _: None)  # what resume loads
    state = json.loads((Path(latest.path) / "trainer_state.json").read_text())
    proc = _run(killed, "trainer.resume_mode=latest")
    assert "resumed from" in proc.stdout + proc.stderr
    _assert_same_result(straight, killed)
    # the run's clock goes on from the checkpoint's: the last evaluation's elapsed time holds the
    # time up to the checkpoint resumed from and the resumed steps themselves
    rows = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    resumed_steps = sum(r["timing/step"] for r in rows if r["step"] > state["global_step"] and "timing/step" in r)
    elapsed = [r["timing/elapsed_min"] for r in rows if "timing/elapsed_min" in r]
    assert elapsed == sorted(elapsed)
    assert elapsed[-1] >= state["elapsed_min"] + resumed_steps / 60 > 0


def test_killed_trainer_is_replaced_and_the_run_ends_as_if_uninterrupted(straight, tmp_path):
    out, log = tmp_path / "trainer_killed", tmp_path / "trainer_killed.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(_cmd(out), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 300
            while not _kill_points(out)["rollout"]():  # step 3's rollout is under way
                assert proc.poll() is None and time.time() < deadline
                time.sleep(0.005)
            pids = worker_pids(proc.pid, "ray::PolicyWorker")  # this run's trainer only, not another run's
            assert pids, "no trainer worker process found"
            for pid in pids:
                os.kill(int(pid), signal.SIGKILL)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert "trainer worker died" in output and "resumed from" in output, output[-3000:]
    _assert_same_result(straight, out)


def test_resume_of_a_finished_run_runs_no_more_steps(straight, tmp_path):
    import shutil

    done = tmp_path / "done"
    shutil.copytree(straight, done)
    before = _history(done)
    proc = _run(done, "trainer.resume_mode=latest")
    assert "(step 4)" in proc.stdout + proc.stderr
    assert _history(done) == before


def test_inference_export_loads_with_peft(straight):
    """The export is the trained adapter, value for value, and PEFT loads it onto the base model."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    export = straight / "exports" / "global_step_4"
    assert (export / "adapter_model.safetensors").exists() and (export / "adapter_config.json").exists()
    trained = load_file(str(straight / "lora_sync" / "v4" / "adapter_model.safetensors"))
    exported = load_file(str(export / "adapter_model.safetensors"))
    assert exported.keys() == trained.keys() and trained
    for name in trained:
        assert torch.equal(exported[name], trained[name]), name
    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(str(straight / "base_model")),
                                      str(export))
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert loaded.keys() == trained.keys()
    for name in trained:
        assert torch.equal(loaded[name], trained[name]), name
