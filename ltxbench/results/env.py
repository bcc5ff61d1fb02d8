"""What machine and software produced a result: recorded with every run so numbers stay interpretable.

Every probe is guarded: a probe that fails records None or an error string instead of raising, because a
missing driver or a broken package must never cost the user the benchmark they just ran.
"""

from __future__ import annotations

import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from ltxbench.results.provenance import run_provenance

PROBE_TIMEOUT_S = 5
# the libraries the runs use, the peer configurations', then the attention kernels' that are no dependency
# (FlashAttention-3 as pip's fa3-fwd or a hopper/ build, cuDNN's frontend): None where not installed
ATTENTION_PACKAGES = ("fa3-fwd", "flash_attn_3", "nvidia-cudnn-frontend")
PACKAGES = ("torch", "triton", "diffusers", "transformers", "accelerate", "liger-kernel", "ltx-core",
            *ATTENTION_PACKAGES)


def _run(cmd: list[str], cwd: str | Path | None = None) -> str | None:
    """stdout of a short command, or None if it is missing, fails or hangs."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _error(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {exc}"


def _package_version(name: str) -> str | None:
    # importlib.metadata reads dist-info only: no package import, so no torch/triton start-up cost.
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a corrupt dist-info must not break env capture
        return _error(exc)


def _ltxbench_version() -> str | None:
    version = _package_version("ltxbench")
    if version is None:  # running from a source checkout that was never pip-installed
        try:
            import ltxbench

            version = ltxbench.__version__
        except Exception:  # noqa: BLE001
            version = None
    return version


def _host() -> dict:
    host: dict = {}
    for key, probe in (("hostname", socket.gethostname), ("platform", platform.platform),
                       ("python", platform.python_version)):
        try:
            host[key] = probe()
        except Exception as exc:  # noqa: BLE001
            host[key] = _error(exc)
    return host


def _torch_info(env: dict) -> None:
    """GPUs and the CUDA/cuDNN versions torch was built with; fills env in place."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - torch missing or broken
        env["gpus"], env["cuda_note"] = [], f"torch unavailable ({_error(exc)})"
        return
    versions = env["versions"]
    versions["cuda"] = getattr(torch.version, "cuda", None)
    try:
        cudnn = torch.backends.cudnn.version()
        versions["cudnn"] = str(cudnn) if cudnn is not None else None
    except Exception as exc:  # noqa: BLE001
        versions["cudnn"] = _error(exc)
    gpus = []
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                gpus.append({
                    "index": i,
                    "name": p.name,
                    "capability": f"{p.major}.{p.minor}",
                    "sm_count": p.multi_processor_count,
                    "memory_gib": round(p.total_memory / 2**30, 2),
                })
    except Exception as exc:  # noqa: BLE001
        env["cuda_note"] = _error(exc)
    env["gpus"] = gpus
    if not gpus and "cuda_note" not in env:
        env["cuda_note"] = "no CUDA device"


def _driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    lines = [ln.strip() for ln in (out or "").splitlines() if ln.strip()]
    return lines[0] if lines else None


def _cuda_home() -> str | None:
    # The same resolution the kernel build uses (it follows /usr/local/bin/nvcc wrappers to the toolkit).
    from ltxbench.ops.build import cuda_home

    return cuda_home()


def _nvcc(cuda_home: str | None) -> dict:
    candidates = []
    if cuda_home:
        candidates.append(Path(cuda_home) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        return {"path": None, "version": None}
    out = _run([str(path), "--version"]) or ""
    # e.g. "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0.88"
    match = re.search(r"release [\d.]+, V([\d.]+)", out) or re.search(r"release ([\d.]+)", out)
    return {"path": str(path), "version": match.group(1) if match else None}


def capture_env() -> dict:
    """Host, GPUs, driver, package/CUDA/nvcc versions and git state; never raises."""
    env: dict = {"host": _host()}
    versions: dict = {name: _package_version(name) for name in PACKAGES}
    versions.update(cuda=None, cudnn=None, ltxbench=_ltxbench_version())
    env["versions"] = versions
    _torch_info(env)
    probes = (("driver", _driver), ("cuda_home", _cuda_home), ("git", run_provenance))  # git: the code that ran
    for key, probe in probes:
        try:
            env[key] = probe()
        except Exception as exc:  # noqa: BLE001
            env[key] = _error(exc)
    from ltxbench.variables import set_variables

    env["variables"] = set_variables()  # kernel knobs and build settings change what a run measures
    try:
        env["nvcc"] = _nvcc(env["cuda_home"] if isinstance(env["cuda_home"], str) else None)
    except Exception as exc:  # noqa: BLE001
        env["nvcc"] = {"path": None, "version": _error(exc)}
    env["python_executable"] = sys.executable
    return env
