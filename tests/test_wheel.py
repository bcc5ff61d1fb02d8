"""The product as users install it: the wheel built from this tree, installed into a fresh venv, run from a folder
outside the checkout. It must carry its CUDA sources and model configs (package data) and find them there.

The fresh venv sees the running interpreter's site-packages for the dependencies (a .pth file: no torch download);
the wheel itself is installed with --no-deps and --ignore-installed, so the venv's own copy is the one imported and
nothing of the running environment is touched.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.wheel, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900


def _run(args, cwd: Path, env: dict, timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _host_site_packages() -> list[str]:
    """Where the running interpreter finds torch, diffusers & co. (a venv's site-packages, or the system's)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    return sorted({p for p in paths if Path(p).is_dir()})


def _build_isolation() -> list[str]:
    """Build with the running interpreter's setuptools where it can make wheels itself (70.1+: no network needed);
    else pip's isolated build, which fetches setuptools."""
    try:
        from importlib.metadata import version

        major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    except Exception:  # noqa: BLE001 - not installed, or an odd version string
        return []
    return ["--no-build-isolation"] if (major, minor) >= (70, 1) else []


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, its site-packages, a work folder outside the checkout, the environment to run in)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"  # a copy: building in the checkout would leave build/ and *.egg-info there
    shutil.copytree(REPO / "ltxbench", source / "ltxbench", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LTXBENCH_CUDA_SRC", "LTXBENCH_CACHE")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation(), "-q", "-w", root / "dist", source],
         root, env)
    (wheel,) = (root / "dist").glob("ltxbench-*.whl")

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], root, env)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root,
                     env).stdout.strip())
    (site / "host-site-packages.pth").write_text("\n".join(_host_site_packages()) + "\n")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", wheel], root, env)
    work = root / "work"
    work.mkdir()
    return {"venv": venv, "site": site, "work": work, "env": env, "wheel": wheel}


def test_the_wheel_carries_the_cuda_sources_and_the_configs(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    shipped = {"ltxbench/cuda/bindings.cpp", "ltxbench/cuda/gemm.cpp", "ltxbench/cuda/norm.cu",
               "ltxbench/cuda/common/dtype.cuh", "ltxbench/cuda/common/params.h",
               "ltxbench/configs/ltx/ltx-tiny/scheduler.json", "ltxbench/configs/ltx/ltx-video-2b/transformer.json",
               "ltxbench/configs/llm/llama-tiny.json", "ltxbench/ops/gemm_choices/NVIDIA-H200.json"}
    assert shipped <= names, sorted(shipped - names)
    sources = {n for n in (REPO / "ltxbench" / "cuda").rglob("*") if n.is_file()}
    assert {f"ltxbench/{p.relative_to(REPO / 'ltxbench').as_posix()}" for p in sources} <= names


def test_the_installed_package_is_the_one_imported(installed):
    proc = _run([installed["venv"] / "bin" / "python", "-c", "import ltxbench; print(ltxbench.__file__)"],
                installed["work"], installed["env"])
    assert Path(proc.stdout.strip()) == installed["site"] / "ltxbench" / "__init__.py"


def test_tiny_generate_from_the_installed_wheel(installed):
    work = installed["work"]
    _run([installed["venv"] / "bin" / "ltxbench", "generate", "--model", "ltx-tiny", "--weights", "random",
          "--device", "cpu", "--num-frames", "9", "--height", "64", "--width", "96", "--steps", "2",
          "--prompt", "a red fox running through fresh snow", "--output", work / "demo.mp4"], work, installed["env"])
    assert (work / "demo.mp4").stat().st_size > 0 and (work / "demo.json").is_file()


def test_llama_tiny_e2e_from_the_installed_wheel(installed):
    work = installed["work"]
    proc = _run([installed["venv"] / "bin" / "ltxbench", "bench", "e2e", "--model", "llama-tiny", "--weights",
                 "random", "--device", "cpu", "--prompt-lengths", "16", "--new-tokens", "4", "--warmup-iterations",
                 "1", "--repeats", "1", "--configs", "baseline,optimized", "--output", work / "e2e.json"],
                work, installed["env"])
    assert (work / "e2e.json").is_file() and "optimized" in proc.stdout


@pytest.mark.build
def test_cpu_compile_of_the_installed_kernels(installed, tmp_path):
    """What `make build-check` does, from the installed package: nvcc compiles the site-packages copy."""
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("no nvcc")
    env = {**installed["env"], "LTXBENCH_CACHE": str(tmp_path / "cache"), "TORCH_CUDA_ARCH_LIST": "9.0",
           "LTXBENCH_VERBOSE_BUILD": "1"}
    python = installed["venv"] / "bin" / "python"
    proc = _run([python, "-c", "import ltxbench.ops.build as b; print(b.load()['path'])"], installed["work"], env)
    log = proc.stdout + proc.stderr
    assert f"{installed['site'] / 'ltxbench' / 'cuda' / 'bindings.cpp'}" in log
    assert str(REPO / "ltxbench") not in log
    assert Path(proc.stdout.strip().splitlines()[-1]).is_file()
    status = _run([installed["venv"] / "bin" / "ltxbench", "env"], installed["work"],
                  env).stdout
    assert f"built for 9.0 in {tmp_path / 'cache'}" in status
