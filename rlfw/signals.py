"""SIGTERM as an exception, for the entry points (`rlfw.run`, `rlfw.sft`): a run stopped by `kill`,
`ray job stop` or a scheduler's preemption ends as one stopped by Ctrl-C, through its own `except` and
`finally` blocks, and exits with 128 + 15 as a shell reports SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(SystemExit):
    """SIGTERM as an exception (exit status 143), so that a run stopped by `ray job stop`, a
    scheduler's preemption or `kill` ends as one stopped by Ctrl-C: it says after which step it
    stopped and how to resume, closes its loggers and takes its Ray workers down."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)

    def __str__(self) -> str:
        return "SIGTERM"


def _raise_terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


_sigterm_armed = False


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises `Terminated` in the main thread (elsewhere signals cannot be
    handled, and the block changes nothing)."""
    global _sigterm_armed
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    _sigterm_armed = True
    try:
        yield
    finally:
        _sigterm_armed = False
        signal.signal(signal.SIGTERM, previous)


def rearm_sigterm() -> None:
    """Within `sigterm_raises`, put its handler back after ray.init, which installs its own
    (`sys.exit(15)`: the run would stop as "SystemExit: 15" with exit status 15)."""
    if _sigterm_armed:
        signal.signal(signal.SIGTERM, _raise_terminated)
