"""Running one command over the GPUs of one host: the split's validation, the re-launch under torch's elastic launcher
(what torchrun runs), one rank's process group, and what a result records of the run's GPUs.

`--gpus N` with N > 1 re-launches the command as N processes, one per GPU (on `--device cpu` N processes with the
gloo backend, which the tests use: the CLI refuses it unless LTXBENCH_CPU_RANKS=1); each of them finds RANK /
WORLD_SIZE / LOCAL_RANK set and runs as one rank.
Only the standard library at top level: torch loads inside the functions, after the arguments were validated.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from ltxbench.errors import EnvironmentProblem, UsageError

SPLITS = ("cfg", "ulysses", "ring", "cfg+ulysses", "cfg+ring", "hybrid")
GUIDANCE_AND_TOKENS = ("cfg+ulysses", "cfg+ring")  # the guidance pair over 2 groups, the tokens within each
HYBRID = "hybrid"  # the guidance pair split as cfg, a batch-1 pass as ulysses, over the same 2 ranks
SPLIT_ENV = "LTXBENCH_PARALLEL_SPLIT"  # the resolved split, set for the re-launched processes
OUR_EXIT_CODES = (1, 2, 3, 4, 130)    # ltxbench.errors' codes and Ctrl-C: the rank already said why
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


@dataclass(frozen=True)
class World:
    """This process's place in a multi-GPU run: cfg_degree ranks share the guidance pair, cp_degree ranks the video
    tokens (cfg_degree * cp_degree == size; under `hybrid` both are the same 2 ranks, one split per call)."""

    rank: int
    size: int
    local_rank: int
    device: str  # "cuda:K" or "cpu"
    split: str
    cfg_degree: int
    cp_degree: int

    @property
    def main(self) -> bool:
        return self.rank == 0


_world: World | None = None


def degrees(split: str, gpus: int) -> tuple[int, int]:
    """(cfg_degree, cp_degree) of `split` over `gpus` processes."""
    if split == "cfg":
        return 2, 1
    if split in GUIDANCE_AND_TOKENS:
        return 2, gpus // 2
    if split == HYBRID:
        return 2, 2
    return 1, gpus


def resolve_split(gpus: int, parallel: str | None, two_gpu_default: str = "cfg") -> str | None:
    """The split of --gpus over --parallel (None for one GPU; without --parallel, two_gpu_default on 2 GPUs: the
    family's); a UsageError naming the flag for what cannot run."""
    if gpus < 1:
        raise UsageError(f"--gpus {gpus} must be at least 1")
    if gpus == 1:
        if parallel is not None:
            raise UsageError(f"--parallel {parallel}: --parallel needs --gpus 2 or more")
        return None
    if parallel is None:
        parallel = two_gpu_default if gpus == 2 else ("cfg+ulysses" if gpus % 2 == 0 else "ulysses")
    if parallel not in SPLITS:
        raise UsageError(f"--parallel {parallel!r} is not one of {', '.join(SPLITS)}")
    if parallel == "cfg" and gpus != 2:
        raise UsageError(f"--gpus {gpus}: --parallel cfg splits the guidance pair over 2 GPUs: use --gpus 2",
                         hint="or --parallel ulysses / ring / cfg+ulysses / cfg+ring for more GPUs")
    if parallel == HYBRID and gpus != 2:
        raise UsageError(f"--gpus {gpus}: --parallel hybrid runs the guidance pair's halves and then a batch-1 "
                         "pass's tokens over the same 2 GPUs: use --gpus 2")
    if parallel in GUIDANCE_AND_TOKENS and (gpus < 4 or gpus % 2):
        raise UsageError(f"--gpus {gpus}: --parallel {parallel} needs an even --gpus of at least 4")
    return parallel


def under_launcher() -> bool:
    """Whether torchrun (or our re-launch) started this process as one rank."""
    return all(name in os.environ for name in LAUNCHER_ENV)


def run_rank(command, *args) -> None:
    """Run `command(*args)` as this rank's work (`python -m ltxbench` under the launcher), then end the process with
    the exit code it gave (end_rank)."""
    try:
        command(*args)
    except SystemExit as done:  # typer ends every command so
        end_rank(done.code)
    end_rank(0)


def end_rank(code) -> None:
    """Exit this rank's process with `code` (a SystemExit's: None, an int or a message) once its command returned,
    without the interpreter's finalization: a collective's worker thread may still be releasing tensors then, and a
    thread that needs the GIL while the interpreter finalizes aborts the whole process (SIGABRT) after a run that
    succeeded. By then the process group is left and the files are written; the exit handlers (the GEMM choices'
    save among them) still run, and the output streams are flushed."""
    import atexit
    import logging

    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def launcher_world_size() -> int:
    return int(os.environ["WORLD_SIZE"])


def check_visible(gpus: int, device: str) -> None:
    """--gpus N on cuda needs N visible GPUs (on the CPU, N gloo processes need nothing)."""
    if device != "cuda":
        return
    import torch

    visible = torch.cuda.device_count()
    if visible < gpus:
        raise EnvironmentProblem(f"--gpus {gpus} needs {gpus} CUDA devices, and {visible} visible",
                                 hint="check `nvidia-smi` and CUDA_VISIBLE_DEVICES, or lower --gpus")


def relaunch(argv: list[str], gpus: int, split: str | None = None, module: str = "ltxbench") -> int:
    """Run `python -m <module> <argv>` as `gpus` processes of one host (torch's elastic launcher, standalone
    rendezvous, no restarts) and return the exit code: 0, the first failed rank's own code (it printed its error),
    or 4 after one line saying which rank died of a signal or of a code that is not ours."""
    import logging
    import tempfile
    import uuid

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    extra = {"NCCL_NVLS_ENABLE": "0",  # NVLink multicast (NVLS) is off unless the user turned it on
             "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // gpus))}  # the host's cores shared, not N times
    with _environment(extra, {SPLIT_ENV: split} if split else {}), _quiet(_LAUNCHER_LOGGERS, logging.CRITICAL), \
            tempfile.TemporaryDirectory(prefix="ltxbench-launch-") as logs:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=gpus, run_id=str(uuid.uuid4().int),
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                              monitor_interval=0.1, logs_specs=DefaultLogsSpecs(log_dir=logs))
        try:
            elastic_launch(config, sys.executable)("-m", module, *argv)
        except ChildFailedError as failed:
            rank, failure = min(failed.failures.items(), key=lambda item: item[1].timestamp)
            if failure.exitcode in OUR_EXIT_CODES:
                return failure.exitcode
            how = (f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit {failure.exitcode}")
            print(f"error: rank {rank} of {gpus} failed ({how}): see the lines above", file=sys.stderr)
            return 4
        except SignalException as stop:  # Ctrl-C or SIGTERM of this process: the ranks were stopped
            return 128 + int(stop.sigval)
    return 0


@contextlib.contextmanager
def _environment(defaults: dict, forced: dict):
    """os.environ with `defaults` where unset and `forced` always (the re-launched processes inherit it), restored
    afterwards (relaunch runs inside a test's process too)."""
    saved = {name: os.environ.get(name) for name in (*defaults, *forced)}
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    os.environ.update(forced)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _quiet(prefixes: tuple[str, ...], level: int):
    """The launcher's loggers at `level`: each sets its own level when created, so every one is set, not a parent.
    Without this a failed rank brings a multi-line report on top of the rank's own one-line error."""
    import logging

    def loggers():
        names = [n for n in logging.root.manager.loggerDict if n.startswith(prefixes)]
        return [logging.getLogger(n) for n in names]

    saved = {log: log.level for log in loggers()}
    for log in saved:
        log.setLevel(level)
    try:
        yield
    finally:
        for log, was in saved.items():
            log.setLevel(was)


def init_world(split: str, device: str = "cuda", timeout_s: float = 600) -> World:
    """Join the process group of this rank (under the launcher): on cuda this rank's GPU becomes the current device
    (a model built with .to("cuda") lands there), NCCL for CUDA tensors and gloo for CPU ones; on the CPU gloo. A
    rank waiting on a peer that died gives up after timeout_s instead of hanging."""
    import datetime

    import torch
    import torch.distributed as dist

    global _world
    rank, size, local_rank = (int(os.environ[name]) for name in LAUNCHER_ENV)
    cfg_degree, cp_degree = degrees(split, size)
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    _world = World(rank=rank, size=size, local_rank=local_rank,
                   device=f"cuda:{local_rank}" if device == "cuda" else "cpu", split=split,
                   cfg_degree=cfg_degree, cp_degree=cp_degree)
    return _world


def current_world() -> World | None:
    """The World of this rank, or None in a one-process run."""
    return _world


def is_main() -> bool:
    """Whether this process prints and writes: rank 0, or a one-process run."""
    return _world is None or _world.main


def barrier() -> None:
    """Every rank got here (before rank 0 writes: a run that failed on any rank writes nothing)."""
    if _world is not None:
        import torch.distributed as dist

        dist.barrier()


def start_together() -> None:
    """Before a timed generation over several GPUs: this rank's GPU idle and every rank here, so that all ranks start
    their clocks at once (a rank that starts early times its wait for the others at the first collective)."""
    if _world is not None and _world.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(_world.device)
    barrier()


def shutdown() -> None:
    """Leave the process group (idempotent), the Ulysses exchange's symmetric buffers freed first."""
    global _world
    if _world is not None and _world.device.startswith("cuda"):
        from ltxbench.parallel import symmetric

        symmetric.release()
    _world = None
    with contextlib.suppress(ImportError):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def describe(world: World) -> dict:
    """What a result records of the run's GPUs (a collective: every rank calls it): world size, split, degrees, the
    ranks' GPU names, `nvidia-smi topo -m` (None where it cannot be read), NCCL's version and the CUDA allocator's
    settings (PYTORCH_CUDA_ALLOC_CONF, None when unset); on the CPU the backend."""
    import torch.distributed as dist

    out = {"world_size": world.size, "split": world.split, "cfg_degree": world.cfg_degree,
           "cp_degree": world.cp_degree}
    if world.device == "cpu":
        return {**out, "gpus": [], "interconnect": None, "backend": "gloo"}
    import torch

    names: list = [None] * world.size
    dist.all_gather_object(names, torch.cuda.get_device_name(world.device))
    nccl = torch.cuda.nccl.version()
    # the allocator decides whether NCCL can register the exchange's buffers (zero-copy): docs/parallel.md
    return {**out, "gpus": names, "interconnect": _topology() if world.main else None,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or None}


def _topology(timeout_s: float = 10) -> str | None:
    """The text of `nvidia-smi topo -m` (how the GPUs connect: NVLink, PCIe), without its trailing legend and the
    terminal escapes it underlines its header with."""
    import re
    import subprocess

    try:
        proc = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout).split("\nLegend:")[0].strip("\n").rstrip()
