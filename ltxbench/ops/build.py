"""JIT build of the CUDA sources: the only caller of torch.utils.cpp_extension.load.

The sources are cuda/ at the repository root, shipped inside the wheel as ltxbench/cuda (ltxbench.resources
finds either; LTXBENCH_CUDA_SRC overrides). The extension is built on first use for the detected GPU arch
(TORCH_CUDA_ARCH_LIST overrides), cached under ~/.cache/ltxbench/<torch>-<cuda>-<arch> (LTXBENCH_CACHE
overrides), and loaded as a plain shared library whose TORCH_LIBRARY_FRAGMENT blocks register the ops under
torch.ops.ltxbench.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from importlib import resources
from pathlib import Path

from ltxbench.errors import BuildError
from ltxbench.resources import cuda_dir

EXTENSION_NAME = "ltxbench_ops"
BUILD_INFO = "ltxbench-build.json"  # beside the library: the exact arch list it was built for
BINDINGS_UNIT = "ltxbench_bindings.cpp"  # in the build dir: includes every cuda/bindings/*.cpp


def _quiet_cpu_build(record: logging.LogRecord) -> bool:
    """cpp_extension warns "No CUDA runtime is found" on import on any machine without a GPU, which is where the
    CPU build (TORCH_CUDA_ARCH_LIST) runs on purpose; the toolkit it will use is the one `ltxbench env` shows."""
    return not str(record.msg).startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_quiet_cpu_build)


def _sources_dir():
    """LTXBENCH_CUDA_SRC, else the checkout's cuda/ or the installed package's copy (ltxbench.resources)."""
    override = os.environ.get("LTXBENCH_CUDA_SRC")
    return Path(override).expanduser() if override else cuda_dir()


SOURCES_DIR = _sources_dir()

_loaded: dict | None = None  # set once the library is in the process: {"path", "seconds", "arch"}


def sources(directory: Path | None = None) -> list[Path]:
    """The files to compile in `directory` (default SOURCES_DIR, which must then be a real folder): the bindings
    (bindings/*.cpp, one per op family, the only files that include torch; compiled as one translation unit, see
    _translation_units), the host-only .cpp files beside the kernels (cuBLASLt plumbing: g++ builds them, without
    nvcc's front end) and the kernels (*.cu)."""
    root = Path(SOURCES_DIR if directory is None else directory)
    bindings = sorted((root / "bindings").glob("*.cpp"))
    if not bindings:
        where = "LTXBENCH_CUDA_SRC" if os.environ.get("LTXBENCH_CUDA_SRC") else "the checkout or installed package"
        raise BuildError(
            f"CUDA sources not found under {root} (from {where})",
            hint="point LTXBENCH_CUDA_SRC at a folder holding bindings/*.cpp, or reinstall ltxbench "
            "(its wheel ships the sources as ltxbench/cuda)",
        )
    return [*bindings, *sorted(root.glob("*.cpp")), *sorted(root.glob("*.cu"))]


def _translation_units(directory: Path, build_dir: Path) -> list[Path]:
    """sources(directory) as the build compiles them: the bindings files all included into one translation unit
    (written to build_dir), the others as they are. torch's headers take seconds to parse in every translation unit
    that includes them: compiled apart, the eight bindings files made the cold build ~1.5x as long on 2 cores. The
    unit is rewritten only when its text changes (a fresh mtime would make ninja rebuild it at every load)."""
    files = sources(directory)
    bindings = [f for f in files if f.parent == Path(directory) / "bindings"]
    unit = build_dir / BINDINGS_UNIT
    text = "".join(f'#include "{f}"\n' for f in bindings)
    if not unit.is_file() or unit.read_text() != text:
        unit.write_text(text)
    return [unit, *(f for f in files if f not in bindings)]


def arch_list() -> str:
    """The arch list to build for: TORCH_CUDA_ARCH_LIST, else the visible GPU's compute capability."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env:
        return env
    import torch

    if not torch.cuda.is_available():
        raise BuildError(
            "no CUDA device to detect the GPU architecture from",
            hint='set TORCH_CUDA_ARCH_LIST (e.g. "9.0") to build without a GPU',
        )
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def _arch_tag(archs: str) -> str:
    return "sm" + "-".join(re.sub(r"[^0-9a-z]", "", a) for a in re.split(r"[;, ]+", archs) if a)


def cache_dir(archs: str | None = None) -> Path:
    import torch

    if os.environ.get("LTXBENCH_CACHE"):
        return Path(os.environ["LTXBENCH_CACHE"]).expanduser()
    tag = f"{torch.__version__.split('+')[0]}-cu{(torch.version.cuda or 'none').replace('.', '')}"
    return Path.home() / ".cache" / "ltxbench" / f"{tag}-{_arch_tag(archs or arch_list())}"



def cuda_home() -> str | None:
    """The CUDA toolkit the build will use (CUDA_HOME/CUDA_PATH, else a real toolkit found on disk)."""
    _guess_cuda_home()
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")


def _guess_cuda_home() -> None:
    """cpp_extension guesses CUDA_HOME as nvcc's grandparent: /usr/local for a /usr/local/bin/nvcc link or
    wrapper script, where there are no CUDA headers. Look for a real toolkit first, before it is imported."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent.parent] if nvcc else []
    candidates += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    for home in candidates:
        if (home / "include" / "cuda_runtime.h").is_file() and (home / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = str(home)
            return


def _check_toolchain() -> None:
    _guess_cuda_home()
    from torch.utils import cpp_extension

    # cpp_extension fixes its CUDA_HOME when first imported; inductor may have imported it (torch.compile
    # before our first build) with nvcc's grandparent guess: point it at the toolkit found above.
    if os.environ.get("CUDA_HOME") and cpp_extension.CUDA_HOME != os.environ["CUDA_HOME"]:
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]
    CUDA_HOME = cpp_extension.CUDA_HOME

    if CUDA_HOME is None or not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        raise BuildError(
            "nvcc not found: cannot compile the ltxbench CUDA kernels",
            hint="install the CUDA toolkit and set CUDA_HOME (e.g. /usr/local/cuda)",
        )


def _cublaslt(build_dir: Path) -> tuple[list[str], list[str]]:
    """Include dir and linker flags for cuBLASLt (gemm.cpp): the toolkit's copy, else the one the CUDA wheels of
    torch ship (nvidia/*/include, nvidia/*/lib, as on pip installs: no unversioned .so there). Only the two
    cuBLAS headers are taken (copied into the build dir): the wheel's include dir also holds a CUDA runtime whose
    headers must not shadow the toolkit nvcc belongs to."""
    roots = [Path(h) for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if h]
    try:
        import nvidia  # namespace package of the nvidia-* wheels torch depends on

        roots += [p for base in nvidia.__path__ for p in sorted(Path(base).iterdir()) if p.is_dir()]
    except ImportError:
        pass
    for root in roots:
        header = root / "include" / "cublasLt.h"
        libs = [lib for sub in ("lib64", "lib") for lib in sorted((root / sub).glob("libcublasLt.so*"))]
        if header.is_file() and libs:
            lib = next((x for x in libs if x.name == "libcublasLt.so"), libs[-1])
            include = build_dir / "cublaslt_include"
            include.mkdir(exist_ok=True)
            for name in ("cublasLt.h", "cublas_api.h"):
                source, copy = header.parent / name, include / name
                # Rewritten only when different: a fresh mtime would make ninja rebuild gemm.cpp at every load.
                if not copy.is_file() or copy.read_bytes() != source.read_bytes():
                    shutil.copyfile(source, copy)
            return [str(include)], [f"-L{lib.parent}", f"-l:{lib.name}", f"-Wl,-rpath,{lib.parent}"]
    raise BuildError(
        "cuBLASLt (cublasLt.h and libcublasLt.so) not found in the CUDA toolkit or torch's nvidia wheels",
        hint="install the CUDA toolkit's cuBLAS, or the nvidia-cublas wheel that matches torch's CUDA",
    )


def load(verbose: bool | None = None) -> dict:
    """Build (if needed) and load the extension once per process; return where and how long it took."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _check_toolchain()
    archs = arch_list()
    build_dir = cache_dir(archs)
    build_dir.mkdir(parents=True, exist_ok=True)
    verbose = os.environ.get("LTXBENCH_VERBOSE_BUILD") == "1" if verbose is None else verbose
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs  # cpp_extension reads the arch list from here
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))

    from torch.utils import cpp_extension

    blas_includes, blas_ldflags = _cublaslt(build_dir)
    start = time.perf_counter()
    try:
        with resources.as_file(SOURCES_DIR) as source_dir:  # a real folder for nvcc, however ltxbench is installed
            path = cpp_extension.load(
                name=EXTENSION_NAME,
                sources=[str(s) for s in _translation_units(source_dir, build_dir)],
                extra_include_paths=[str(source_dir), *blas_includes],
                extra_ldflags=blas_ldflags,
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", "-lineinfo"],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=verbose,
            )
    except BuildError:
        raise
    except Exception as exc:  # cpp_extension raises RuntimeError/CalledProcessError with the compiler log
        tail = "\n".join(str(exc).strip().splitlines()[-25:])
        raise BuildError(
            f"building the ltxbench CUDA extension failed (arch {archs}, dir {build_dir}):\n{tail}",
            hint="check nvcc/CUDA_HOME and that TORCH_CUDA_ARCH_LIST names an arch this nvcc supports; "
            "LTXBENCH_VERBOSE_BUILD=1 prints the full compiler output",
        ) from exc
    _loaded = {"path": str(path), "seconds": time.perf_counter() - start, "arch": archs,
               "build_dir": str(build_dir)}
    (build_dir / BUILD_INFO).write_text(json.dumps({"arch": archs, "sources": str(SOURCES_DIR)}) + "\n")
    from ltxbench.ops import fakes  # noqa: F401  (registers fake + CPU reference kernels)

    return _loaded


def is_loaded() -> bool:
    return _loaded is not None


def sources_used() -> list[str] | None:
    """The kernel files (`cuda/<name>`) this process has entered, as the library records them (common/source_use.h):
    a result's provenance names them as the kernels it measured. None where the library is not loaded in this
    process (what ran of ours ran in other processes, or not at all: every kernel file counts) or cannot say."""
    if _loaded is None:
        return None
    import ctypes

    try:
        entry = ctypes.CDLL(_loaded["path"]).ltxbench_sources_used  # the library already loaded: the same handle
    except (OSError, AttributeError):
        return None
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]
    size = entry(None, 0) + 1
    text = ctypes.create_string_buffer(size)
    entry(text, size)
    return sorted(f"cuda/{name}" for name in text.value.decode().split())


def ops():
    """torch.ops.ltxbench, the extension built and loaded first if it is not yet."""
    if not is_loaded():
        load()
    import torch

    return torch.ops.ltxbench


def _arch_list_of(tag: str) -> str:
    """The arch list back from a cache folder's tag: 75-80-90a -> 7.5;8.0;9.0a (for builds without BUILD_INFO)."""
    archs = []
    for code in tag.split("-"):
        match = re.fullmatch(r"(\d+)(\d)([a-z]*)", code)
        if match:
            major, minor, suffix = match.groups()
            archs.append(f"{major}.{minor}{suffix}")
    return ";".join(archs)


def _recorded_arch(folder: Path) -> str | None:
    try:
        return json.loads((folder / BUILD_INFO).read_text())["arch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def builds() -> list[dict]:
    """Every library in the build cache that this torch can load, newest first: {"arch", "library", "build_dir"}.
    The cache folder is per arch list, so a build for sm_75/80/90 (the test suite's) sits beside this GPU's."""
    import torch

    if os.environ.get("LTXBENCH_CACHE"):
        folders = [cache_dir()]
    else:
        tag = f"{torch.__version__.split('+')[0]}-cu{(torch.version.cuda or 'none').replace('.', '')}-"
        root = Path.home() / ".cache" / "ltxbench"
        folders = sorted(root.glob(f"{tag}sm*")) if root.is_dir() else []
    found = []
    for folder in folders:
        libs = sorted(folder.glob(f"{EXTENSION_NAME}*.so")) if folder.is_dir() else []
        if not libs:
            continue
        arch = _recorded_arch(folder) or _arch_list_of(folder.name.partition("-sm")[2]) or "unrecorded archs"
        found.append({"arch": arch, "library": str(libs[-1]), "build_dir": str(folder),
                      "mtime": libs[-1].stat().st_mtime})
    found.sort(key=lambda b: -b.pop("mtime"))
    return found


def build_status() -> dict:
    """What is known without compiling anything: for `ltxbench env` and `ltxbench kernels`. `built`: the library for
    this machine's arch exists (no GPU and no TORCH_CUDA_ARCH_LIST: any library does); `builds`: all of them."""
    status: dict = {"extension": EXTENSION_NAME, "sources": str(SOURCES_DIR), "loaded": _loaded is not None}
    if _loaded is not None:
        status.update(built=True, builds=[], **_loaded)
        return status
    try:
        status["builds"] = builds()
        archs = arch_list()
    except BuildError as err:  # no GPU to take an arch from: what is built is all there is to say
        found = status["builds"]
        if found:
            status.update(built=True, arch=found[0]["arch"], build_dir=found[0]["build_dir"],
                          library=found[0]["library"], no_gpu=True)
        else:
            status.update(built=False, arch=None, build_dir=None, reason=err.message)
        return status
    except Exception as exc:  # torch missing or broken
        status.update(built=False, arch=None, build_dir=None, builds=[], reason=f"{type(exc).__name__}: {exc}")
        return status
    build_dir = cache_dir(archs)
    libs = sorted(build_dir.glob(f"{EXTENSION_NAME}*.so")) if build_dir.is_dir() else []
    if _recorded_arch(build_dir) not in (None, archs):  # LTXBENCH_CACHE holds one build, maybe for other archs
        libs = []
    status.update(built=bool(libs), arch=archs, build_dir=str(build_dir),
                  library=str(libs[-1]) if libs else None)
    return status


def describe(status: dict) -> str:
    """One line for `env` and `kernels`: what is built, for which archs, and where."""
    others = [b for b in status.get("builds") or [] if b["library"] != status.get("library")]
    also = "; also built for " + "; ".join(f"{b['arch']} ({b['library']})" for b in others) if others else ""
    if status.get("built") and status.get("no_gpu"):
        return f"built for {status['arch']} in {status['library']} (no GPU here to run them){also}"
    if status.get("built"):
        return f"built for {status.get('arch')} in {status.get('library') or status.get('path')}{also}"
    if status.get("reason"):
        return f"not built: {status['reason']}"
    return f"not built for {status.get('arch')} yet (cache {status.get('build_dir')}){also.replace('; also', ';')}"
