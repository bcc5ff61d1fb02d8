"""One benchmark's re-measurement for the manifest: whether its stored file is current (measured clean, by this
benchmark's command, at the checkout's commit or one whose executed code is unchanged), whether it is due and fits the
budget left, its command's work folder, and its finished result stamped and kept in the GPU folder. The runs of
ltxbench.results.manifest (one GPU) and ltxbench.results.spread (several) are made of these steps."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ltxbench.results.benchmarks import Benchmark
from ltxbench.results.commands import first_frame, missing_needs
from ltxbench.results.provenance import changed_since, executed_digest, label


def _document(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def recorded_git(path: Path) -> dict | None:
    return _git_of(_document(path))


def _git_of(document: dict) -> dict | None:
    return (document.get("env") or {}).get("git")


def ran_the_command(document: dict, bench: Benchmark) -> bool:
    """The result `document` is the benchmark's as it is defined now: made by this manifest for it (run.benchmark,
    stamped when the run finished: its name and command line). A file from another command line (another --dtype,
    --seed or --precision, a flag the definition has dropped since) or put there by hand is not."""
    return (document.get("run") or {}).get("benchmark") == _stamp_of(bench)


def _stamp_of(bench: Benchmark) -> dict:
    """`run.benchmark` of a result this manifest made for `bench`: its name and command line as defined now."""
    return {"name": bench.name, "argv": list(bench.argv)}


WALL = "manifest_wall_minutes"  # run.<WALL>: the command's wall time as the manifest measured it (expected_minutes)
BESIDE = "manifest_beside"  # run.<BESIDE>: benchmarks run on the host's other GPUs meanwhile (spread), [] for none
CORES = "manifest_cpu_cores"  # run.<CORES>: the host's CPU cores the command had to itself (spread)


def _stamp(path: Path, bench: Benchmark, wall_minutes: float | None = None, host: dict | None = None) -> None:
    """Record in the finished result which benchmark of the manifest it is (ran_the_command reads it), the wall
    time the command took and, measured on one GPU of several (spread), what ran on the others meanwhile."""
    from ltxbench.results.io import dumps

    document = json.loads(path.read_text())
    run = document.setdefault("run", {})
    run["benchmark"] = _stamp_of(bench)
    if wall_minutes is not None:
        run[WALL] = round(wall_minutes, 2)
    run.update(host or {})  # spread: BESIDE and CORES
    path.write_text(dumps(document))


def expected_minutes(bench: Benchmark, target: Path) -> float:
    """The wall time the budget goes by, with a quarter and 15 s to spare for a colder machine: the stored result's
    own (the same benchmark on this folder's GPU); else the slowest of the same benchmark's results in the folders
    beside this one (other GPUs: a closer guess than a fixed estimate); else the benchmark's estimate."""
    wall = _wall(target, bench)
    folders = target.parent.parent
    if wall is None and folders.is_dir():
        beside = (_wall(d / target.name, bench) for d in folders.iterdir() if d.is_dir() and d != target.parent)
        wall = max((w for w in beside if w is not None), default=None)
    return bench.minutes if wall is None else round(1.25 * wall + 0.25, 1)


def _wall(path: Path, bench: Benchmark) -> float | None:
    """The wall minutes the manifest recorded in the result at `path`, where it is `bench`'s (ran_the_command)."""
    document = _document(path)
    wall = (document.get("run") or {}).get(WALL)
    ok = isinstance(wall, int | float) and wall > 0 and ran_the_command(document, bench)
    return float(wall) if ok else None


def is_current(path: Path, head: dict, bench: Benchmark | None = None, files: dict | None = None) -> bool:
    """Measured clean (with the benchmark's command, when given) at the checkout's commit, or at one whose code it
    still runs: the same executed_digest of the modules it imported at the checkout's committed `files` (or, where git
    can tell, no file it executed changed as code: provenance.changed_since), or, for a result without that list, the
    same code_digest."""
    document = _document(path)
    git = _git_of(document)
    if not git or git.get("dirty") is not False or (bench is not None and not ran_the_command(document, bench)):
        return False
    if git.get("sha") == head["sha"]:
        return True
    if git.get("executed_code") is not None and files is not None:
        if executed_digest(files, git.get("executed") or [], git.get("executed_kernels")) == git["executed_code"]:
            return True
        return changed_since(git, files) == []
    return git.get("code") is not None and git.get("code") == head.get("code")


def current_label(path: Path, head: dict) -> str:
    """'current (abc1234)', or 'current (measured at abc1234, the code of def5678)': the code it ran unchanged."""
    measured = label(recorded_git(path))
    return f"current ({measured})" if measured == label(head) else f"current (measured at {measured}, the code of " \
        f"{label(head)})"


def due(bench: Benchmark, folder: Path, head, files, redo: bool) -> bool:
    """Whether `bench` is to be measured: not current (or `redo`), its needs met; says why not."""
    target = folder / f"{bench.name}.json"
    if not redo and is_current(target, head, bench, files):
        print(f"{bench.name}: {current_label(target, head)}", flush=True)
        return False
    missing = missing_needs(bench)
    if missing:
        print(f"{bench.name}: skipped, needs {', '.join(missing)}", flush=True)
        return False
    return True


NO_BUDGET_S = 24 * 3600  # a command's time limit where no budget was given


def time_left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def pending_status(pending: list[str]) -> int:
    """124 where benchmarks were left pending by the budget (said so, to call again), else 0."""
    if not pending:
        return 0
    print(f"{len(pending)} pending ({', '.join(pending)}): call again to resume", flush=True)
    return 124


def fits(bench: Benchmark, folder: Path, left: float | None) -> bool:
    """Whether `bench` fits in the `left` seconds of the budget (None: no budget); says so when it does not."""
    minutes = expected_minutes(bench, folder / f"{bench.name}.json")
    if left is not None and left < minutes * 60:
        print(f"{bench.name}: pending (about {minutes:g} min, {max(left, 0) / 60:.1f} min of the budget left)",
              flush=True)
        return False
    return True


def prepare(bench: Benchmark, work: Path) -> tuple[list[str], Path]:
    """A fresh `work` folder, the benchmark's command line there (its first frame made for image-to-video) and the
    path its result goes to."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    argv = [*bench.argv, *(("--image", str(first_frame(work / "first-frame.png"))) if bench.image else ())]
    return argv, work / f"{bench.name}.json"


def settle(code: int, output: Path, bench: Benchmark, folder: Path, measured: list, head, started: float,
           host: dict | None = None, where: str = "") -> int:
    """A finished command's outcome: its files kept (stamped; `host`: what spread records of the host it shared) and
    0, or the stored file left as it was and 1 (failed) / 124 (stopped at its time)."""
    if code == 124 and finished(output):
        code = 0  # stopped at the time budget while exiting, its whole result published
    if code != 0:
        print(f"{bench.name}: failed (exit {code}){where}; the stored file is left as it was", flush=True)
        return 124 if code == 124 else 1
    wall = (time.monotonic() - started) / 60  # kept in the result: the next budget goes by it
    keep(output, bench, folder, measured, f"measured at {label(head)} in {wall:.1f} min{where}", wall, host)
    return 0


def finished(output: Path) -> bool:
    """The command published its whole result at `output`: a run stopped before its end publishes none, or one that
    says it is incomplete (what it measured)."""
    from ltxbench.results.schema import incomplete

    document = _document(output)
    return bool(document.get("records")) and not incomplete(document)


def keep(output: Path, bench: Benchmark, folder: Path, measured: list, how: str, wall: float | None = None,
          host: dict | None = None) -> None:
    """A finished benchmark's files, stamped, into `folder` (its name appended to `measured`)."""
    _stamp(output, bench, wall, host)
    for produced in (output, output.with_suffix(".csv")):
        if produced.is_file():
            shutil.move(produced, folder / produced.name)
    measured.append(bench.name)
    print(f"{bench.name}: {how}", flush=True)
