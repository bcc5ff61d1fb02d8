"""ltxbench.resources: cuda/ and configs/ at the repository root in a checkout, the package's copy once installed;
and pyproject.toml ships them (and every package) in the wheel. tests/packaging/test_wheel.py runs the built wheel."""

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from ltxbench import resources

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_uses_its_own_folders():
    assert resources.cuda_dir() == ROOT / "cuda" and (ROOT / "cuda" / "bindings" / "checks.h").is_file()
    assert resources.configs_dir("ltx") == ROOT / "configs" / "ltx"
    assert (resources.configs_dir("llm") / "llama-tiny.json").is_file()


@pytest.fixture
def places(monkeypatch, tmp_path):
    """(the package's parent, the package): both with cuda/ and configs/, as in site-packages once installed."""
    parent, package = tmp_path / "site-packages", tmp_path / "site-packages" / "ltxbench"
    for root in (parent, package):
        (root / "cuda").mkdir(parents=True)
        (root / "configs" / "llm").mkdir(parents=True)
    monkeypatch.setattr(resources, "_ROOT", parent)
    monkeypatch.setattr(resources, "_PACKAGE", package)
    return parent, package


def test_installed_the_package_copy_is_used_not_a_cuda_folder_beside_it(places):
    """In site-packages the package's parent holds other distributions' folders: cuda-bindings installs cuda/."""
    parent, package = places
    assert resources.cuda_dir() == package / "cuda"
    assert resources.configs_dir("llm") == package / "configs" / "llm"


def test_a_checkout_comes_before_the_package_copy(places):
    parent, package = places
    (parent / "pyproject.toml").write_text("")
    assert resources.cuda_dir() == parent / "cuda"
    assert resources.configs_dir("llm") == parent / "configs" / "llm"


def test_a_checkout_without_the_folder_falls_back_to_the_package(places):
    parent, package = places
    (parent / "pyproject.toml").write_text("")
    (parent / "configs" / "llm").rmdir()
    (parent / "configs").rmdir()
    assert resources.cuda_dir() == parent / "cuda"
    assert resources.configs_dir("ltx") == package / "configs" / "ltx"


def _importable_folders(root: Path, package: str) -> set[str]:
    """`package` and the dotted name of every folder below `root` whose path is made of identifiers."""
    names = {package}
    for folder in root.rglob("*"):
        parts = folder.relative_to(root).parts
        if folder.is_dir() and "__pycache__" not in parts and all(p.isidentifier() for p in parts):
            names.add(".".join((package, *parts)))
    return names


def test_pyproject_ships_every_package_and_the_two_folders():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = (_importable_folders(ROOT / "ltxbench", "ltxbench") | _importable_folders(ROOT / "cuda", "ltxbench.cuda")
                | _importable_folders(ROOT / "configs", "ltxbench.configs"))
    assert sorted(setuptools["packages"]) == sorted(expected)
    assert setuptools["package-dir"] == {"ltxbench.cuda": "cuda", "ltxbench.configs": "configs"}
    data = setuptools["package-data"]
    assert {"*.cu", "*.cpp", "bindings/*.cpp"} <= set(data["ltxbench.cuda"]) and "**/*.json" in data["ltxbench.configs"]


def _installed(distribution: str) -> bool:
    try:
        return bool(metadata.distribution(distribution))
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed("cuda-bindings"), reason="cuda-bindings is not installed")
def test_the_top_level_cuda_folder_does_not_shadow_cuda_bindings():
    """PYTHONPATH=$PWD puts the checkout's cuda/ on sys.path: without an __init__.py it only joins the `cuda`
    namespace package of cuda-bindings (which torch may import); with one, it would hide it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "import cuda.bindings"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
