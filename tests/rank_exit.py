"""How the test ranks started by torch.distributed.run end (tests/ulysses_worker.py, tests/ulysses_symmetric_worker.py,
tests/parallel_latents.py): leave the process group, flush, and exit without the interpreter's finalization.

Why: a gloo worker thread can still be releasing the last collective's tensors when the main thread returns; if that
thread needs the GIL while the interpreter finalizes, Python ends the thread and the C++ runtime aborts the process
("terminate called without an active exception", SIGABRT) after the rank has written its results. Seen once in a
CI run of tests/test_ulysses_exchange.py; the harnesses set PYTHONFAULTHANDLER so another abort shows its stacks."""

from __future__ import annotations

import os
import sys


def leave() -> None:
    """Every rank here, the group left, the output flushed: exit 0 now."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
