"""The multi-GPU side of `generate`, `bench e2e` and `profile` (--gpus, --parallel): after every other check, either
re-launch the command as one process per GPU or, in such a process, join the others; only rank 0 prints and writes.

Only the standard library and ltxbench's own light modules at top level (the commands' help must stay instant).
"""

from __future__ import annotations

import contextlib
import os
import sys

from ltxbench.errors import UsageError
from ltxbench.parallel import launch

# --gpus N on --device cpu: N gloo processes, the multi-GPU code paths on a machine without GPUs (the tests'); a user
# asking for GPUs on the CPU is refused unless this is "1"
CPU_RANKS_ENV = "LTXBENCH_CPU_RANKS"


def split_or_relaunch(family, gpus: int, parallel: str | None, device: str) -> str | None:
    """The split of this run (None: one process), after the command validated everything else, so that a usage
    error never starts N processes. Outside the launcher, --gpus N > 1 runs the original command line as N
    processes and exits with their exit code (typer.Exit); under it, the launcher's world must be --gpus."""
    split = launch.resolve_split(gpus, parallel, family.two_gpu_split)
    if gpus > 1 and not family.supports_parallel:
        raise UsageError(f"--gpus {gpus}: the {family.title} family runs on one GPU")
    if split is not None and split not in family.parallel_splits:
        raise UsageError(f"--parallel {split}: the {family.title} family splits as "
                         f"{', '.join(family.parallel_splits)}")
    if gpus > 1 and device != "cuda" and os.environ.get(CPU_RANKS_ENV) != "1":
        raise UsageError(f"--gpus {gpus} needs --device cuda: on --device {device} it would run {gpus} CPU processes, "
                         "not GPUs", hint=f"drop --gpus {gpus} on the CPU, or run on --device cuda")
    if launch.under_launcher():
        started = launch.launcher_world_size()
        if started != gpus:
            raise UsageError(f"--gpus {gpus}, but the launcher started {started} processes",
                             hint=f"pass --gpus {started}, or run without torchrun: --gpus starts the processes")
        return split
    if gpus > 1:
        import typer

        launch.check_visible(gpus, device)
        raise typer.Exit(launch.relaunch(sys.argv[1:], gpus, split))
    return split


@contextlib.contextmanager
def joined(split: str | None, device: str):
    """This rank in the process group for the run (the World; None in a one-process run), left at the end whatever
    happens. Entered before the model is built: on cuda the rank's GPU is then the current device."""
    if split is None:
        yield None
        return
    import warnings

    world = launch.init_world(split, device)
    if not world.main:  # the same work as rank 0's, so the same warnings: rank 0 alone shows them
        warnings.simplefilter("ignore")
    try:
        yield world
    finally:
        launch.shutdown()


def quiet_unless_main(*consoles):
    """Silence the Rich consoles of ranks other than 0 (their status spinners and progress bars included)."""
    for console in consoles:
        console.quiet = not launch.is_main()
    return consoles[0] if len(consoles) == 1 else consoles


def finished(world) -> dict | None:
    """Once every rank has run: what the result records of the GPUs (the `parallel` entry; None in a one-process
    run), after a barrier, so that rank 0 writes only when no rank failed. Every rank calls it."""
    if world is None:
        return None
    described = launch.describe(world)
    launch.barrier()
    return described
