"""Which code a result measured: the commit, and whether the tracked files differed from it.

A run from a git checkout asks git: the commit is HEAD, and the run is dirty when a TRACKED file differs from it
(untracked files, such as a result written at the repository root, and the stored results under results/, which
a run of `make results` replaces one by one, never make a run dirty); a dirty run records the
SHA-256 of `git diff HEAD`, so that two runs of the same edit can be told apart from two different edits.

A copy of the tree without `.git` (what a GPU machine is sent) cannot ask git. `python -m ltxbench.results.provenance
stamp` writes `.ltxbench-commit.json` at the repository root before the copy: the commit and the git blob id of every
tracked file. The copy then hashes its files the way git does and records that commit, clean when every listed file
is there with its committed content; else dirty, with a hash of what differs. Either way a result also records the
commit's `code` digest (code_digest: the blobs of what a run executes), which says whether it still describes a later
commit that changed only docs or tests. A run's result also names the package modules it imported (`executed`) and
their digest with the CUDA sources, configs and data (`executed_code`): whether it describes a later commit that
changed only code the run never imported (another family's injection, the report), and the kernel and binding
files it entered (`executed_kernels`): a later change to a kernel or op it never ran leaves it current,
as do, where git has both versions, edits that leave the code as it was (changed_since: comments, docstrings, layout,
entry markers), CUDA sources added since, and changes to the RECORDERS. A stamp also wins over `.git` metadata older
than the files (which git would call dirty). A stamp of a dirty checkout is refused: it would describe a commit the
files do not hold.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from pathlib import Path

STAMP_NAME = ".ltxbench-commit.json"
OUTPUTS = "results/"  # what the runs write (tracked result documents): never the code a run measured
CODE = ("ltxbench/", "cuda/", "configs/", "pyproject.toml")  # what a run executes: not docs, tests or results
TIMEOUT_S = 20


def repository_root() -> Path:
    """The folder above the ltxbench package: a checkout's root (or site-packages in an installed wheel)."""
    return Path(__file__).resolve().parents[2]


def _git(args: list[str], root: Path) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _is_checkout(root: Path) -> bool:
    """git answers for this very folder (not for a repository that merely contains it)."""
    top = _git(["rev-parse", "--show-toplevel"], root)
    return top is not None and Path(top.strip()).resolve() == root.resolve()


def blob_id(data: bytes) -> str:
    """git's object id of a file's content (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def code_digest(files: dict[str, str]) -> str:
    """SHA-256 over the blob ids ({path: blob}) of the files a run executes (CODE): two commits with the same digest
    measure the same code, so a result of one describes the other (a commit that changed only docs or tests)."""
    lines = sorted(f"{name} {blob}" for name, blob in files.items() if name.startswith(CODE))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


PACKAGE = "ltxbench/"


def executed_modules(root: Path) -> list[str]:
    """The package's Python files this process imported (paths relative to `root`): at the end of a run, the code
    it may have executed; the rest of the package (another family's injection, the report) it cannot have."""
    package = (root / PACKAGE).resolve()
    paths = set()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and (name == "ltxbench" or name.startswith("ltxbench.")):
            path = Path(file).resolve()
            if path.is_relative_to(package):
                paths.add(path.relative_to(root.resolve()).as_posix())
    return sorted(paths)


KERNELS = "cuda/"
BINDINGS = "cuda/bindings/"
# What records which code a run executed, and nothing a figure depends on: a change to it leaves results current.
RECORDERS = ("ltxbench/results/provenance.py", "ltxbench/results/code_equivalence.py", "cuda/common/source_use.h",
             "cuda/bindings/source_use.cpp")


def is_kernel_file(name: str) -> bool:
    """A kernel file (cuda/*.cu, cuda/*.cpp): its code runs only when a run enters it (ops.build.sources_used). The
    shared headers (cuda/common/, cuda/bindings/*.h) are part of every run of the library."""
    return name.startswith(KERNELS) and "/" not in name[len(KERNELS):] and name.endswith((".cu", ".cpp"))


def is_binding_file(name: str) -> bool:
    """A binding file (cuda/bindings/*.cpp): its ops' entry points run only when a run calls them; a run records the
    ones it entered beside the kernel files (a run recorded before that did not: then every binding file counts)."""
    return name.startswith(BINDINGS) and "/" not in name[len(BINDINGS):] and name.endswith(".cpp") and \
        name not in RECORDERS


def executed_files(files: dict[str, str], modules: list[str], kernels: list[str] | None = None) -> set[str]:
    """The names among `files` (and `modules` / `kernels` no longer there) that a run with these imported `modules` and
    entered `kernels` executed: those modules, those kernel and binding files (every kernel file where `kernels` is
    None: a run that did not record them; every binding file where `kernels` names none: a run recorded before the
    bindings were), and every other file of CODE (CUDA headers, configs, data files read as resources,
    pyproject.toml)."""
    imported, entered = set(modules), None if kernels is None else set(kernels)
    bindings_recorded = entered is not None and any(is_binding_file(name) for name in entered)

    def executed(name: str) -> bool:
        if name in RECORDERS:
            return False
        if name.startswith(PACKAGE) and name.endswith(".py"):
            return name in imported
        if is_binding_file(name):
            return not bindings_recorded or name in entered
        return entered is None or not is_kernel_file(name) or name in entered

    named = {name for name in files if name.startswith(CODE)} | imported | (entered or set())
    return {name for name in named if executed(name)}


def executed_digest(files: dict[str, str], modules: list[str], kernels: list[str] | None = None) -> str:
    """SHA-256 over the blob ids of executed_files (a module or kernel file no longer in `files` as missing)."""
    lines = [f"{name} {files.get(name, 'missing')}" for name in executed_files(files, modules, kernels)]
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def changed_since(git: dict, files: dict[str, str], root: Path | None = None) -> list[str] | None:
    """The files a recorded run executed (`git`: a result's env.git) whose content at the checkout's commit (`files`)
    differs from the commit it measured (a Python file by its syntax tree: not a comment, docstring or layout
    change; a CUDA file without comments and entry markers; a CUDA file added since, never); None where that commit's
    files cannot be read (no git here, or no list)."""
    if not git or not git.get("sha") or git.get("executed") is None:
        return None
    root = root or repository_root()
    measured = _blobs_at(root, git["sha"])
    if measured is None:
        return None
    names = executed_files(measured, git["executed"], git.get("executed_kernels")) | \
        executed_files(files, git["executed"], git.get("executed_kernels"))
    return sorted(name for name in names if measured.get(name) != files.get(name) and not _added_source(name, measured)
                  and not _same_code(root, name, measured.get(name), files.get(name)))


def _added_source(name: str, measured: dict[str, str]) -> bool:
    """A CUDA source the measured commit did not have: not code its run entered (a kernel or binding file is reached
    only through a call, a header only through an include, from a file that existed and so changed too). Configs and
    data files count when added: a folder of them may be read whole."""
    return name.startswith(KERNELS) and name not in measured


@functools.cache
def _blobs_at(root: Path, sha: str) -> dict[str, str] | None:
    """_committed_blobs of a commit named by its id (never moves: one `git ls-tree` per commit and process, however
    many stored results measured it). Read only."""
    return _committed_blobs(root, sha)


@functools.cache
def _same_code(root: Path, name: str, before: str | None, after: str | None) -> bool:
    """Two versions (blob ids) of a file that are the same code (code_equivalence.same_code); once per pair and
    process, as many stored results ask about the same files."""
    from ltxbench.results.code_equivalence import same_code

    if not (before and after):
        return False
    sources = [_git(["cat-file", "blob", blob], root) for blob in (before, after)]
    return None not in sources and same_code(name, *sources)


def _committed_blobs(root: Path, commit: str = "HEAD") -> dict[str, str] | None:
    """{path: blob id} of `commit`'s tree (submodules left out)."""
    listing = _git(["ls-tree", "-r", commit], root)
    if listing is None:
        return None
    blobs = {}
    for line in listing.splitlines():
        meta, name = line.split("\t", 1)
        _mode, kind, blob = meta.split()
        if kind == "blob":
            blobs[name] = blob
    return blobs


def from_git(root: Path) -> dict | None:
    """{sha, dirty, diff_sha256, code, source: "git"} of a checkout (code: HEAD's code_digest); None where git does not
    answer for `root`."""
    return _git_state(root)[0]


def _git_state(root: Path) -> tuple[dict | None, dict[str, str] | None]:
    """from_git's state, and HEAD's {path: blob id} it was computed from."""
    if not _is_checkout(root):
        return None, None
    sha = _git(["rev-parse", "HEAD"], root)
    if sha is None:  # a repository without commits
        return {"sha": None, "dirty": True, "diff_sha256": None, "code": None, "source": "git"}, None
    status = _git(["status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){OUTPUTS}"], root)
    dirty = None if status is None else bool(status.strip())
    digest = None
    if dirty:
        diff = subprocess.run(["git", "diff", "HEAD", "--binary", "--", ".", f":(exclude){OUTPUTS}"], cwd=root,
                              capture_output=True, timeout=TIMEOUT_S)
        digest = hashlib.sha256(diff.stdout).hexdigest() if diff.returncode == 0 else None
    blobs = _committed_blobs(root)
    return {"sha": sha.strip(), "dirty": dirty, "diff_sha256": digest,
            "code": None if blobs is None else code_digest(blobs), "source": "git"}, blobs


def from_stamp(root: Path) -> dict | None:
    """{sha, dirty, diff_sha256, code, source: "stamp"} of a copy holding a stamp; None without one."""
    return _stamp_state(root)[0]


def _stamp_state(root: Path) -> tuple[dict | None, dict[str, str] | None]:
    """from_stamp's state, and the stamp's {path: blob id}."""
    path = root / STAMP_NAME
    if not path.is_file():
        return None, None
    stamp = json.loads(path.read_text())
    differing = []
    for name, committed in sorted(stamp["files"].items()):
        if name.startswith(OUTPUTS):
            continue
        file = root / name
        actual = blob_id(file.read_bytes()) if file.is_file() else None
        if actual != committed:
            differing.append(f"{name}\0{actual}")
    digest = hashlib.sha256("\n".join(differing).encode()).hexdigest() if differing else None
    return {"sha": stamp["sha"], "dirty": bool(differing), "diff_sha256": digest, "code": code_digest(stamp["files"]),
            "source": "stamp"}, stamp["files"]


def provenance(root: Path | None = None) -> dict | None:
    """The code this process runs: from git where the package sits in a checkout, else from a stamp; None when
    neither is there (an installed wheel). A stamp whose every file holds its commit's content wins over a git that
    calls the tree dirty: a copy can carry `.git` metadata older than its files (a GPU machine's copy does)."""
    return provenance_and_files(root)[0]


def provenance_and_files(root: Path | None = None) -> tuple[dict | None, dict[str, str] | None]:
    """provenance(), and the {path: blob id} of the commit it names (HEAD's tree, or the stamp's list; None where
    there is none): what executed_digest reads."""
    root = root or repository_root()
    git, stamp = _git_state(root), _stamp_state(root)
    if stamp[0] is not None and not stamp[0]["dirty"] and (git[0] is None or git[0]["dirty"]):
        return stamp
    return git if git[0] is not None else stamp


def run_provenance(root: Path | None = None) -> dict | None:
    """provenance() of a finished run, with the package modules it imported (`executed`), the kernel files it entered
    (`executed_kernels`; None: not recorded, every kernel file counts) and `executed_code`, their executed_digest at
    the commit, by which a later commit's checkout tells whether the run still describes it."""
    root = root or repository_root()
    state, files = provenance_and_files(root)
    if files is not None:
        build = sys.modules.get("ltxbench.ops.build")  # not imported: the library was never loaded here
        modules, kernels = executed_modules(root), build.sources_used() if build is not None else None
        state = {**state, "executed": modules, "executed_kernels": kernels,
                 "executed_code": executed_digest(files, modules, kernels)}
    return state


def write_stamp(root: Path | None = None) -> Path:
    """The stamp of a clean checkout at its root; ValueError for a dirty or unreadable one."""
    root = root or repository_root()
    state = from_git(root)
    if state is None or state["sha"] is None:
        raise ValueError(f"{root} is not a git checkout with a commit")
    if state["dirty"]:
        raise ValueError("tracked files differ from HEAD: commit or stash them first (a stamp names one commit)")
    files = _committed_blobs(root) or {}  # clean: HEAD's tree is the checkout's tracked files
    path = root / STAMP_NAME
    path.write_text(json.dumps({"sha": state["sha"], "files": files}, indent=0, sort_keys=True) + "\n")
    return path


def label(git: dict | None) -> str:
    """'abc1234', 'abc1234 + local changes (diff 1a2b3c4d)' or 'commit not recorded'."""
    if not git or not git.get("sha"):
        return "commit not recorded"
    text = git["sha"][:7]
    if git.get("dirty"):
        digest = git.get("diff_sha256")
        text += " + local changes" + (f" (diff {digest[:8]})" if digest else "")
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["stamp"]:
        try:
            print(write_stamp())
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if argv[:1] == ["show"]:
        print(json.dumps(provenance()))
        return 0
    print("usage: python -m ltxbench.results.provenance stamp|show", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
