"""Provenance of a result: the commit, tracked changes only, a diff hash; a copy without .git through the stamp."""

import shutil
import subprocess

import pytest

from ltxbench.results import provenance as prov

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "README.md").write_text("readme\n")
    (root / ".gitignore").write_text("/ignored/\n")
    (root / "results" / "h200").mkdir(parents=True)
    (root / "results" / "h200" / "e2e.json").write_text("{}\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return root


def _without_code(state: dict) -> dict:
    return {key: value for key, value in state.items() if key != "code"}


def _stamped_clean(checkout) -> dict:
    return {"sha": _head(checkout), "dirty": False, "diff_sha256": None, "source": "stamp"}


def _head(root) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()


def test_a_clean_checkout_records_its_commit_clean(checkout):
    state = prov.provenance(checkout)
    assert _without_code(state) == {"sha": _head(checkout), "dirty": False, "diff_sha256": None, "source": "git"}


def test_untracked_files_never_make_a_run_dirty(checkout):
    (checkout / "fox.json").write_text("{}")  # e.g. a result written at the root
    (checkout / "pkg" / "new.py").write_text("")
    assert prov.provenance(checkout)["dirty"] is False


def test_a_touched_but_unchanged_file_is_clean(checkout):
    (checkout / "pkg" / "a.py").write_text("A = 1\n")  # new mtime, same content
    assert prov.provenance(checkout)["dirty"] is False


def test_a_tracked_change_is_dirty_with_a_hash_of_its_diff(checkout):
    (checkout / "pkg" / "a.py").write_text("A = 2\n")
    first = prov.provenance(checkout)
    assert first["dirty"] is True and first["sha"] == _head(checkout) and len(first["diff_sha256"]) == 64
    assert prov.provenance(checkout)["diff_sha256"] == first["diff_sha256"]  # the same edit, the same hash
    (checkout / "pkg" / "a.py").write_text("A = 3\n")
    assert prov.provenance(checkout)["diff_sha256"] != first["diff_sha256"]
    assert prov.label(first) == f"{_head(checkout)[:7]} + local changes (diff {first['diff_sha256'][:8]})"


def test_a_staged_or_deleted_file_is_dirty(checkout):
    (checkout / "README.md").unlink()
    assert prov.provenance(checkout)["dirty"] is True


def _copy_without_git(checkout, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
    return copy


def test_a_copy_without_git_records_the_stamped_commit_clean(checkout, tmp_path):
    prov.write_stamp(checkout)
    copy = _copy_without_git(checkout, tmp_path)
    (copy / "results.json").write_text("{}")  # untracked in the copy: still clean
    assert _without_code(prov.provenance(copy)) == _stamped_clean(checkout)


@pytest.mark.parametrize("change", ["edit", "delete"])
def test_a_changed_copy_is_dirty_with_a_hash_of_what_differs(checkout, tmp_path, change):
    prov.write_stamp(checkout)
    copy = _copy_without_git(checkout, tmp_path)
    if change == "edit":
        (copy / "pkg" / "a.py").write_text("A = 2\n")
    else:
        (copy / "pkg" / "a.py").unlink()
    state = prov.provenance(copy)
    assert state["sha"] == _head(checkout) and state["dirty"] is True and len(state["diff_sha256"]) == 64


def test_the_stamp_hashes_files_as_git_does(checkout):
    blob = subprocess.run(["git", "hash-object", "pkg/a.py"], cwd=checkout, capture_output=True, text=True)
    assert prov.blob_id((checkout / "pkg" / "a.py").read_bytes()) == blob.stdout.strip()


def test_a_dirty_checkout_cannot_be_stamped(checkout):
    (checkout / "pkg" / "a.py").write_text("A = 2\n")
    with pytest.raises(ValueError, match="commit or stash"):
        prov.write_stamp(checkout)


def test_git_wins_over_a_stale_stamp(checkout):
    prov.write_stamp(checkout)
    (checkout / "README.md").write_text("changed\n")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    assert prov.provenance(checkout)["sha"] == _head(checkout)


def test_a_folder_inside_another_repository_is_not_taken_for_it(checkout):
    inner = checkout / "ignored" / "site"
    inner.mkdir(parents=True)
    assert prov.provenance(inner) is None


def test_this_package_records_a_commit_where_it_runs_from_a_checkout():
    state = prov.provenance()
    assert state is None or set(state) == {"sha", "dirty", "diff_sha256", "code", "source"}


def test_a_copy_with_older_git_metadata_records_the_stamped_commit(checkout, tmp_path):
    """A GPU machine's copy: the files of the new commit beside .git metadata of an older one."""
    old_git = tmp_path / "old-git"
    shutil.copytree(checkout / ".git", old_git)
    (checkout / "pkg" / "a.py").write_text("A = 2\n")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    prov.write_stamp(checkout)
    copy = _copy_without_git(checkout, tmp_path)
    shutil.copytree(old_git, copy / ".git")
    assert prov.from_git(copy)["dirty"] is True
    assert _without_code(prov.provenance(copy)) == _stamped_clean(checkout)
    (copy / "README.md").write_text("edited on the copy\n")  # now neither is clean: git's answer stands
    assert prov.provenance(copy)["source"] == "git"


def test_stored_results_replaced_by_a_run_never_make_the_next_dirty(checkout, tmp_path):
    """make results replaces tracked result files one benchmark at a time: the code measured is unchanged."""
    prov.write_stamp(checkout)
    copy = _copy_without_git(checkout, tmp_path)
    for root in (checkout, copy):
        (root / "results" / "h200" / "e2e.json").write_text('{"new": 1}\n')
    assert prov.provenance(checkout)["dirty"] is False
    assert _without_code(prov.provenance(copy)) == _stamped_clean(checkout)


def test_the_code_digest_follows_the_code_not_docs_tests_or_results(checkout, tmp_path):
    """Two commits with the same code digest measure the same code: a commit of docs, tests or results keeps it, one of
    the package, its CUDA sources, its configs or pyproject.toml changes it; a copy's stamp gives git's digest."""
    for name in ("ltxbench/run.py", "cuda/k.cu", "configs/m.json", "pyproject.toml", "docs/d.md", "tests/t.py"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("1\n")
    _git(checkout, "add", ".")

    def commit() -> str:
        _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "next")
        return prov.provenance(checkout)["code"]

    first = commit()
    for name in ("docs/d.md", "tests/t.py", "results/h200/e2e.json", "README.md"):
        (checkout / name).write_text("2\n")
        assert commit() == first, name
    for name in ("ltxbench/run.py", "cuda/k.cu", "configs/m.json", "pyproject.toml"):
        before = prov.provenance(checkout)["code"]
        (checkout / name).write_text("3\n")
        assert commit() != before, name
    prov.write_stamp(checkout)
    assert prov.from_stamp(_copy_without_git(checkout, tmp_path))["code"] == prov.from_git(checkout)["code"]


def test_a_run_records_the_package_modules_it_imported_and_their_digest():
    """run_provenance (what a result records, at the end of its run) lists the package's modules the process imported,
    and no module it never imported (here: an injection of another family); executed_code is their executed_digest
    at the commit."""
    import json
    import sys

    from tests.helpers import REPO

    script = ("import json, ltxbench.results.provenance as p, ltxbench.inject.fuse; "
              "print(json.dumps(p.run_provenance()))")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    state = json.loads(out.stdout)
    if state is None:
        pytest.skip("not a checkout and no stamp: nothing recorded")
    assert {"ltxbench/results/provenance.py", "ltxbench/inject/fuse.py"} <= set(state["executed"])
    assert "ltxbench/inject/wan/__init__.py" not in state["executed"]
    files = prov.provenance_and_files(REPO)[1]
    assert state["executed_kernels"] is None  # the library was never loaded: every kernel file counts
    assert state["executed_code"] == prov.executed_digest(files, state["executed"])


def test_a_copy_gives_the_stamped_files_and_git_gives_heads(checkout, tmp_path):
    prov.write_stamp(checkout)
    copy = _copy_without_git(checkout, tmp_path)
    state, stamped = prov.provenance_and_files(copy)
    assert state["source"] == "stamp" and stamped == prov.provenance_and_files(checkout)[1]
    assert stamped["pkg/a.py"] == prov.blob_id(b"A = 1\n")
    assert prov.provenance_and_files(tmp_path / "neither") == (None, None)


def test_the_executed_digest_follows_the_imported_modules_and_everything_but_python():
    """A module the run never imported may change; an imported one, a CUDA source, a config, a data file of the
    package or pyproject.toml may not; docs and tests never count; a module gone is a change."""
    files = {"ltxbench/run.py": "1", "ltxbench/other.py": "2", "ltxbench/ops/choices.json": "3", "cuda/k.cu": "4",
             "configs/m.json": "5", "pyproject.toml": "6", "docs/d.md": "7", "tests/t.py": "8"}
    first = prov.executed_digest(files, ["ltxbench/run.py"])
    for name in ("ltxbench/other.py", "docs/d.md", "tests/t.py"):
        assert prov.executed_digest({**files, name: "x"}, ["ltxbench/run.py"]) == first, name
    for name in ("ltxbench/run.py", "ltxbench/ops/choices.json", "cuda/k.cu", "configs/m.json", "pyproject.toml"):
        assert prov.executed_digest({**files, name: "x"}, ["ltxbench/run.py"]) != first, name
    gone = {name: blob for name, blob in files.items() if name != "ltxbench/run.py"}
    assert prov.executed_digest(gone, ["ltxbench/run.py"]) != first


def test_the_executed_digest_follows_the_kernel_files_the_run_entered():
    """With the kernel files a run entered recorded, another kernel file may change; an entered one, a shared header
    or a binding may not; a record without the list (None) counts every kernel file; an entered file gone is a
    change."""
    files = {"ltxbench/run.py": "1", "cuda/norm.cu": "2", "cuda/gemv.cu": "3", "cuda/gemm.cpp": "4",
             "cuda/common/dtype.cuh": "5", "cuda/bindings/norm.cpp": "6"}
    modules, kernels = ["ltxbench/run.py"], ["cuda/norm.cu"]
    first = prov.executed_digest(files, modules, kernels)
    for name in ("cuda/gemv.cu", "cuda/gemm.cpp"):
        assert prov.executed_digest({**files, name: "x"}, modules, kernels) == first, name
        assert prov.executed_digest({**files, name: "x"}, modules) != prov.executed_digest(files, modules), name
    for name in ("cuda/norm.cu", "cuda/common/dtype.cuh", "cuda/bindings/norm.cpp"):
        assert prov.executed_digest({**files, name: "x"}, modules, kernels) != first, name
    gone = {name: blob for name, blob in files.items() if name != "cuda/norm.cu"}
    assert prov.executed_digest(gone, modules, kernels) != first
    assert prov.executed_digest(files, modules, []) != first  # nothing entered: norm.cu left out
    assert [name for name in files if prov.is_kernel_file(name)] == ["cuda/norm.cu", "cuda/gemv.cu", "cuda/gemm.cpp"]


def test_changed_since_names_what_the_run_executed_that_differs_now(checkout):
    """The files a stored run executed whose content changed since the commit it measured (the manifest's listing
    says them): not a module it never imported, a kernel file it never entered, docs or tests; None without git or
    without the record's list."""
    for name in ("ltxbench/run.py", "ltxbench/other.py", "cuda/norm.cu", "cuda/gemv.cu", "cuda/common/h.cuh",
                 "docs/d.md"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("1\n")
    _git(checkout, "add", ".")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "measured")
    git = {**prov.from_git(checkout), "executed": ["ltxbench/run.py"], "executed_kernels": ["cuda/norm.cu"]}
    for name in ("ltxbench/other.py", "cuda/gemv.cu", "docs/d.md", "ltxbench/run.py", "cuda/common/h.cuh"):
        (checkout / name).write_text("2\n")
    # added since: CUDA sources the run cannot have entered (nothing it ran calls or includes them), and a config,
    # which counts (a folder of them may be read whole)
    for name in ("cuda/new.cu", "cuda/bindings/new.cpp", "cuda/common/new.cuh", "configs/new.json"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("3\n")
    _git(checkout, "add", ".")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
    files = prov.provenance_and_files(checkout)[1]
    assert prov.changed_since(git, files, checkout) == ["configs/new.json", "cuda/common/h.cuh", "ltxbench/run.py"]
    assert prov.changed_since({**git, "executed_kernels": None}, files, checkout) == [
        "configs/new.json", "cuda/common/h.cuh", "cuda/gemv.cu", "ltxbench/run.py"]  # without the list: every kernel
    assert prov.changed_since({**git, "executed": None}, files, checkout) is None
    assert prov.changed_since({**git, "sha": "0" * 40}, files, checkout) is None  # a commit this checkout lacks


def test_a_comment_or_docstring_change_is_not_a_code_change(checkout, monkeypatch, tmp_path):
    """A module whose comments, docstrings or layout changed since a run still runs the same code (its result stays
    current); a changed statement, constant or a syntax error does not."""
    from ltxbench.results import remeasure

    module = checkout / "ltxbench" / "run.py"
    module.parent.mkdir()
    module.write_text('"""Run."""\nSCALE = 1.0  # the scale\n\n\ndef f(x):\n    """Scaled."""\n    return x * SCALE\n')
    _git(checkout, "add", ".")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "measured")
    git = {**prov.run_provenance(checkout), "executed": ["ltxbench/run.py"], "executed_kernels": []}
    git["executed_code"] = prov.executed_digest(prov.provenance_and_files(checkout)[1], git["executed"], [])
    monkeypatch.setattr(prov, "repository_root", lambda: checkout)
    result = tmp_path / "r.json"
    result.write_text(__import__("json").dumps({"env": {"git": git}}))
    cases = {
        '"""Run, now said otherwise."""\nSCALE = 1.0    # the scale, kept\n\n\ndef f(x):\n    return x * SCALE\n': [],
        '"""Run."""\nSCALE = 1.01  # the scale\n\n\ndef f(x):\n    """Scaled."""\n    return x * SCALE\n':
            ["ltxbench/run.py"],
        '"""Run."""\nSCALE = 1.0\n\n\ndef f(x):\n    """Scaled."""\n    return SCALE * x\n': ["ltxbench/run.py"],
        'def f(x:\n': ["ltxbench/run.py"],
    }
    for source, changed in cases.items():
        module.write_text(source)
        _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
        files = prov.provenance_and_files(checkout)[1]
        assert prov.changed_since(git, files, checkout) == changed, source
        head = {"sha": _head(checkout)}
        assert remeasure.is_current(result, head, files=files) is (changed == []), source


def test_a_run_that_recorded_its_binding_files_is_kept_through_changes_to_other_ops_bindings():
    """A run that names the binding files it called (cuda/bindings/<op family>.cpp) depends on those, not on another
    family's; one recorded before bindings were named depends on all of them. The recorders (what notes which code ran)
    never count."""
    files = {"ltxbench/run.py": "1", "cuda/norm.cu": "2", "cuda/bindings/norm.cpp": "3", "cuda/bindings/attn.cpp": "4",
             "cuda/bindings/checks.h": "5", "cuda/bindings/source_use.cpp": "6", "cuda/common/source_use.h": "7",
             "ltxbench/results/provenance.py": "8"}
    modules = ["ltxbench/run.py", "ltxbench/results/provenance.py"]
    named = ["cuda/norm.cu", "cuda/bindings/norm.cpp"]
    first, older = prov.executed_digest(files, modules, named), prov.executed_digest(files, modules, ["cuda/norm.cu"])
    assert prov.executed_digest({**files, "cuda/bindings/attn.cpp": "x"}, modules, named) == first
    assert prov.executed_digest({**files, "cuda/bindings/attn.cpp": "x"}, modules, ["cuda/norm.cu"]) != older
    for name in ("cuda/bindings/norm.cpp", "cuda/bindings/checks.h", "cuda/norm.cu"):
        assert prov.executed_digest({**files, name: "x"}, modules, named) != first, name
    for name in prov.RECORDERS:
        assert prov.executed_digest({**files, name: "x"}, modules, named) == first, name
        assert prov.executed_digest({**files, name: "x"}, modules, ["cuda/norm.cu"]) == older, name
    assert [name for name in files if prov.is_binding_file(name)] == ["cuda/bindings/norm.cpp",
                                                                      "cuda/bindings/attn.cpp"]


def test_a_cuda_change_in_comments_markers_or_layout_only_is_not_a_code_change(checkout):
    """CUDA/C++ sources compared without comments, entry markers, the recorder's include and indentation; a changed
    token, string literal or the line that ends a preprocessor directive is a change."""
    source = checkout / "cuda" / "bindings" / "norm.cpp"
    source.parent.mkdir(parents=True)
    base = ('#include "bindings/checks.h"\n#define TWICE(x) \\\n  (2 * (x))\nint f(int x) {  // one\n'
            '  return TWICE(x) + 1;\n}\nconst char* kName = "a // b";\n')
    same = ('#include "bindings/checks.h"\n#include "common/source_use.h"\n#define TWICE(x) \\\n  (2 * (x))\n'
            'int f(int x) {\n  NOTE_SOURCE_USED();  /* the entry */\n      return TWICE(x) + 1;\n}\n'
            'const char* kName = "a // b";  // kept\n')
    cases = {same: [], base.replace("+ 1", "+ 2"): ["cuda/bindings/norm.cpp"],
             base.replace('"a // b"', '"a //  b"'): ["cuda/bindings/norm.cpp"],
             base.replace("(2 * (x))\nint", "(2 * (x)) int"): ["cuda/bindings/norm.cpp"]}
    _assert_changed_after_each(checkout, source, base, cases, kernels=["cuda/bindings/norm.cpp"])


def test_a_pyproject_metadata_change_is_not_a_code_change(checkout):
    """pyproject.toml compared by what a run reads of it: its license, description or build requirements may change
    and results stay current; a dependency, an entry point or the package data may not."""
    project = checkout / "pyproject.toml"
    base = ('[build-system]\nrequires = ["setuptools>=68"]\n\n[project]\nname = "p"\nlicense = { text = "MIT" }\n'
            'dependencies = ["torch>=2.11"]\n\n[project.scripts]\np = "p.cli:app"\n\n'
            '[tool.setuptools.package-data]\np = ["*.json"]\n\n[tool.ruff]\nline-length = 120\n')
    same = base.replace('{ text = "MIT" }', '"MIT"').replace(">=68", ">=77").replace("120", "100") \
        .replace('name = "p"\n', 'name = "p"\ndescription = "a package"\n')
    cases = {same: [], base.replace("torch>=2.11", "torch>=2.12"): ["pyproject.toml"],
             base.replace("p.cli:app", "p.cli:main"): ["pyproject.toml"],
             base.replace('["*.json"]', '["*.json", "*.cu"]'): ["pyproject.toml"],
             base.replace("[project]", "[project"): ["pyproject.toml"]}
    _assert_changed_after_each(checkout, project, base, cases, kernels=[])


def _assert_changed_after_each(checkout, path, base, cases: dict, kernels: list[str]) -> None:
    """`path` committed as `base` and measured by a run that entered `kernels`; then each of `cases` (text: the files
    changed_since must name) committed in turn."""
    path.write_text(base)
    _git(checkout, "add", ".")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "measured")
    git = {**prov.from_git(checkout), "executed": [], "executed_kernels": kernels}
    for text, changed in cases.items():
        path.write_text(text)
        _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
        assert prov.changed_since(git, prov.provenance_and_files(checkout)[1], checkout) == changed, text
