"""Where the CUDA sources (cuda/) and the model configs (configs/) are: the one place that locates them.

In a checkout they sit at the repository root, beside ltxbench/; that copy comes first, so a plain checkout
(PYTHONPATH=$PWD) and an editable install (which imports ltxbench from the checkout) see edited and new files at
once. A wheel ships them inside the package as ltxbench/cuda and ltxbench/configs (pyproject.toml's package-dir),
found through importlib.resources. Only the standard library: the CLI and the model builders import this early.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent  # resolved: an editable install's link tree points into the checkout
_PACKAGE = resources.files("ltxbench")  # where a wheel puts them


def _checkout() -> Path | None:
    """The repository root, when ltxbench is imported from a checkout. pyproject.toml tells it from site-packages,
    whose own cuda/ folder is another distribution's (cuda-bindings)."""
    return _ROOT if (_ROOT / "pyproject.toml").is_file() else None


def folder(name: str) -> Traversable:
    """The checkout's `name`/ folder, else the installed package's ltxbench/`name` (a Path on a normal install)."""
    root = _checkout()
    if root is not None and (root / name).is_dir():
        return root / name
    return _PACKAGE / name


def cuda_dir() -> Traversable:
    """The folder of the CUDA sources (bindings/, *.cu, common/)."""
    return folder("cuda")


def configs_dir(family: str) -> Traversable:
    """The model configs of one family: `ltx`, `ltx2`, `wan` or `llm`."""
    return folder("configs") / family
