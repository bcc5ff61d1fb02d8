"""Compare two result documents record by record: regressions, what is not comparable, improvements, and
measurements added or removed. Each row is judged by its metric's rule (docs/compare.md): sampled times by the
threshold AND the base's own p20-p80 spread (a jittery kernel's noise is no regression); single-sample figures
(compile time, first iteration, peak memory, energy) by a threshold of their own; compile time and first iteration
only between compiles in the same inductor cache state (a warm compile takes a fraction of a cold one's time).
Pure logic: no I/O, no printing; the CLI (ltxbench.cli.compare) parses thresholds and renders the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ltxbench.errors import IncomparableResults
from ltxbench.results import comparable
from ltxbench.results.comparable import gpu_name, torch_version
from ltxbench.results.schema import record_key

# Per metric; docs/compare.md gives the reasons. A bare --threshold value sets "time".
DEFAULT_THRESHOLDS = {"time": 0.05, "compile": 0.25, "first_iteration": 0.25, "peak_memory": 0.02, "energy": 0.15,
                      "cosine_vs_bf16": 0.25}
# Their rows depend on inductor's on-disk cache: compared only between compiles in the same cache state.
CACHE_DEPENDENT = ("compile", "first_iteration")
# Single-sample figures a record carries in `derived`, compared as rows of their own, taken from one record per
# configuration: (record name, derived key, metric, unit, scale).
DERIVED_METRICS = (
    ("compile", "first_iteration_ms", "first_iteration", "ms", 1.0),
    *((name, "peak_memory_bytes", "peak_memory", "GiB", 2.0 ** -30) for name in ("total", "generate")),
    *((name, "gpu_energy_j_per_iteration", "energy", "J", 1.0) for name in ("total", "generate")),
)
# A changed record whose runs' median SM clocks (derived.gpu_sm_mhz_median, bench e2e's GPU monitor) differ by more
# than this gets a warning: a GPU at its power cap runs a denser step at a lower clock, and machines differ.
CLOCK_WARNING = 0.02
# verdict -> the report's list of its rows, in the order the report shows them
BUCKETS = {"regression": "regressions", "not comparable": "not_comparable", "improvement": "improvements",
           "noise": "noise", "unchanged": "unchanged"}


def inductor_cache_state(rec: dict) -> str:
    """cold (no FX-graph cache hit), warm (hits only), partly warm, or unknown (no counts: files written before they
    were recorded, or a compile that never consulted the cache)."""
    derived = _derived(rec)
    hits, misses = _num(derived.get("inductor_fxgraph_cache_hit")), _num(derived.get("inductor_fxgraph_cache_miss"))
    if hits is None or misses is None or hits + misses == 0:
        return "unknown"
    return "cold" if hits == 0 else ("warm" if misses == 0 else "partly warm")


@dataclass
class Row:
    """One measurement present in both files, with its verdict and the rule that decided it."""

    name: str
    provider: str
    dtype: str
    params: dict
    metric: str
    unit: str
    better: str
    base: float
    new: float
    base_p20: float | None
    base_p80: float | None
    verdict: str  # a key of BUCKETS; "noise": beyond the threshold, inside the base's spread
    rule: str  # e.g. "5% + base p20-p80", "single sample, 25%", "not comparable: inductor cache cold vs warm"
    base_sm_mhz: float | None = None  # median SM clock of each run, where it was sampled
    new_sm_mhz: float | None = None

    @property
    def change(self) -> float | None:
        """(new - base) / |base|; None when base is 0."""
        return (self.new - self.base) / abs(self.base) if self.base else None

    def to_dict(self) -> dict:
        return {
            "name": self.name, "provider": self.provider, "dtype": self.dtype, "params": self.params,
            "metric": self.metric, "unit": self.unit, "better": self.better, "base_median": self.base,
            "new_median": self.new, "base_p20": self.base_p20, "base_p80": self.base_p80,
            "change_pct": None if self.change is None else self.change * 100, "verdict": self.verdict,
            "rule": self.rule, "base_sm_mhz": self.base_sm_mhz, "new_sm_mhz": self.new_sm_mhz,
        }


@dataclass
class ComparisonReport:
    thresholds: dict
    base_env: dict
    new_env: dict
    regressions: list[Row] = field(default_factory=list)
    not_comparable: list[Row] = field(default_factory=list)
    improvements: list[Row] = field(default_factory=list)
    noise: list[Row] = field(default_factory=list)
    unchanged: list[Row] = field(default_factory=list)
    added: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    allow_missing: bool = False

    def add(self, row: Row) -> None:
        getattr(self, BUCKETS[row.verdict]).append(row)

    def ordered(self) -> list[Row]:
        """Regressions first, then what is not comparable, improvements, within noise, unchanged."""
        return [row for verdict in BUCKETS.values() for row in getattr(self, verdict)]

    @property
    def threshold(self) -> float:
        """The sampled figures' threshold (the bare --threshold)."""
        return self.thresholds["time"]

    @property
    def lost(self) -> list[dict]:
        """Measurements the base has and the new file lacks: removed, or n/a in new only."""
        return self.removed + [s for s in self.skipped if s.get("side") == "new"]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions or (self.lost and not self.allow_missing) else 0

    @property
    def unchanged_count(self) -> int:
        return len(self.unchanged) + len(self.noise)

    def to_dict(self) -> dict:
        return {
            "regressions": [r.to_dict() for r in self.regressions],
            "not_comparable": [r.to_dict() for r in self.not_comparable],
            "improvements": [r.to_dict() for r in self.improvements],
            "unchanged": self.unchanged_count,
            "within_noise": [r.to_dict() for r in self.noise],
            "added": self.added,
            "removed": self.removed,
            "skipped": self.skipped,
            "lost": len(self.lost),
            "allow_missing": self.allow_missing,
            "threshold": self.threshold,
            "thresholds": self.thresholds,
            "warnings": self.warnings,
            "env": {"base": self.base_env, "new": self.new_env},
            "exit_code": self.exit_code,
        }


def _ident(rec: dict) -> dict:
    return {k: rec[k] for k in ("name", "provider", "dtype", "params", "metric")}


def _index(doc: dict, which: str) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for rec in doc["records"]:
        key = record_key(rec)
        if key in out:
            raise IncomparableResults(
                f"{which} result has two records for {rec['name']}/{rec['provider']}/{rec['dtype']} "
                f"{key[3]} {rec['metric']}; cannot tell which to compare",
                hint="the file was not written by ltxbench, or was edited",
            )
        out[key] = rec
    return out


PROFILE_KERNEL = "kernel:"  # profile records of one kernel among the top N (bench.profile); the rest are families


def _num(value) -> float | None:
    """A number as a finite float; None for anything else (an integer past float's range: an edited file)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _derived(rec: dict) -> dict:
    return rec.get("derived") if isinstance(rec.get("derived"), dict) else {}


def metric_class(rec: dict) -> str:
    """Which threshold judges a record: compile for bench e2e's compile records, else its metric's where it has one
    (generate's peak_memory record), else time (every sampled figure)."""
    if rec["name"] == "compile":
        return "compile"
    return rec["metric"] if rec["metric"] in DEFAULT_THRESHOLDS else "time"


def _verdict(better: str, base: float, new: float, p20: float | None, p80: float | None, t: float) -> str:
    up, down = new > base * (1 + t), new < base * (1 - t)
    # A missing spread bound (single-sample rules; hand-made files) does not shield the record.
    above = p80 is None or new > p80
    below = p20 is None or new < p20
    if better == "lower":
        worse, nicer = (up, above), (down, below)
    else:
        worse, nicer = (down, below), (up, above)
    if worse[0]:
        return "regression" if worse[1] else "noise"
    if nicer[0]:
        return "improvement" if nicer[1] else "noise"
    return "unchanged"


def _judge(cls: str, b: dict, n: dict, better: str, base: float, new: float, p20, p80, t: float) -> tuple[str, str]:
    """(verdict, rule) of one row of metric class `cls`; b and n are the records it comes from."""
    if cls in CACHE_DEPENDENT:
        states = inductor_cache_state(b), inductor_cache_state(n)
        if "unknown" in states:
            side = " and ".join(which for which, state in zip(("base", "new"), states, strict=True)
                                if state == "unknown")
            return "not comparable", f"not comparable: inductor cache state not recorded in {side}"
        if states[0] != states[1]:
            return "not comparable", f"not comparable: inductor cache {states[0]} vs {states[1]}"
    if cls == "time":
        return _verdict(better, base, new, p20, p80, t), f"{t * 100:g}% + base p20-p80"
    if cls == "cosine_vs_bf16":  # FP8's error: judged on 1 - cosine (a cosine moves by 1e-4 where the error doubles)
        rule = f"1 - cosine, {t * 100:g}%; the run's own gate"
        if (n.get("check") or {}).get("passed") is False:
            return "regression", rule
        return _verdict("lower", 1.0 - base, 1.0 - new, None, None, t), rule
    return _verdict(better, base, new, None, None, t), f"single sample, {t * 100:g}%"


def _warn_of_clock(row: Row, report: ComparisonReport) -> None:
    """A regression or improvement measured at clearly different SM clocks says so (the verdict stands)."""
    base, new = row.base_sm_mhz, row.new_sm_mhz
    if row.verdict not in ("regression", "improvement") or not base or new is None:
        return
    if abs(new - base) / base > CLOCK_WARNING:
        report.warnings.append(
            f"{row.name}/{row.provider}: the GPU's SM clock was {base:.0f} MHz in base and {new:.0f} MHz in new "
            f"({100 * (new - base) / base:+.1f}%): part of this {row.verdict} may be the clock, not the code")


def _worse_spread(row: Row) -> float:
    """How far the base's p20-p80 spread reaches on the worse side of its median, as a fraction of it."""
    edge = row.base_p80 if row.better == "lower" else row.base_p20
    return 0.0 if edge is None or not row.base else abs(edge - row.base) / abs(row.base)


def _warn_of_wide_spreads(report: ComparisonReport) -> None:
    """A base whose own spread exceeds the threshold hides a slowdown of that size: say so, so that it is re-run."""
    wide = [r for r in report.ordered() if r.rule.endswith("base p20-p80") and _worse_spread(r) > report.threshold]
    if wide:
        w = max(wide, key=_worse_spread)
        report.warnings.append(
            f"{len(wide)} record(s) of base have a p20-p80 spread wider than the {report.threshold * 100:g}% threshold "
            f"(widest: {w.name}/{w.provider} {w.metric}, {_worse_spread(w) * 100:.1f}% from its median): a change "
            "within it passes as noise; a quieter base run would catch it")


def _rows_of(b: dict, n: dict, thresholds: Mapping[str, float], report: ComparisonReport) -> list[Row]:
    """The record's own row (its median), then one per single-sample figure in its `derived` (DERIVED_METRICS)."""
    clocks = _num(_derived(b).get("gpu_sm_mhz_median")), _num(_derived(n).get("gpu_sm_mhz_median"))
    ident = {"name": b["name"], "provider": b["provider"], "dtype": b["dtype"], "params": b["params"]}
    if b["better"] != n["better"]:
        report.warnings.append(f"{b['name']}/{b['provider']}: `better` changed; using the base's {b['better']!r}")
    cls = metric_class(b)
    base, new = _num(b["stats"]["median"]), _num(n["stats"]["median"])
    p20, p80 = _num(b["stats"].get("p20")), _num(b["stats"].get("p80"))
    verdict, rule = _judge(cls, b, n, b["better"], base, new, p20, p80, thresholds[cls])
    rows = [Row(**ident, metric=b["metric"], unit=b.get("unit") or "", better=b["better"], base=base, new=new,
                base_p20=p20, base_p80=p80, verdict=verdict, rule=rule, base_sm_mhz=clocks[0], new_sm_mhz=clocks[1])]
    for record_name, key, metric, unit, scale in DERIVED_METRICS:
        if b["name"] != record_name or _num(_derived(b).get(key)) is None:
            continue
        base, new = _num(_derived(b)[key]), _num(_derived(n).get(key))
        if new is None:
            report.warnings.append(f"{b['name']}/{b['provider']}: {metric} is in base only (not compared)")
            continue
        base, new = base * scale, new * scale
        verdict, rule = _judge(metric, b, n, "lower", base, new, None, None, thresholds[metric])
        rows.append(Row(**ident, metric=metric, unit=unit, better="lower", base=base, new=new, base_p20=None,
                        base_p80=None, verdict=verdict, rule=rule, base_sm_mhz=clocks[0], new_sm_mhz=clocks[1]))
    return rows


def compare(base_doc: dict, new_doc: dict, thresholds: float | Mapping[str, float] | None = None,
            allow_env_mismatch: bool = False, allow_missing: bool = False) -> ComparisonReport:
    """Match records by record_key and judge each (thresholds: per metric, defaults DEFAULT_THRESHOLDS; a float sets
    the sampled times' one); raises IncomparableResults where comparable.check finds the runs incomparable. A
    measurement the base has and new lacks (removed, or n/a in new only) fails the check unless allow_missing."""
    limits = dict(DEFAULT_THRESHOLDS)
    if isinstance(thresholds, Mapping):
        limits.update(thresholds)
    elif thresholds is not None:
        limits["time"] = float(thresholds)
    report = ComparisonReport(
        thresholds=limits, allow_missing=allow_missing,
        base_env={"kind": base_doc["kind"], "gpu": gpu_name(base_doc), "torch": torch_version(base_doc)},
        new_env={"kind": new_doc["kind"], "gpu": gpu_name(new_doc), "torch": torch_version(new_doc)},
    )
    comparable.check(base_doc, new_doc, allow_env_mismatch, report.warnings)
    base, new = _index(base_doc, "base"), _index(new_doc, "new")
    if base_doc["kind"] == "profile":  # its top-N kernels: a list whose members change with ties near the cut
        listed = {k for k in base.keys() | new.keys() if k[0].startswith(PROFILE_KERNEL)}
        base, new = ({k: v for k, v in d.items() if k not in listed} for d in (base, new))
        if listed:
            report.warnings.append(f"{len(listed)} top-kernel record(s) listed by the profiles, not judged: the "
                                   "kernel families are")
    report.removed = [_ident(base[k]) for k in sorted(base.keys() - new.keys())]
    report.added = [_ident(new[k]) for k in sorted(new.keys() - base.keys())]
    for key in sorted(base.keys() & new.keys()):
        b, n = base[key], new[key]
        bm, nm = _num(b["stats"].get("median")), _num(n["stats"].get("median"))
        if bm is None or nm is None:
            side = "base and new" if bm is None and nm is None else ("base" if bm is None else "new")
            report.skipped.append({**_ident(b), "side": side, "reason": f"no median in {side} (n/a provider)"})
            continue
        for row in _rows_of(b, n, limits, report):
            _warn_of_clock(row, report)
            report.add(row)
    _warn_of_wide_spreads(report)
    if report.skipped:
        report.warnings.append(f"{len(report.skipped)} record(s) skipped: no median (n/a provider)")
    return report
