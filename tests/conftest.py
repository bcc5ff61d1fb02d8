import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (no CUDA device visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def built_ops():
    """The compiled extension, loaded once per session (arch from the GPU or TORCH_CUDA_ARCH_LIST)."""
    if not _cuda_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pytest.skip("no GPU and no TORCH_CUDA_ARCH_LIST: nothing to build for")
    from ltxbench.ops import _build

    return _build.load()
