"""How the test ranks started by torch.distributed.run end (tests/workers/ulysses_worker.py,
tests/workers/ulysses_symmetric_worker.py, tests/workers/parallel_latents.py): leave the process group and exit without
the interpreter's finalization.

Why: a rank of tests/parallel/test_ulysses_exchange.py aborted once in CI ("terminate called without an active
exception", SIGABRT) after a normal end (barrier, destroy_process_group, return): a gloo worker thread still releasing
the last collective's tensors needs the GIL while the interpreter finalizes; Python ends that thread and the C++ runtime
aborts the process. docs/parallel.md has the numbers of the reproduction. The harnesses set PYTHONFAULTHANDLER, so that
another abort shows the threads' stacks."""

from __future__ import annotations


def leave() -> None:
    """Every rank here, the group left: exit 0 now, as the CLI's ranks do (launch.end_rank)."""
    import torch.distributed as dist

    from ltxbench.parallel.launch import end_rank

    dist.barrier()
    dist.destroy_process_group()
    end_rank(0)
