"""A one-GPU folder's benchmarks spread over the GPUs of one host (`manifest run results/h100 --devices 0,1,2,3`).

Each GPU runs one benchmark at a time, alone on it (CUDA_VISIBLE_DEVICES), taking the next due one in the manifest's
order that fits the budget left; its output goes to a log file, not the terminal. The host's CPU cores, memory and
PCIe are shared, so a benchmark that streams weights from pinned host memory (`--memory-budget`) runs with no other
beside it, after the rest. Each result records what ran on the other GPUs meanwhile (`run.manifest_beside`), which
`ltxbench report` prints beside its provenance, and the CPU cores it had to itself: each command runs on its own
slice of the host's cores (its threads as many), so that one's CPU work (building a model) does not slow another's
launches; one that runs alone has them all.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from ltxbench.results import remeasure
from ltxbench.results.benchmarks import Benchmark
from ltxbench.results.commands import signal_all
from ltxbench.results.provenance import label

STREAMS_HOST_MEMORY = "--memory-budget"


def alone(bench: Benchmark) -> bool:
    """A benchmark that must have the host to itself: it streams weights over PCIe from pinned host memory."""
    return STREAMS_HOST_MEMORY in bench.argv


class Board:
    """The benchmarks still to run and those running, shared by the GPUs' workers under one lock."""

    def __init__(self, queue: list[Benchmark], folder: Path, deadline: float | None):
        self.queue, self.folder, self.deadline = list(queue), folder, deadline
        self.running: dict[str, Benchmark] = {}
        self.beside: dict[str, set[str]] = {}
        self.pending: list[str] = []
        self.status, self.interrupted = 0, False
        self.cond = threading.Condition()

    def take(self) -> tuple[Benchmark | None, float | None]:
        """The next benchmark for a free GPU and the seconds left to it, waiting while one that must run alone runs
        or is next with others running; (None, None) when nothing is left to start."""
        with self.cond:
            while True:
                if self.status or self.interrupted or not self.queue:
                    return None, None
                left = remeasure.time_left(self.deadline)
                if any(alone(b) for b in self.running.values()):
                    self.cond.wait()
                    continue
                for bench in list(self.queue):
                    if alone(bench) and self.running:
                        continue
                    self.queue.remove(bench)
                    if not remeasure.fits(bench, self.folder, left):  # the budget only shrinks: left for a later call
                        self.pending.append(bench.name)
                        continue
                    self._start(bench)
                    return bench, left
                if not self.queue:
                    return None, None
                self.cond.wait()  # only benchmarks that must run alone are left, and others run

    def _start(self, bench: Benchmark) -> None:
        self.beside[bench.name] = set(self.running)
        for name in self.running:
            self.beside[name].add(bench.name)
        self.running[bench.name] = bench

    def beside_of(self, name: str) -> list[str]:
        """The benchmarks that have run on the other GPUs while `name` ran."""
        with self.cond:
            return sorted(self.beside[name])

    def finish(self, bench: Benchmark, status: int) -> None:
        """Mark `bench` done; a non-zero status stops the others from starting more."""
        with self.cond:
            del self.running[bench.name]
            self.beside.pop(bench.name)
            self.status = self.status or status
            self.cond.notify_all()

    def interrupt(self) -> None:
        with self.cond:
            self.interrupted = True
            self.cond.notify_all()


def measure_spread(chosen: list[Benchmark], folder: Path, work: Path, head, files, redo: bool, deadline, runner,
                   measured: list, devices: list[int], logs: Path) -> int:
    """The manifest's run spread over `devices`, one worker thread each; the run's status (0, 1 failed, 124 out of
    budget or time), or KeyboardInterrupt once every command has stopped (the finished ones kept)."""
    board = Board([b for b in chosen if remeasure.due(b, folder, head, files, redo)], folder, deadline)
    logs.mkdir(parents=True, exist_ok=True)
    all_cores = sorted(os.sched_getaffinity(0))
    share = max(len(all_cores) // len(devices), 1)  # each GPU's command its own slice of the host's cores
    cores = {d: all_cores[i * share:(i + 1) * share] or all_cores for i, d in enumerate(devices)}
    lock = threading.Lock()  # moving finished files into the folder, and the `measured` list

    def worker(device: int) -> None:
        while True:
            bench, left = board.take()
            if bench is None:
                return
            argv, output = remeasure.prepare(bench, work / f"gpu{device}")
            own = None if alone(bench) else cores[device]  # alone: the whole host's
            log, status = logs / f"{bench.name}.log", 1
            where, started = f" on GPU {device} (log {log})", time.monotonic()
            try:
                try:
                    limit = left if left is not None else remeasure.NO_BUDGET_S
                    code = runner(argv, output, limit, device=device, log=log, cpus=own)
                except KeyboardInterrupt:
                    board.interrupt()
                    code = 130
                with lock:
                    host = {remeasure.BESIDE: board.beside_of(bench.name),
                            remeasure.CORES: len(own if own is not None else all_cores)}
                    if not board.interrupted:
                        status = remeasure.settle(code, output, bench, folder, measured, head, started, host, where)
                    else:
                        status = 0
                        if remeasure.finished(output):  # stopped while exiting, its whole result published: kept
                            remeasure.keep(output, bench, folder, measured, f"measured at {label(head)}{where}, kept "
                                          "as the run was interrupted", None, host)
            finally:  # also when the runner raised: the others must not wait for it
                board.finish(bench, status)

    threads = [threading.Thread(target=worker, args=(d,), name=f"gpu{d}", daemon=True) for d in devices]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(0.2)
    except KeyboardInterrupt:
        board.interrupt()
        _stop_commands(threads)
        raise
    if board.interrupted:  # a command was interrupted (Ctrl-C reached its process group)
        _stop_commands(threads)
        raise KeyboardInterrupt
    pending = remeasure.pending_status(board.pending)
    return board.status or pending


def _stop_commands(threads: list[threading.Thread]) -> None:
    """Interrupt every running command, kill those still there 30 s later, and wait for the workers."""
    for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        signal_all(sig)
        end = time.monotonic() + grace
        for thread in threads:
            thread.join(max(end - time.monotonic(), 0))
        if not any(t.is_alive() for t in threads):
            return
