"""Ctrl-C and SIGTERM (`ray job stop`, preemption, `kill`) stop a run: the driver, which spends its
steps waiting on its Ray workers, gets the signal, says after which step training stopped and how
to resume, and its workers go with it.

The run is started as a terminal starts a command: in its own process group with SIGINT at its
default (a shell that runs a command in the background, `cmd &` or nohup, hands it SIGINT ignored,
which Python and therefore the run then keep ignoring), and Ctrl-C is SIGINT to that group.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfw.signals import Terminated, raise_if_signalled, sigterm_raises
from tests.rlfw.procs import wait_for_step, worker_pids

ROOT = Path(__file__).resolve().parents[2]


def _signal_when(cmd: list[str], metrics: Path, step: int, send, check_running=lambda proc: None):
    """Start `cmd` as a terminal would (own process group, SIGINT at its default), wait until it logs
    `step` to `metrics`, run `check_running(proc)`, `send(proc)` a signal; return (proc, its output).
    A run that ignored the signal would go on for its 10,000+ steps: it gets 60 s to end."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_step(proc, metrics, step)
        check_running(proc)
        send(proc)
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            stacks = _python_stacks(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate(timeout=30)
            raise AssertionError(f"still running 60 s after the signal; where it was:\n{stacks}\n"
                                 f"its output:\n{output[-3000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc, output


def _python_stacks(pid: int) -> str:
    """The Python stacks of process `pid` (py-spy, installed with Ray), to tell a hang from a lost signal."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return "(no py-spy here)"
    done = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


def _stop_a_run(tmp_path, send, exception: str) -> int:
    """Start a run, let it reach step 2, `send` it a signal; check what it says and that its
    workers end with it. Returns its exit status."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlfw.run", "experiment=debug", "trainer.total_steps=10000", "trainer.eval_interval=0",
           "trainer.ckpt_interval=1", f"trainer.output_dir={out}"]

    def has_a_trainer(proc):
        assert worker_pids(proc.pid, "ray::PolicyWorker"), "no trainer worker process found"

    proc, output = _signal_when(cmd, out / "metrics.jsonl", 2, send, has_a_trainer)
    assert proc.returncode != 0, output[-3000:]
    stopped = re.search(rf"training stopped after step (\d+) \({exception}", output)
    assert stopped, output[-3000:]
    assert f"trainer.output_dir={out} trainer.resume_mode=latest" in output
    step = int(stopped.group(1))
    assert step >= 2
    # ckpt_interval=1: the step reported, or the one before it if the signal came before its checkpoint
    assert int((out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text()) >= step - 1
    deadline = time.time() + 30
    while (left := worker_pids(proc.pid, "ray::")) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"worker processes outlived the stopped run: {left}"
    return proc.returncode


def test_ctrl_c_stops_a_run_and_says_how_to_resume(tmp_path):
    _stop_a_run(tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGINT), "KeyboardInterrupt")


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    """Only the driver gets it (as from `kill PID`); it exits with 128 + 15, as a shell reports SIGTERM."""
    status = _stop_a_run(tmp_path, lambda proc: proc.send_signal(signal.SIGTERM), "Terminated: SIGTERM")
    assert status == 128 + signal.SIGTERM


def _stop_sft(cmd: list[str], out: Path, resume: str) -> None:
    """Send SIGTERM to an SFT process (no Ray) once it has logged its first step; check that it says
    where it stopped and what to rerun with (`resume`) to continue, and exits with 143."""
    proc, output = _signal_when(cmd, out / "metrics.jsonl", 1, lambda proc: proc.send_signal(signal.SIGTERM))
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert re.search(r"rlfw.sft: stopped in step \d+ \(Terminated: SIGTERM\)", output), output[-3000:]
    assert f"rerun with {resume} to continue from its last saved state" in output, output[-3000:]
    assert not (out / "checkpoint").exists()
    assert "Terminated: SIGTERM" in (out / "run.log").read_text()  # the run's own log has it too


def test_sigterm_in_the_sft_stage_says_so(tmp_path):
    """A preset with an SFT stage (rlfw.sft in the driver, no Ray yet) stopped by SIGTERM says the stage
    stopped and that the run resumed continues it."""
    out = tmp_path / "run"
    _stop_sft([sys.executable, "-m", "rlfw.run", "experiment=maze_sft_then_dagger", "sft_stage.schedule=steps",
               "sft_stage.max_minutes=null", "sft_stage.steps=100000", "sft_stage.batch_size=8", "sft_stage.compile=false",
               "logger=console", f"trainer.output_dir={out}"], out / "sft_stage",
              f"trainer.output_dir={out} trainer.resume_mode=latest")


def test_sigterm_stops_rlfw_sft(tmp_path):
    out = tmp_path / "sft"
    _stop_sft([sys.executable, "-m", "rlfw.sft", "sft.steps=100000", "sft.eval_interval=0", "sft.batch_size=8",
               "logger=console", f"sft.output_dir={out}"], out, f"sft.output_dir={out} sft.resume_mode=latest")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the exception it ignores
def test_a_stop_signal_that_something_swallowed_stops_the_next_step():
    """A signal handler's exception raised inside a `__del__` is printed ("Exception ignored in") and lost;
    the training loops' `raise_if_signalled()` at each step boundary raises it again."""

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the handler runs here, between bytecodes, and its exception is ignored
                pass

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_raises():
        raise_if_signalled()  # no signal yet: nothing
        SignalledWhileCollected()
        with pytest.raises(Terminated):
            raise_if_signalled()
    assert signal.getsignal(signal.SIGTERM) == before  # the block puts back the handler it found
    raise_if_signalled()  # and forgets the signal: later runs in this process are not stopped by it
