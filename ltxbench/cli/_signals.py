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


NOTHING_KEPT = "interrupted: nothing measured yet, nothing written"


def interruption(cause: dict, measured, not_measured) -> dict:
    """The record of a measurement cut short (a result's `incomplete`): the signal, what was and was not measured."""
    return {"reason": f"interrupted ({cause['signal']})", "measured": list(measured),
            "not_measured": list(not_measured)}


def kept_line(kept: int, of: int, what: str, path) -> str:
    """The one line an interrupted measurement that wrote its partial result ends with (exit 130)."""
    return f"interrupted: kept {kept} of {of} {what} in {path}, marked incomplete (not a baseline for compare)"
