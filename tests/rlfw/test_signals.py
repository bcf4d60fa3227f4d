"""`stop_cause`: a stop signal whose exception a library swallowed, and which then failed on the state it
left (OmegaConf interrupted mid-build raised an AttributeError), is still reported and raised as the
signal's exception, so the run says it was stopped and exits with the signal's status."""

import os
import signal

import pytest

from rlfw.signals import Terminated, describe_stop, sigterm_raises, stop_cause


def test_a_swallowed_sigterm_is_the_cause_of_the_error_after_it():
    with sigterm_raises():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler to run
        except Terminated:
            pass  # swallowed, as a library's `except BaseException` does
        error = AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
        cause = stop_cause(error)
        assert isinstance(cause, Terminated) and cause.__cause__ is error and cause.code == 128 + signal.SIGTERM
        assert stop_cause(cause) is cause  # the signal's own exception is its own cause
        assert describe_stop(cause, error) == ("Terminated: SIGTERM, then AttributeError: 'NoneType' object has no "
                                               "attribute '_invalidate_flags_cache'")
    assert stop_cause(error) is error  # outside the block (or with no signal) an error is itself


def test_an_error_with_no_signal_is_itself():
    with sigterm_raises():
        error = ValueError("a crash")
        assert stop_cause(error) is error


def test_a_swallowed_ctrl_c_is_the_cause():
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not at its default here (started in the background)")
    with sigterm_raises():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])
        cause = stop_cause(RuntimeError("after"))
        assert isinstance(cause, KeyboardInterrupt) and isinstance(cause.__cause__, RuntimeError)
