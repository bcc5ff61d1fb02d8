"""Compare two result documents record by record: regressions, improvements, added and removed measurements.

A record regresses only when its new median is worse than the base median by more than the threshold AND
lies outside the base's own p20–p80 spread, so run-to-run noise of a jittery kernel is not a regression.
Pure logic: no I/O, no printing; the CLI (ltxbench.cli.compare) renders the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ltxbench.errors import IncomparableResults, UsageError
from ltxbench.results.schema import record_key

DEFAULT_THRESHOLD = "5%"
# A changed record whose runs' median SM clocks (derived.gpu_sm_mhz_median, bench e2e's GPU monitor) differ by more
# than this gets a warning: a GPU at its power cap runs a denser step at a lower clock, and machines differ.
CLOCK_WARNING = 0.02


def parse_threshold(text: str) -> float:
    """'5%' or '0.05' -> 0.05; anything else (or a value outside [0, 1)) is a UsageError naming it."""
    raw = str(text).strip()
    hint = "write a percentage such as 5% or a fraction such as 0.05"
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"--threshold: {text!r} is not a number or percentage", hint=hint) from None
    if not math.isfinite(value) or not 0 <= value < 1:
        raise UsageError(f"--threshold: {text!r} must be between 0% and 100% (a fraction in [0, 1))", hint=hint)
    return value


def gpu_name(doc: dict) -> str:
    """Name of the first GPU in the document's env, or 'cpu' when it recorded none."""
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    gpus = env.get("gpus")
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return str(gpus[0]["name"])
    return "cpu"


def torch_version(doc: dict) -> str | None:
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    return versions.get("torch")


@dataclass
class Row:
    """One record present in both files, with its verdict."""

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
    change: float | None  # (new - base) / |base|; None when base is 0
    verdict: str  # "regression" | "improvement" | "noise" (beyond threshold, inside the base spread) | "unchanged"
    base_sm_mhz: float | None = None  # median SM clock of each run, where it was sampled
    new_sm_mhz: float | None = None

    def to_dict(self) -> dict:
        return {
            "name": self.name, "provider": self.provider, "dtype": self.dtype, "params": self.params,
            "metric": self.metric, "unit": self.unit, "better": self.better, "base_median": self.base,
            "new_median": self.new, "base_p20": self.base_p20, "base_p80": self.base_p80,
            "change_pct": None if self.change is None else self.change * 100, "verdict": self.verdict,
            "base_sm_mhz": self.base_sm_mhz, "new_sm_mhz": self.new_sm_mhz,
        }


@dataclass
class ComparisonReport:
    threshold: float
    base_env: dict
    new_env: dict
    regressions: list[Row] = field(default_factory=list)
    improvements: list[Row] = field(default_factory=list)
    noise: list[Row] = field(default_factory=list)
    unchanged: list[Row] = field(default_factory=list)
    added: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    allow_missing: bool = False

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
            "improvements": [r.to_dict() for r in self.improvements],
            "unchanged": self.unchanged_count,
            "within_noise": [r.to_dict() for r in self.noise],
            "added": self.added,
            "removed": self.removed,
            "skipped": self.skipped,
            "lost": len(self.lost),
            "allow_missing": self.allow_missing,
            "threshold": self.threshold,
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


def _num(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _verdict(better: str, base: float, new: float, p20: float | None, p80: float | None, t: float) -> str:
    up, down = new > base * (1 + t), new < base * (1 - t)
    # A missing spread bound (n=1 runs write them; hand-made files may not) does not shield the record.
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


def _check_env(base_doc: dict, new_doc: dict, allow_env_mismatch: bool, report: ComparisonReport) -> None:
    if base_doc["kind"] != new_doc["kind"]:
        raise IncomparableResults(
            f"cannot compare a {base_doc['kind']!r} result with a {new_doc['kind']!r} result",
            hint="compare two runs of the same benchmark kind (--allow-env-mismatch does not cover this)",
        )
    base_gpu, new_gpu = gpu_name(base_doc), gpu_name(new_doc)
    if base_gpu != new_gpu:
        msg = f"results come from different GPUs: base {base_gpu!r}, new {new_gpu!r}"
        if not allow_env_mismatch:
            raise IncomparableResults(msg, hint="compare runs from the same GPU, or pass --allow-env-mismatch")
        report.warnings.append(msg + " (compared anyway: --allow-env-mismatch)")
    base_torch, new_torch = torch_version(base_doc), torch_version(new_doc)
    if base_torch != new_torch:
        report.warnings.append(f"torch versions differ: base {base_torch}, new {new_torch}")


def _clock(rec: dict) -> float | None:
    derived = rec.get("derived") if isinstance(rec.get("derived"), dict) else {}
    return _num(derived.get("gpu_sm_mhz_median"))


def _warn_of_clock(row: Row, report: ComparisonReport) -> None:
    """A regression or improvement measured at clearly different SM clocks says so (the verdict stands)."""
    base, new = row.base_sm_mhz, row.new_sm_mhz
    if row.verdict not in ("regression", "improvement") or not base or new is None:
        return
    if abs(new - base) / base > CLOCK_WARNING:
        report.warnings.append(
            f"{row.name}/{row.provider}: the GPU's SM clock was {base:.0f} MHz in base and {new:.0f} MHz in new "
            f"({100 * (new - base) / base:+.1f}%): part of this {row.verdict} may be the clock, not the code")


def compare(base_doc: dict, new_doc: dict, threshold: float, allow_env_mismatch: bool = False,
            allow_missing: bool = False) -> ComparisonReport:
    """Match records by record_key and classify each; raises IncomparableResults on kind/GPU mismatch. A measurement
    the base has and new lacks (removed, or n/a in new only) fails the check unless allow_missing."""
    report = ComparisonReport(
        threshold=threshold, allow_missing=allow_missing,
        base_env={"kind": base_doc["kind"], "gpu": gpu_name(base_doc), "torch": torch_version(base_doc)},
        new_env={"kind": new_doc["kind"], "gpu": gpu_name(new_doc), "torch": torch_version(new_doc)},
    )
    _check_env(base_doc, new_doc, allow_env_mismatch, report)
    base, new = _index(base_doc, "base"), _index(new_doc, "new")
    report.removed = [_ident(base[k]) for k in sorted(base.keys() - new.keys())]
    report.added = [_ident(new[k]) for k in sorted(new.keys() - base.keys())]
    for key in sorted(base.keys() & new.keys()):
        b, n = base[key], new[key]
        bm, nm = _num(b["stats"].get("median")), _num(n["stats"].get("median"))
        if bm is None or nm is None:
            side = "base and new" if bm is None and nm is None else ("base" if bm is None else "new")
            report.skipped.append({**_ident(b), "side": side, "reason": f"no median in {side} (n/a provider)"})
            continue
        if b["better"] != n["better"]:
            report.warnings.append(f"{b['name']}/{b['provider']}: `better` changed; using the base's {b['better']!r}")
        p20, p80 = _num(b["stats"].get("p20")), _num(b["stats"].get("p80"))
        row = Row(b["name"], b["provider"], b["dtype"], b["params"], b["metric"], b.get("unit") or "", b["better"],
                  bm, nm, p20, p80, (nm - bm) / abs(bm) if bm else None, _verdict(b["better"], bm, nm, p20, p80,
                                                                                   threshold),
                  _clock(b), _clock(n))
        _warn_of_clock(row, report)
        {"regression": report.regressions, "improvement": report.improvements, "noise": report.noise,
         "unchanged": report.unchanged}[row.verdict].append(row)
    if report.skipped:
        report.warnings.append(f"{len(report.skipped)} record(s) skipped: no median (n/a provider)")
    return report
