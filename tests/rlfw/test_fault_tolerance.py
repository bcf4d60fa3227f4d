"""A rollout engine killed mid-run is restarted by Ray; the step's rollouts are redone and the run completes."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.rlfw.procs import start_decoy, stop, wait_for_step, worker_pids

ROOT = Path(__file__).resolve().parents[2]


def test_killed_rollout_engine_is_restarted(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlfw.run", "experiment=debug", "trainer.total_steps=4", "trainer.eval_interval=0",
           f"trainer.output_dir={out}"]
    decoy = start_decoy("ray::EngineWorker")  # another run's engine on this machine: it must survive
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for_step(proc, out / "metrics.jsonl", 1)
        pids = worker_pids(proc.pid, "ray::EngineWorker")  # this run's engines only
        assert pids, "no engine worker process found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=300)
        assert decoy.poll() is None, "the test killed a process that is not its run's"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stop(decoy)
    assert proc.returncode == 0, output[-3000:]
    # killed mid-rollout: the step's rollouts are redone; killed between calls: the next call waits
    assert "rollout engine died" in output, output[-3000:]
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 4
