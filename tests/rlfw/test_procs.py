"""worker_pids finds the workers of the run a test started, not the like-named workers of other runs."""

import os
import signal
import subprocess
import time

import pytest

from tests.rlfw.procs import cmdline, start_decoy, stop, worker_pids

TITLE = "ray::EngineWorker"


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def _wait_for(cond, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def run_tree(tmp_path):
    """Start a stand-in for a run like the tests start one (session leader) -> launcher -> worker named like a Ray
    actor in its own process group (as the driver -> raylet -> ray::EngineWorker.generate); detach=True lets the
    launcher exit, so the worker is reparented out of the tree while it stays in the session. Yields
    (root, worker pid); kills both by pid afterwards."""
    started = []

    def start(detach: bool = False):
        pidfile = tmp_path / f"worker{len(started)}.pid"
        worker = tmp_path / "worker.sh"
        worker.write_text(f"echo $$ > \"$1\"; exec -a '{TITLE}.generate' sleep 600\n")
        launcher = tmp_path / ("detach.sh" if detach else "launch.sh")
        launcher.write_text(f"set -m; bash {worker} \"$1\" &\n" + ("" if detach else "wait\n"))
        root = subprocess.Popen(["bash", "-c", f"bash {launcher} {pidfile}; exec sleep 600"], start_new_session=True)
        started.append((root, pidfile))
        _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() and TITLE in cmdline(
            int(pidfile.read_text())), what="the worker")
        return root, int(pidfile.read_text())

    yield start
    for root, pidfile in started:
        if pidfile.exists() and pidfile.read_text().strip():
            pid = int(pidfile.read_text())
            if TITLE in cmdline(pid):  # still our worker
                os.kill(pid, signal.SIGKILL)
        stop(root)


def test_finds_the_runs_worker_and_not_another_runs(run_tree):
    decoy = start_decoy(TITLE)
    try:
        root, worker = run_tree()
        assert TITLE in cmdline(decoy.pid) and TITLE in cmdline(worker)  # pgrep -f would find both
        assert worker_pids(root.pid, TITLE) == [worker]
        assert worker_pids(root.pid, "ray::PolicyWorker") == []
        assert decoy.poll() is None
    finally:
        stop(decoy)


def test_finds_a_worker_reparented_out_of_the_tree_by_its_session(run_tree):
    decoy = start_decoy(TITLE)
    try:
        root, worker = run_tree(detach=True)
        # the launcher (as a raylet that died) is gone: the worker now hangs below init or a subreaper
        _wait_for(lambda: os.getsid(_ppid(worker)) != root.pid, what="the worker to be reparented")
        assert os.getsid(worker) == root.pid
        assert worker_pids(root.pid, TITLE) == [worker]
    finally:
        stop(decoy)
