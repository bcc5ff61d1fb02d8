"""Re-measuring the canonical benchmarks (ltxbench.results.benchmarks): one file per benchmark per GPU folder.

`make results GPU=h200` (`python -m ltxbench.results.manifest run results/h200`) runs, at the checkout's commit, each
benchmark of the folder's kind (one GPU, or `hXXXxN`: the N-GPU set) whose file does not already record that commit
clean, stamped as that benchmark's (ran_the_command), or a commit whose code it ran is unchanged
(provenance.executed_digest: only docs, tests or modules the run never imported changed since), then regenerates the
folder's README. Each benchmark's files replace
the old ones only once it has finished, so that a run stopped by its time budget (`--budget-minutes`, to fit a GPU
machine's command limit), a failure or Ctrl-C leaves the folder consistent: call it again and it resumes with the
first benchmark not yet current. A command stopped as it exits, its whole result published, has finished: kept.
`list` shows each benchmark's state without running anything.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ltxbench.results.benchmarks import Benchmark, benchmarks_for, gpus_of
from ltxbench.results.commands import execute, first_frame, host_gpus, missing_needs, parse_devices
from ltxbench.results.provenance import executed_digest, label, provenance_and_files


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


def _stamp(path: Path, bench: Benchmark, wall_minutes: float | None = None, beside: list[str] | None = None) -> None:
    """Record in the finished result which benchmark of the manifest it is (ran_the_command reads it), the wall
    time the command took and, measured on one GPU of several (spread), what ran on the others meanwhile."""
    from ltxbench.results.io import dumps

    document = json.loads(path.read_text())
    run = document.setdefault("run", {})
    run["benchmark"] = _stamp_of(bench)
    if wall_minutes is not None:
        run[WALL] = round(wall_minutes, 2)
    if beside is not None:
        run[BESIDE] = sorted(beside)
    path.write_text(dumps(document))


def expected_minutes(bench: Benchmark, target: Path) -> float:
    """The wall time the budget goes by: the stored result's own (the same benchmark on this folder's GPU), with a
    quarter and 15 s to spare for a colder machine; else the benchmark's estimate."""
    document = _document(target)
    wall = (document.get("run") or {}).get(WALL)
    if isinstance(wall, int | float) and wall > 0 and ran_the_command(document, bench):
        return round(1.25 * wall + 0.25, 1)
    return bench.minutes


def is_current(path: Path, head: dict, bench: Benchmark | None = None, files: dict | None = None) -> bool:
    """Measured clean (with the benchmark's command, when given) at the checkout's commit, or at one whose code it
    still runs: the same executed_digest of the modules it imported at the checkout's committed `files`, or, for a
    result without that list, the same code_digest."""
    document = _document(path)
    git = _git_of(document)
    if not git or git.get("dirty") is not False or (bench is not None and not ran_the_command(document, bench)):
        return False
    if git.get("sha") == head["sha"]:
        return True
    if git.get("executed_code") is not None and files is not None:
        return executed_digest(files, git.get("executed") or []) == git["executed_code"]
    return git.get("code") is not None and git.get("code") == head.get("code")


def current_label(path: Path, head: dict) -> str:
    """'current (abc1234)', or 'current (measured at abc1234, the code of def5678)': the code it ran unchanged."""
    measured = label(recorded_git(path))
    return f"current ({measured})" if measured == label(head) else f"current (measured at {measured}, the code of " \
        f"{label(head)})"


def run(folder: Path, only: list[str] | None = None, budget_minutes: float | None = None, redo: bool = False,
        allow_dirty: bool = False, runner=execute, regenerate=None, devices: list[int] | None = None) -> int:
    """Re-measure the folder's benchmarks that are not current; 0 when all are current or measured, 1 when one
    failed, 2 for a bad call, 124 when the budget stopped the run (call again to resume). `devices`: the host's GPUs
    to run on, one benchmark each at a time (ltxbench.results.spread) when several."""
    head, files = provenance_and_files()
    if head is None or head.get("sha") is None:
        print("error: no commit to record: run from a git checkout, or a copy holding its stamp", file=sys.stderr)
        return 2
    if head["dirty"] and not allow_dirty:
        print(f"error: tracked files differ from {head['sha'][:7]}: commit them first (the stored results describe "
              "committed code)", file=sys.stderr)
        return 2
    chosen = benchmarks_for(folder)
    if only:
        unknown = sorted(set(only) - {b.name for b in chosen})
        if unknown:
            print(f"error: --only {unknown[0]!r} is not a benchmark of {folder} "
                  f"({', '.join(b.name for b in chosen)})", file=sys.stderr)
            return 2
        chosen = [b for b in chosen if b.name in only]
    if devices and len(devices) > 1 and gpus_of(folder) > 1:
        print(f"error: --devices spreads a one-GPU folder's benchmarks over the host's GPUs; {folder} holds the "
              f"{gpus_of(folder)}-GPU set", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    work = folder.parent / "runs" / "manifest" / folder.name
    deadline = None if budget_minutes is None else time.monotonic() + budget_minutes * 60
    measured, status = [], 0
    try:
        if devices and len(devices) > 1:
            from ltxbench.results.spread import measure_spread

            logs = folder.parent / "runs" / "manifest-logs" / folder.name
            status = measure_spread(chosen, folder, work, head, files, redo, deadline, runner, measured, devices, logs)
        else:
            pinned = functools.partial(runner, device=devices[0]) if devices else runner
            status = _measure(chosen, folder, work, head, files, redo, deadline, pinned, measured)
    except KeyboardInterrupt:
        kept = f"kept {', '.join(measured)}" if measured else "no benchmark finished"
        print(f"interrupted: {kept}; the one running is left as it was stored; call again to resume", flush=True)
        status = 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
        # every call: one that measured, one stopped after moving a file in, and one that found all current after
        # such a stop (its README may describe the files before it)
        (regenerate or _regenerate)(folder)
    return status


def _measure(chosen, folder: Path, work: Path, head, files, redo: bool, deadline, runner, measured: list) -> int:
    """Run the benchmarks of `chosen` not current yet that fit in the budget left, in order, each file moved into
    `folder` once it finished (its name then appended to `measured`); the run's status (0, 1 failed, 124 out of budget
    or time: some left pending)."""
    pending = []
    for bench in chosen:
        if not due(bench, folder, head, files, redo):
            continue
        left = time_left(deadline)
        if not fits(bench, folder, left):  # left for the next call; a shorter one after it may still fit
            pending.append(bench.name)
            continue
        argv, output = prepare(bench, work)
        started = time.monotonic()
        try:
            code = runner(argv, output, left if left is not None else 24 * 3600)
        except KeyboardInterrupt:
            if finished(output):  # stopped while exiting, its whole result published: keep it
                keep(output, bench, folder, measured, f"measured at {label(head)}, kept as the run was interrupted")
            raise
        status = settle(code, output, bench, folder, measured, head, started)
        if status:
            return status
    if pending:
        print(f"{len(pending)} pending ({', '.join(pending)}): call again to resume", flush=True)
        return 124
    return 0


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


def time_left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


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
           beside: list[str] | None = None, where: str = "") -> int:
    """A finished command's outcome: its files kept (stamped; `beside`: the benchmarks that ran on the host's other
    GPUs meanwhile) and 0, or the stored file left as it was and 1 (failed) / 124 (stopped at its time)."""
    if code == 124 and finished(output):
        code = 0  # stopped at the time budget while exiting, its whole result published
    if code != 0:
        print(f"{bench.name}: failed (exit {code}){where}; the stored file is left as it was", flush=True)
        return 124 if code == 124 else 1
    wall = (time.monotonic() - started) / 60  # kept in the result: the next budget goes by it
    keep(output, bench, folder, measured, f"measured at {label(head)} in {wall:.1f} min{where}", wall, beside)
    return 0


def finished(output: Path) -> bool:
    """The command published its whole result at `output`: a run stopped before its end publishes none, or one that
    says it is incomplete (what it measured)."""
    from ltxbench.results.schema import incomplete

    document = _document(output)
    return bool(document.get("records")) and not incomplete(document)


def keep(output: Path, bench: Benchmark, folder: Path, measured: list, how: str, wall: float | None = None,
          beside: list[str] | None = None) -> None:
    """A finished benchmark's files, stamped, into `folder` (its name appended to `measured`)."""
    _stamp(output, bench, wall, beside)
    for produced in (output, output.with_suffix(".csv")):
        if produced.is_file():
            shutil.move(produced, folder / produced.name)
    measured.append(bench.name)
    print(f"{bench.name}: {how}", flush=True)


def _regenerate(folder: Path) -> None:
    code = subprocess.run([sys.executable, "-m", "ltxbench", "report", str(folder)]).returncode
    if code != 0:  # the results are in place; only their README waits
        print(f"the README was not regenerated (exit {code}): run `ltxbench report {folder}`", flush=True)


def show(folder: Path) -> int:
    """Each benchmark's state, then what making the folder current would take (the estimates' sum): a plan for runs
    of a few minutes each."""
    head, files = provenance_and_files()
    head = head or {}
    chosen = benchmarks_for(folder)
    due = []
    for bench in chosen:
        path = folder / f"{bench.name}.json"
        git = recorded_git(path)
        current = bool(head) and is_current(path, head, bench, files)
        state = ("missing" if not path.is_file() else current_label(path, head) if current
                 else f"measured at {label(git)}")
        minutes = expected_minutes(bench, path)
        print(f"{bench.name:45s} {bench.gpus} GPU(s) ~{minutes:g} min  {state}")
        if not current:
            due.append(minutes)
    print(f"{len(chosen) - len(due)} of {len(chosen)} current; the other {len(due)} take ~{sum(due):g} min")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltxbench.results.manifest", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    runs = sub.add_parser("run", help="re-measure the folder's benchmarks that are not current")
    runs.add_argument("folder", type=Path)
    runs.add_argument("--only", help="comma-separated benchmark names")
    runs.add_argument("--budget-minutes", type=float, help="start no benchmark that would end after this")
    runs.add_argument("--redo", action="store_true", help="re-measure current ones too")
    runs.add_argument("--allow-dirty", action="store_true", help="measure a tree with uncommitted changes")
    runs.add_argument("--devices", help="comma-separated GPU indices of this host: a one-GPU folder's benchmarks "
                      "spread over them, one at a time on each (default: the current GPU)")
    listing = sub.add_parser("list", help="each benchmark of the folder and its state")
    listing.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "list":
        return show(args.folder)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    devices = None
    if args.devices is not None:
        devices, problem = parse_devices(args.devices, host_gpus())
        if problem:
            print(f"error: --devices {args.devices!r}: {problem}", file=sys.stderr)
            return 2
    return run(args.folder, only, args.budget_minutes, args.redo, args.allow_dirty, devices=devices)




if __name__ == "__main__":
    sys.exit(main())
