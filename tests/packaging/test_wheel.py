"""The product as users install it: the wheel built from this tree, installed into a fresh venv, run from a folder
outside the checkout. It must carry its CUDA sources and model configs (cuda/ and configs/ of the repository root,
package data as ltxbench/cuda and ltxbench/configs) and find them there. Also the editable install (`pip install -e`):
it must use the checkout's cuda/ and configs/ as they are, files added after the install included.

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

from ltxbench.ops.build import BINDINGS_UNIT

pytestmark = [pytest.mark.wheel, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
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


def _source_copy(root: Path) -> Path:
    """The files a build reads, copied: building in the checkout would leave build/ and *.egg-info there."""
    source = root / "src"
    for folder in ("ltxbench", "cuda", "configs"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    return source


def _fresh_venv(root: Path, env: dict) -> tuple[Path, Path]:
    """(its python, its site-packages): a venv that imports the dependencies from the running interpreter's."""
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], root, env)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root,
                     env).stdout.strip())
    (site / "host-site-packages.pth").write_text("\n".join(_host_site_packages()) + "\n")
    return python, site


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LTXBENCH_CUDA_SRC", "LTXBENCH_CACHE")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, its site-packages, a work folder outside the checkout, the environment to run in)."""
    root = tmp_path_factory.mktemp("wheel")
    source, env = _source_copy(root), _clean_env()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation(), "-q", "-w", root / "dist", source],
         root, env)
    (wheel,) = (root / "dist").glob("ltxbench-*.whl")
    python, site = _fresh_venv(root, env)
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", wheel], root, env)
    work = root / "work"
    work.mkdir()
    return {"venv": python.parent.parent, "site": site, "work": work, "env": env, "wheel": wheel}


def test_the_wheel_carries_the_cuda_sources_and_the_configs(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    shipped = {"ltxbench/cuda/bindings/checks.h", "ltxbench/cuda/bindings/norm.cpp", "ltxbench/cuda/gemm.cpp",
               "ltxbench/cuda/norm.cu", "ltxbench/cuda/rope_3d.cu", "ltxbench/cuda/common/dtype.cuh",
               "ltxbench/cuda/common/params.h",
               "ltxbench/configs/ltx/ltx-tiny/scheduler.json", "ltxbench/configs/ltx/ltx-video-2b/transformer.json",
               "ltxbench/configs/llm/llama-tiny.json", "ltxbench/ops/gemm_choices/NVIDIA-H200.json"}
    assert shipped <= names, sorted(shipped - names)
    for folder in ("cuda", "configs"):  # every file, at its place inside the package
        files = {p for p in (REPO / folder).rglob("*") if p.is_file() and p.name != "README.md"}
        assert {f"ltxbench/{p.relative_to(REPO).as_posix()}" for p in files} <= names
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "ltxbench").rglob("*.py")}
    assert modules <= names, sorted(modules - names)  # pyproject.toml lists the packages: none left out


def test_the_installed_package_finds_its_own_sources_and_configs(installed):
    (installed["site"] / "cuda").mkdir(exist_ok=True)  # where cuda-bindings (a torch dependency) installs itself
    code = ("from ltxbench.ops import build; from ltxbench.models import llm_build, ltx_build, ltx2_build; "
            "print(build.SOURCES_DIR, llm_build.LLM_CONFIGS, ltx_build.CONFIGS, ltx2_build.CONFIGS, sep='\\n')")
    proc = _run([installed["venv"] / "bin" / "python", "-c", code], installed["work"], installed["env"])
    package = installed["site"] / "ltxbench"
    assert [Path(line) for line in proc.stdout.split()] == [package / "cuda", package / "configs" / "llm",
                                                            package / "configs" / "ltx", package / "configs" / "ltx2"]


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
    cuda = installed["site"] / "ltxbench" / "cuda"
    assert f"{cuda / 'norm.cu'}" in log
    assert f'#include "{cuda / "bindings" / "norm.cpp"}"' in (tmp_path / "cache" / BINDINGS_UNIT).read_text()
    assert str(REPO / "ltxbench") not in log and str(REPO / "cuda") not in log
    assert Path(proc.stdout.strip().splitlines()[-1]).is_file()
    status = _run([installed["venv"] / "bin" / "ltxbench", "env"], installed["work"],
                  env).stdout
    assert f"built for 9.0 in {tmp_path / 'cache'}" in status


def test_an_editable_install_sees_new_and_edited_sources_and_configs(tmp_path):
    """`pip install -e .` (make install): the checkout's cuda/ and configs/ are used as they are, new files included,
    without reinstalling."""
    source, env = _source_copy(tmp_path), _clean_env()
    python, _ = _fresh_venv(tmp_path, env)
    _run([python, "-m", "pip", "install", "-q", "--no-deps", *_build_isolation(), "--ignore-installed", "-e", source],
         tmp_path, env)
    (source / "cuda" / "added_after_install.cu").write_text("// a kernel added after the install\n")
    tiny = source / "configs" / "llm" / "llama-tiny.json"
    tiny.write_text(tiny.read_text().replace('"llama"', '"llama", "edited_after_install": true', 1))
    code = ("import json, ltxbench; from ltxbench.ops import build; from ltxbench.models import llm_build; "
            "print(ltxbench.__file__); print(build.SOURCES_DIR); "
            "print(build.SOURCES_DIR / 'added_after_install.cu' in build.sources()); "
            "print(json.loads((llm_build.LLM_CONFIGS / 'llama-tiny.json').read_text())['edited_after_install'])")
    work = tmp_path / "work"
    work.mkdir()
    lines = _run([python, "-c", code], work, env).stdout.split()
    assert lines == [str(source / "ltxbench" / "__init__.py"), str(source / "cuda"), "True", "True"]
