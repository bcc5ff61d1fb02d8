import os

import pytest

from tests.helpers import REQUIRE_GPU_MESSAGE, build_ltx2_tiny

# The stored GEMM choices (the user's file and the ones the package ships, ltxbench.ops.gemm_cache) stay out of the
# tests: a GPU test that searches a problem must find it unsearched whatever ran on the machine before, and no test
# writes its problems into the user's file. tests/ops/test_gemm_cache.py sets the variable per test.
os.environ["LTXBENCH_GEMM_CACHE"] = "off"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_addoption(parser):
    parser.addoption("--require-gpu", action="store_true",
                     help="fail at once when no CUDA device is visible, instead of skipping the gpu tests "
                     "(make test-gpu)")


# A GPU run on a machine without one would otherwise skip every test and exit 0: a green run that tested nothing.
def pytest_configure(config):
    if config.getoption("--require-gpu") and not _cuda_available():
        raise pytest.UsageError(REQUIRE_GPU_MESSAGE)


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (no CUDA device visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The reference provider's fused ops: only patched code calls them, so a call after revert is a patch left running.
FUSED_REFERENCE_OPS = ("rms_norm_modulate", "add_rms_norm_modulate", "gated_residual", "layer_norm_modulate",
                       "qk_rms_norm_rope", "rms_norm", "fused_add_rms_norm", "swiglu", "rope_1d",
                       "rms_norm_rope_split", "qk_rms_norm_rope_split")


@pytest.fixture
def fused_calls(monkeypatch) -> list:
    """The names of the reference provider's fused ops as they are called (LTX and LLM injection)."""
    from ltxbench.ops import reference

    calls: list = []
    for name in FUSED_REFERENCE_OPS:
        original = getattr(reference, name)
        monkeypatch.setattr(reference, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    return calls


@pytest.fixture(scope="session")
def built_ops():
    """The compiled extension, loaded once per session (arch from the GPU or TORCH_CUDA_ARCH_LIST)."""
    if not _cuda_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pytest.skip("no GPU and no TORCH_CUDA_ARCH_LIST: nothing to build for")
    from ltxbench.ops import build

    return build.load()


@pytest.fixture
def captured(monkeypatch):
    """Keep a handle on the pipeline/model the command builds
    (bench e2e / profile tests check that every configuration was undone)."""
    from ltxbench.models import families

    seen = {}

    def wrap(fn):
        def inner(*a, **k):
            seen["target"] = fn(*a, **k)
            return seen["target"]
        return inner

    for family in families():
        monkeypatch.setattr(type(family), "build", wrap(type(family).build))
    return seen


@pytest.fixture
def compile_calls(monkeypatch):
    """Stub the compile step of the compile configurations (the CPU inductor build is too slow for these tests;
    the mechanics are what count): each call is recorded as (module, mode) and the module behaves as compiled."""
    from ltxbench.bench import e2e

    class Calls(list):
        scopes: list

    calls = Calls()
    calls.scopes = []

    def fake_compile(module, mode="default", scope="model"):
        calls.append((module, mode))
        calls.scopes.append(scope)
        module._compiled_call_impl = module._call_impl

    monkeypatch.setattr(e2e, "compile_module", fake_compile)
    return calls


@pytest.fixture
def ltx2_tiny():
    return build_ltx2_tiny()
