"""Find the worker processes of the one run a test started, so that a test kills its own run's workers and
never those of another run on the machine (a real training run, or another test's).

A run's driver (`python -m rlfw.run`, started with start_new_session=True) calls ray.init(), which starts
Ray's head processes as its children; the raylet then starts the actor processes (`ray::EngineWorker`,
`ray::EngineWorker.generate` while it generates, `ray::PolicyWorker`, ...). So the workers are descendants
of the driver and members of the session it leads, though each gets its own process group (which is why
os.killpg on the driver does not reach them directly). Once the raylet is gone they are reparented out of
the tree for a moment; the session still holds them.
"""

import json
import os
import subprocess
import time


def _table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, command line) for every process readable in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # the name in parentheses may hold spaces
        table[int(name)] = (int(fields[1]), int(fields[3]), cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return table


def worker_pids(root_pid: int, title: str) -> list[int]:
    """The processes below root_pid (its descendants, and the members of the session it leads) whose command
    line contains title; root_pid itself is never among them."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    below, todo = set(), [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in below:
                below.add(child)
                todo.append(child)
    below |= {pid for pid, (_, sid, _) in table.items() if sid == root_pid}  # a session's id is its leader's pid
    below.discard(root_pid)
    return sorted(pid for pid in below if pid in table and title in table[pid][2])


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_decoy(title: str, timeout: float = 10.0) -> subprocess.Popen:
    """A process outside any run's tree whose command line contains title (a stand-in for another run's worker);
    the caller kills it by its pid."""
    decoy = subprocess.Popen(["bash", "-c", f"exec -a '{title} decoy' sleep 600"])
    deadline = time.time() + timeout
    while title not in cmdline(decoy.pid):
        if decoy.poll() is not None or time.time() > deadline:
            decoy.kill()
            decoy.wait(timeout=10)
            raise RuntimeError(f"the decoy never showed {title!r} in its command line: {cmdline(decoy.pid)!r}")
        time.sleep(0.01)
    return decoy


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL a process this test started, by its pid, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def wait_for_step(proc: subprocess.Popen, metrics, step: int, timeout: float = 300.0) -> None:
    """Wait until the run `proc` has logged `step` to its metrics.jsonl; fail if it exits first or takes longer."""
    deadline = time.time() + timeout
    while not (metrics.exists() and any(json.loads(l)["step"] >= step for l in metrics.read_text().splitlines())):
        assert proc.poll() is None, f"the run exited before logging step {step}"
        assert time.time() < deadline, f"the run did not log step {step} within {timeout:.0f} s"
        time.sleep(0.05)


def kill_when(cmd: list[str], cwd, moment, timeout: float = 300.0) -> None:
    """Start `cmd` in a session of its own and SIGKILL that whole session (the driver and whatever it
    started, Ray included) the moment `moment()` holds; fail if it exits first or takes longer."""
    import signal

    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + timeout
    while not moment():
        assert proc.poll() is None, "the run ended before the kill point"
        assert time.time() < deadline, f"the kill point was not reached within {timeout:.0f} s"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
