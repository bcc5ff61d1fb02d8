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
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ltxbench.results.benchmarks import benchmarks_for, gpus_of
from ltxbench.results.commands import execute, host_gpus, parse_devices
from ltxbench.results.provenance import changed_since, label, provenance_and_files
from ltxbench.results.remeasure import (
    NO_BUDGET_S,
    current_label,
    due,
    expected_minutes,
    finished,
    fits,
    is_current,
    keep,
    pending_status,
    prepare,
    recorded_git,
    settle,
    time_left,
)
from ltxbench.results.spread import measure_spread


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
            logs = folder.parent / "runs" / "manifest-logs" / folder.name
            status = measure_spread(chosen, folder, work, head, files, redo, deadline, runner, measured, devices, logs)
        else:
            pinned = functools.partial(runner, device=devices[0]) if devices else runner
            status = _measure(chosen, folder, work, head, files, redo, deadline, pinned, measured)
    except KeyboardInterrupt:
        kept = f"kept {', '.join(measured)}" if measured else "no benchmark finished"
        print(f"interrupted: {kept}; what was running is left as it was stored; call again to resume", flush=True)
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
            code = runner(argv, output, left if left is not None else NO_BUDGET_S)
        except KeyboardInterrupt:
            if finished(output):  # stopped while exiting, its whole result published: keep it
                keep(output, bench, folder, measured, f"measured at {label(head)}, kept as the run was interrupted")
            raise
        status = settle(code, output, bench, folder, measured, head, started)
        if status:
            return status
    return pending_status(pending)


def _regenerate(folder: Path) -> None:
    code = subprocess.run([sys.executable, "-m", "ltxbench", "report", str(folder)]).returncode
    if code != 0:  # the results are in place; only their README waits
        print(f"the README was not regenerated (exit {code}): run `ltxbench report {folder}`", flush=True)


def show(folder: Path, plan_minutes: float | None = None) -> int:
    """Each benchmark's state, then what making the folder current would take (the estimates' sum); with
    `plan_minutes`, the benchmarks not current packed into commands of at most that many minutes (`plan`)."""
    head, files = provenance_and_files()
    head = head or {}
    chosen = benchmarks_for(folder)
    due_minutes: dict[str, float] = {}  # the benchmarks not current and their expected minutes
    never: set[str] = set()  # those of them never stored
    for bench in chosen:
        path = folder / f"{bench.name}.json"
        git = recorded_git(path)
        current = bool(head) and is_current(path, head, bench, files)
        state = ("missing" if not path.is_file() else current_label(path, head) if current
                 else f"measured at {label(git)}{_changes(git, files)}")
        minutes = expected_minutes(bench, path)
        print(f"{bench.name:45s} {bench.gpus} GPU(s) ~{minutes:g} min  {state}")
        if not current:
            due_minutes[bench.name] = minutes
            if not path.is_file():
                never.add(bench.name)
    known = {bench.name for bench in chosen}
    for extra in sorted(path.stem for path in folder.glob("*.json") if path.stem not in known):
        print(f"{extra:45s} stored, not a benchmark of the manifest: replace it in the docs, then remove it")
    stale = [m for name, m in due_minutes.items() if name not in never]
    missing = [due_minutes[name] for name in never]
    print(f"{len(chosen) - len(due_minutes)} of {len(chosen)} current; the other {len(due_minutes)} take "
          f"~{sum(due_minutes.values()):g} min "
          f"({len(stale)} stored, ~{sum(stale):g} min; {len(missing)} never stored, ~{sum(missing):g} min)")
    if plan_minutes is not None:
        commands, too_long = plan(due_minutes, plan_minutes)
        print(f"in commands of at most {plan_minutes:g} min (`make results GPU={folder.name} ONLY=...`):")
        for i, batch in enumerate(commands, 1):
            print(f"  {i}. ONLY={','.join(batch)}  (~{sum(due_minutes[n] for n in batch):g} min)")
        for name in too_long:
            print(f"  {name}: ~{due_minutes[name]:g} min, longer than one command: run it alone with a longer limit")
    return 0


def _changes(git: dict | None, files: dict | None, shown: int = 3) -> str:
    """'; since: cuda/gemv.cu, ... (+N)': what the run executed that differs at the checkout's commit (empty where
    that cannot be read: no git, or a result without the list of what it ran)."""
    changed = changed_since(git, files) if git and files else None
    if not changed:
        return ""
    more = f" (+{len(changed) - shown})" if len(changed) > shown else ""
    return f"; since: {', '.join(changed[:shown])}{more}"


def plan(minutes: dict[str, float], limit: float) -> tuple[list[list[str]], list[str]]:
    """Benchmarks (name -> expected minutes) packed into as few commands of at most `limit` minutes as first-fit
    decreasing finds (the longest first, each into the first command with room), and those longer than `limit`."""
    commands: list[list[str]] = []
    room: list[float] = []
    too_long = [name for name, m in minutes.items() if m > limit]
    for name in sorted((n for n in minutes if n not in too_long), key=lambda n: -minutes[n]):
        slot = next((i for i, left in enumerate(room) if minutes[name] <= left + 1e-9), None)
        if slot is None:
            commands.append([name])
            room.append(limit - minutes[name])
        else:
            commands[slot].append(name)
            room[slot] -= minutes[name]
    return commands, too_long


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
    listing.add_argument("--plan", type=float, metavar="MINUTES",
                         help="also pack the benchmarks not current into commands of at most MINUTES each")
    args = parser.parse_args(argv)
    if args.verb == "list":
        if args.plan is not None and not args.plan > 0:
            print(f"error: --plan {args.plan:g}: give the minutes one command may take (> 0)", file=sys.stderr)
            return 2
        return show(args.folder, args.plan)
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
