"""SIGTERM as an exception, for the entry points (`rlfw.run`, `rlfw.sft`): a run stopped by `kill`,
`ray job stop` or a scheduler's preemption ends as one stopped by Ctrl-C, through its own `except` and
`finally` blocks, and exits with 128 + 15 as a shell reports SIGTERM.

A signal handler's exception is raised wherever the main thread happens to be, and some places lose
it: a `__del__` method (Python prints "Exception ignored in ..." and goes on) or a library's `except
BaseException`. So the handlers also record the signal, and the training loops call
`raise_if_signalled()` at each step boundary: a stop that was lost ends the run one step later
instead of never. A library that lost the exception can also fail next on the state it left half
done (OmegaConf did, interrupted while building a config: an AttributeError); `stop_cause` names the
signal as the stop's cause then."""

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


_signalled: type[BaseException] | None = None  # the exception of the stop signal received, if any
_sigterm_armed = False


def _raise_terminated(signum, frame):
    global _signalled
    _signalled = Terminated
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def _raise_interrupt(signum, frame):
    global _signalled
    _signalled = KeyboardInterrupt
    signal.default_int_handler(signum, frame)


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises `Terminated` in the main thread (elsewhere signals cannot be
    handled, and the block changes nothing), and both it and Ctrl-C (SIGINT, where it is not ignored,
    as it is for a command a shell started in the background) are recorded for `raise_if_signalled`."""
    global _sigterm_armed, _signalled
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _signalled = None
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupt)
    _sigterm_armed = True
    try:
        yield
    finally:
        _sigterm_armed, _signalled = False, None  # a stop belongs to the block it came in
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)


def rearm_sigterm() -> None:
    """Within `sigterm_raises`, put its handler back after ray.init, which installs its own
    (`sys.exit(15)`: the run would stop as "SystemExit: 15" with exit status 15)."""
    if _sigterm_armed:
        signal.signal(signal.SIGTERM, _raise_terminated)


def raise_if_signalled() -> None:
    """At a step boundary: raise the exception of a stop signal received earlier within the
    `sigterm_raises` block (see the module's docstring); nothing when there was none."""
    if _signalled is not None:
        raise _signalled()


def stop_cause(exc: BaseException) -> BaseException:
    """What stopped the run, for an entry point's `except BaseException as exc`: `exc` itself, unless
    a stop signal came within the `sigterm_raises` block and `exc` is not its exception (something
    swallowed it and then failed, see the module's docstring); then the signal's exception, with
    `exc` as its `__cause__`, to report and raise instead (so that the exit status is the signal's)."""
    if _signalled is None or isinstance(exc, _signalled):
        return exc
    stop = _signalled()
    stop.__cause__ = exc
    return stop


def describe_stop(cause: BaseException, exc: BaseException) -> str:
    """`Type: message` of what stopped a run (`stop_cause(exc)`), and of the error that followed when
    a stop signal's exception was swallowed."""
    then = "" if cause is exc else f", then {type(exc).__name__}: {exc}"
    return f"{type(cause).__name__}: {cause}{then}"
