"""Result files on disk: canonical JSON plus a flat CSV beside it, written atomically and never clobbered.

A result is only ever published complete (temp file, fsync, then link/rename), so a crash or a concurrent
run can never leave a half-written or overwritten file that a later `compare` would trust.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from ltxbench.errors import IncomparableResults, UsageError, output_problem
from ltxbench.results.schema import validate

DEFAULT_RUNS_DIR = "results/runs"


def _finite(obj):
    """Replace NaN/±inf with None: JSON has no such numbers and allow_nan=False would refuse them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def dumps(doc: dict) -> str:
    """Canonical JSON: sorted keys, 2-space indent, trailing newline, no NaN/inf."""
    try:
        return json.dumps(_finite(doc), sort_keys=True, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise ValueError(f"result document is not JSON-serialisable: {exc}") from exc


def default_path(kind: str, runs_dir: str | Path = DEFAULT_RUNS_DIR) -> Path:
    # The random suffix keeps two runs started in the same second apart; the no-clobber publish in
    # _publish is what actually guarantees it.
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path(runs_dir) / f"{kind}-{stamp}-{secrets.token_hex(2)}.json"


def result_paths(output: str | Path) -> tuple[Path, Path]:
    """(JSON, CSV) that write_result writes for --output: `.json` appended where the name lacks it, the CSV beside.
    The commands check these before they run anything."""
    if isinstance(output, str) and output.endswith(("/", os.sep)):  # Path() would drop the slash: ./name.json
        raise UsageError(f"--output {output} names a folder", hint=f"name the result file, e.g. {output}run.json")
    path = Path(output)
    if path.suffix.lower() != ".json":
        path = path.with_name(path.name + ".json")
    return path, path.with_suffix(".csv")


def _publish(text: str, final: Path, force: bool) -> None:
    """Write text to a temp file in final's directory, fsync it, then link (no clobber) or replace it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    umask = os.umask(0)  # mkstemp makes the file 0600; a result is shared like any file the user writes
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if force:
            os.replace(tmp, final)
        else:
            try:
                os.link(tmp, final)  # atomic and fails if final exists, even if created a moment ago
            except FileExistsError:
                raise UsageError(
                    f"{final} already exists; not overwriting it",
                    hint="pass --force to overwrite, or choose another --output",
                ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_result(
    doc: dict,
    output: str | Path | None = None,
    force: bool = False,
    runs_dir: str | Path = DEFAULT_RUNS_DIR,
) -> tuple[Path, Path]:
    """Validate and write `doc` as JSON plus CSV; return (json_path, csv_path)."""
    validate(doc)
    text = dumps(doc)  # serialise before touching the disk: a bad document leaves nothing behind
    csv_text = _csv_text(doc)
    path, csv_path = result_paths(default_path(doc["kind"], runs_dir) if output is None else output)
    if not force:
        for p in (path, csv_path):
            if p.exists():
                raise UsageError(
                    f"{p} already exists; not overwriting it",
                    hint="pass --force to overwrite, or choose another --output",
                )
    try:
        _publish(text, path, force)
    except OSError as exc:  # the folder was checked before the run; a mount can still fill up or turn read-only
        raise output_problem(path, exc) from exc
    # The CSV is derived from the JSON, so it may follow it: the JSON is the record of truth.
    try:
        _publish(csv_text, csv_path, force)
    except (OSError, UsageError) as exc:  # a JSON without its CSV is a partial result: take it back
        path.unlink(missing_ok=True)
        if isinstance(exc, UsageError):
            raise
        raise output_problem(csv_path, exc) from exc
    return path, csv_path


def load_result(path: str | Path) -> dict:
    """Read and validate a result file; anything unreadable is IncomparableResults (exit 3)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise IncomparableResults(f"cannot read result file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise IncomparableResults(f"{path} is not a result file (not UTF-8 text: {exc.reason} at byte {exc.start})",
                                  hint="compare takes the .json files that ltxbench writes") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise IncomparableResults(
            f"{path} is not valid JSON: {exc}", hint="was the file truncated or edited by hand?"
        ) from exc
    try:
        validate(doc)
    except IncomparableResults as err:
        raise IncomparableResults(f"{path}: {err.message}", hint=err.hint) from err
    for i, rec in enumerate(doc["records"]):  # ltxbench writes null, never NaN / Infinity (json reads both)
        bad = [k for k, v in rec["stats"].items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise IncomparableResults(f"{path}: record {i} has stats.{bad[0]} = {rec['stats'][bad[0]]}: expected a "
                                      "finite number or null", hint="was the file edited by hand?")
    return doc


def to_frame(doc: dict):
    """One row per record: identity columns, then stats.*, params.*, derived.*, check.* flattened."""
    import pandas as pd

    env = doc.get("env") or {}
    gpus = env.get("gpus") if isinstance(env, dict) else None
    gpu = gpus[0].get("name", "cpu") if isinstance(gpus, list) and gpus else "cpu"
    rows = []
    for rec in doc["records"]:
        row = {k: rec.get(k) for k in ("name", "provider", "dtype", "metric", "unit", "better")}
        # Empty/None nested objects would otherwise become a single opaque column.
        for key in ("stats", "params", "derived", "check"):
            if rec.get(key):
                row[key] = rec[key]
        rows.append(row)
    frame = pd.json_normalize(rows, sep=".") if rows else pd.DataFrame()
    frame.insert(0, "kind", doc["kind"])
    frame["gpu"] = gpu
    frame["started_at"] = doc["run"]["started_at"]
    identity = ["kind", "name", "provider", "dtype", "metric", "unit", "better"]
    ordered = [c for c in identity if c in frame.columns]
    for prefix in ("stats.", "params.", "derived.", "check."):
        ordered += sorted(c for c in frame.columns if c.startswith(prefix))
    ordered += [c for c in frame.columns if c not in ordered]
    return frame[ordered]


def _csv_text(doc: dict) -> str:
    return to_frame(doc).to_csv(index=False, lineterminator="\n")


def write_csv(doc: dict, path: str | Path) -> Path:
    """Write the flattened records of `doc` as CSV (overwrites; write_result is the no-clobber path)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_csv_text(doc), encoding="utf-8")
    return path
