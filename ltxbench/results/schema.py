"""The result document: one JSON object per run, versioned so that `compare` can refuse what it cannot read.

    {schema, schema_version, kind, run: {argv, config, seed, started_at, finished_at}, env, build, records}

Each record is one measured quantity (e.g. the latency of one provider's kernel at one shape), carrying
summary statistics of its samples, never the raw samples themselves.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from ltxbench.errors import IncomparableResults

SCHEMA = "ltxbench.result"
SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = (1,)

STATS_KEYS = ("median", "p20", "p80", "min", "max", "n")
BETTER = ("lower", "higher")
RUN_KEYS = ("argv", "config", "seed", "started_at", "finished_at")
TOP_KEYS = ("schema", "schema_version", "kind", "run", "env", "build", "records")
RECORD_KEYS = ("name", "provider", "dtype", "params", "metric", "unit", "better", "stats")


def utc_now() -> str:
    """ISO-8601 UTC timestamp with an explicit offset, e.g. 2025-01-31T12:00:00.123456+00:00."""
    return datetime.now(UTC).isoformat()


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats_from_samples(samples: list[float]) -> dict:
    """Median, 20th/80th percentile, min, max and count of the samples."""
    values = [float(s) for s in samples]
    if not values:
        raise ValueError("stats_from_samples needs at least one sample")
    ordered = sorted(values)
    return {
        "median": _quantile(ordered, 0.5),
        "p20": _quantile(ordered, 0.2),
        "p80": _quantile(ordered, 0.8),
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def make_record(
    name: str,
    provider: str,
    dtype: str,
    params: dict,
    metric: str,
    unit: str,
    better: str,
    stats: dict,
    derived: dict | None = None,
    check: dict | None = None,
) -> dict:
    """One measurement; `better` says which direction is an improvement so `compare` can flag regressions."""
    if better not in BETTER:
        raise ValueError(f"better must be one of {BETTER}, got {better!r}")
    missing = [k for k in STATS_KEYS if k not in stats]
    if missing:
        raise ValueError(f"stats is missing {', '.join(missing)} (expected keys {', '.join(STATS_KEYS)})")
    if not isinstance(params, dict):
        raise ValueError(f"params must be a dict, got {type(params).__name__}")
    return {
        "name": name,
        "provider": provider,
        "dtype": dtype,
        "params": dict(params),
        "metric": metric,
        "unit": unit,
        "better": better,
        "stats": dict(stats),
        "derived": dict(derived) if derived else {},
        "check": dict(check) if check else None,
    }


OUT_OF_MEMORY = "out_of_memory"  # derived key of the record of a configuration that did not fit its memory budget
NO_STATS = {"median": None, "p20": None, "p80": None, "min": None, "max": None, "n": 0}  # nothing was measured


def out_of_memory_label(rec: dict) -> str | None:
    """'out of memory at 16 GiB' for the record of a configuration that did not fit its memory budget, else None."""
    failed = (rec.get("derived") or {}).get(OUT_OF_MEMORY)
    return None if failed is None else f"out of memory at {failed['budget_gib']:g} GiB"


INCOMPLETE = "incomplete"  # run.config key of a run cut short: {"reason", "measured", "not_measured"}


def incomplete(doc: dict) -> dict | None:
    """What a run cut short (Ctrl-C) says of itself, or None for a complete run."""
    config = doc.get("run", {}).get("config")
    return config.get(INCOMPLETE) if isinstance(config, dict) else None


def make_result(
    kind: str,
    argv: list[str],
    config: dict,
    seed: int | None,
    started_at: str,
    finished_at: str,
    records: list[dict],
    env: dict | None = None,
    build: dict | None = None,
) -> dict:
    """Assemble a full result document; env/build are captured now unless given (tests pass them in)."""
    if env is None:
        from ltxbench.results.env import capture_env

        env = capture_env()
    if build is None:
        from ltxbench.ops.build import build_status

        build = build_status()
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "run": {
            "argv": list(argv),
            "config": config,
            "seed": seed,
            "started_at": started_at,
            "finished_at": finished_at,
        },
        "env": env,
        "build": build,
        "records": list(records),
    }


def _bad(msg: str) -> IncomparableResults:
    hint = "the file was not written by this version of ltxbench, or was edited"
    return IncomparableResults(msg, hint=hint)


def validate(doc) -> dict:
    """Check that `doc` is a result document this version can read; return it unchanged."""
    if not isinstance(doc, dict):
        raise _bad(f"a result document must be a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise _bad(f"not an ltxbench result: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    version = doc.get("schema_version")
    # bool is an int subclass; True must not pass as version 1.
    if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise IncomparableResults(
            f"unsupported schema_version {version!r}; this ltxbench reads schema_version {SCHEMA_VERSION}",
            hint="re-run the benchmark with this ltxbench version, or use the ltxbench that wrote the file",
        )
    for key in TOP_KEYS:
        if key not in doc:
            raise _bad(f"result document is missing the key {key!r}")
    if not isinstance(doc["run"], dict):
        raise _bad("result key 'run' must be an object")
    for key in RUN_KEYS:
        if key not in doc["run"]:
            raise _bad(f"result document is missing the key 'run.{key}'")
    if not isinstance(doc["records"], list):
        raise _bad("result key 'records' must be a list")
    for i, rec in enumerate(doc["records"]):
        _validate_record(rec, i)
    return doc


def _validate_record(rec, i: int) -> None:
    if not isinstance(rec, dict):
        raise _bad(f"record {i} must be an object, got {type(rec).__name__}")
    for key in RECORD_KEYS:
        if key not in rec:
            raise _bad(f"record {i} is missing the key {key!r}")
    if rec["better"] not in BETTER:
        raise _bad(f"record {i} has better={rec['better']!r}, expected one of {BETTER}")
    if not isinstance(rec["params"], dict):
        raise _bad(f"record {i} key 'params' must be an object")
    if not isinstance(rec["stats"], dict):
        raise _bad(f"record {i} key 'stats' must be an object")
    for key in ("name", "provider", "dtype", "metric"):
        if not isinstance(rec[key], str):
            raise _bad(f"record {i} key {key!r} must be a string, got {type(rec[key]).__name__}")
    for key in STATS_KEYS:
        if key not in rec["stats"]:
            raise _bad(f"record {i} is missing the key 'stats.{key}'")
        value = rec["stats"][key]  # null: an n/a provider; NaN before writing (dumps writes it as null)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"record {i} has stats.{key} = {value!r}: expected a number or null")


# Parameters recorded since a release that added them, as their value then: a record without one measured that
# (files from before `--precision` ran bf16), so the two are the same measurement.
IMPLIED_PARAMS = {"precision": "bf16"}


def record_key(rec: dict) -> tuple:
    """Identity of a measurement across files: same kernel, provider, dtype, shape and metric (IMPLIED_PARAMS
    left out at their implied value)."""
    params = {k: v for k, v in (rec.get("params") or {}).items() if IMPLIED_PARAMS.get(k, object()) != v}
    params = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return (rec["name"], rec["provider"], rec["dtype"], params, rec["metric"])
