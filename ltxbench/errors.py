"""Exceptions that carry the CLI's exit-code policy.

0 ok · 1 regression or failed correctness check · 2 usage error · 3 inputs cannot be compared ·
4 environment, build or out-of-memory problem. The CLI entry turns these into one line plus a hint.
"""

from __future__ import annotations

import errno
from pathlib import Path


class LtxbenchError(Exception):
    """Base class: a message for the user, an optional hint, and the exit code the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class CheckFailed(LtxbenchError):
    """A correctness check failed (a kernel disagreed with its reference)."""

    exit_code = 1


class RegressionDetected(LtxbenchError):
    exit_code = 1


class UsageError(LtxbenchError):
    """Bad arguments: named in the message, caught before anything heavy is loaded."""

    exit_code = 2


class IncomparableResults(LtxbenchError):
    """Result files that cannot be compared or read (schema version, different GPU, malformed)."""

    exit_code = 3


class EnvironmentProblem(LtxbenchError):
    """No GPU, no nvcc, missing weights offline, out of memory: the machine, not the user's arguments."""

    exit_code = 4


class BuildError(EnvironmentProblem):
    """The CUDA extension failed to compile or load; the message carries the tail of the compiler output."""


class NoCudaDevice(EnvironmentProblem):
    def __init__(self, what: str = "this command"):
        super().__init__(
            f"{what} needs an NVIDIA GPU, and no CUDA device is visible",
            hint="run on a machine with a GPU (check `nvidia-smi` and CUDA_VISIBLE_DEVICES), "
            "or use --device cpu / --kernel-provider reference where the command offers it",
        )


# A full disk or a failing device is the machine's problem; any other refusal to write is the --output given.
_MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}


def output_problem(path: str | Path, exc: OSError, flag: str = "--output") -> LtxbenchError:
    """A write that failed late, as one line: exit 4 when the machine is out of space, else exit 2 naming `flag`."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in _MACHINE_ERRNOS:
        return EnvironmentProblem(f"cannot write {path}: {reason}", hint="free disk space, or choose another " + flag)
    return UsageError(f"{flag} {path} cannot be written: {reason}", hint=f"choose another {flag} in a writable folder")
