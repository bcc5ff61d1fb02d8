"""Signals during a measurement (bench e2e, bench micro). Only the standard library."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def terminate_as_interrupt(cause: dict):
    """SIGTERM (a job's time limit, `timeout`, a scheduler) during a measurement ends it as Ctrl-C does: what was
    measured so far is written, marked incomplete, instead of the process dying with nothing; `cause["signal"]`
    says which one ended it."""
    import signal

    def stop(_signum, _frame):
        cause["signal"] = "SIGTERM"
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave the default handler
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
