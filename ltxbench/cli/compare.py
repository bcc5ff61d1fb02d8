"""`ltxbench compare`: flag regressions between two result files (human table, JSON, or Markdown for CI).

Only typer and the standard library at top level; rich and the result modules load inside the command.
"""

from __future__ import annotations

from typing import Annotated

import typer

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench compare results/h100/micro-base.json results/runs/micro-new.json\n\n"
    "  ltxbench compare base.json new.json --threshold 3% --threshold compile=40%\n\n"
    "  ltxbench compare base.json new.json --format markdown >> $GITHUB_STEP_SUMMARY\n\n"
    "  ltxbench compare base.json new.json --format json | jq '.regressions[].name'\n\n"
    "Exit codes: 0 no regression, 1 regression (or a measurement of BASE missing or n/a in NEW, unless "
    "--allow-missing), 2 bad arguments, "
    "3 files unreadable, different schema, kind, workload (model, shape settings, --precision, --dtype), GPU (see "
    "--allow-env-mismatch) or GPU count and split (--gpus, --parallel). Rows that are not comparable "
    "(compiles in different inductor cache states) are listed and do not count. How verdicts are decided: "
    "docs/compare.md."
)

FORMATS = ("human", "json", "markdown")
STYLE = {"regression": "bold red", "not comparable": "yellow", "improvement": "green", "noise": "dim",
         "unchanged": "dim"}
VERDICT_TEXT = {"noise": "within noise"}  # beyond the threshold, inside the base's p20-p80


def compare_command(
    base: str = typer.Argument(..., metavar="BASE.json", help="Baseline result file."),
    new: str = typer.Argument(..., metavar="NEW.json", help="New result file, judged against the baseline."),
    threshold: Annotated[list[str] | None, typer.Option(
        "--threshold", "-t", help="Smallest change that counts. A bare value (5% or 0.05; default 5%) is the sampled "
        "times' threshold, and their new median must also lie outside the baseline's p20-p80 spread; METRIC=VALUE "
        "sets a single-sample metric's: compile (default 25%), first_iteration (25%), peak_memory (2%), energy "
        "(15%). Repeatable.")] = None,
    format_: str = typer.Option("human", "--format", "-f", help="human (table), json, or markdown (for CI comments)."),
    allow_env_mismatch: bool = typer.Option(
        False, "--allow-env-mismatch", help="Compare results from different GPUs (a different kind is never "
        "comparable)."),
    allow_missing: bool = typer.Option(
        False, "--allow-missing", help="Pass although measurements of BASE are missing or n/a in NEW (listed)."),
) -> None:
    """Compare two result files record by record; exit 1 if any measurement regressed.

    Records are matched by kernel, provider, dtype, parameters and metric; each row says which rule decided its
    verdict. Records in only one file are listed as added/removed, and n/a records (no median) are skipped with a
    note. A measurement the base has and the new file lacks fails the check (exit 1) unless --allow-missing: a
    benchmark that stopped running is not a pass.
    """
    from ltxbench.errors import RegressionDetected, UsageError
    from ltxbench.results.compare import compare
    from ltxbench.results.io import load_result

    if format_ not in FORMATS:
        raise UsageError(f"--format: unknown format {format_!r}; choose from {', '.join(FORMATS)}")
    thresholds = parse_thresholds(threshold)
    report = compare(load_result(base), load_result(new), thresholds, allow_env_mismatch, allow_missing)
    if format_ == "json":
        import json
        import sys

        sys.stdout.write(json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str) + "\n")
    elif format_ == "markdown":
        import sys

        sys.stdout.write(render_markdown(report, base, new))
    else:
        _print_human(report, base, new)
    if report.regressions:
        raise RegressionDetected(f"{len(report.regressions)} measurement(s) regressed (each row names its rule)",
                                 hint=None)
    if report.exit_code:
        raise RegressionDetected(f"{len(report.lost)} measurement(s) of {base} missing or n/a in {new}",
                                 hint="pass --allow-missing if they were dropped on purpose")


def parse_threshold(text: str, flag: str = "--threshold") -> float:
    """'5%' or '0.05' -> 0.05; anything else (or a value outside [0, 1)) is a UsageError naming it."""
    import math

    from ltxbench.errors import UsageError

    raw = str(text).strip()
    hint = "write a percentage such as 5% or a fraction such as 0.05"
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a number or percentage", hint=hint) from None
    if not math.isfinite(value) or not 0 <= value < 1:
        raise UsageError(f"{flag}: {text!r} must be between 0% and 100% (a fraction in [0, 1))", hint=hint)
    return value


def parse_thresholds(entries: list[str] | None) -> dict[str, float]:
    """['3%', 'compile=40%'] -> the default thresholds with time 0.03 and compile 0.40; a bad entry is a UsageError
    naming it."""
    from ltxbench.errors import UsageError
    from ltxbench.results.compare import DEFAULT_THRESHOLDS

    out, given = dict(DEFAULT_THRESHOLDS), set()
    for entry in entries or ():
        metric, sep, value = str(entry).partition("=")
        metric = metric.strip() if sep else "time"
        if metric not in DEFAULT_THRESHOLDS:
            raise UsageError(f"--threshold: unknown metric {metric!r} in {entry!r}",
                             hint=f"choose from {', '.join(DEFAULT_THRESHOLDS)}, e.g. --threshold compile=40%")
        if metric in given:
            raise UsageError(f"--threshold: {metric} is given twice")
        given.add(metric)
        out[metric] = parse_threshold(value, f"--threshold {metric}") if sep else parse_threshold(entry)
    return out


def fmt_params(params: dict) -> str:
    def value(v):
        return "x".join(str(x) for x in v) if isinstance(v, list | tuple) else str(v)

    return " ".join(f"{k}={value(v)}" for k, v in sorted(params.items())) or "-"


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 1e4 else f"{x:.4g}"  # 12345 ms, not 1.234e+04


def _change(row) -> str:
    return "n/a" if row.change is None else f"{row.change * 100:+.1f}%"


def _thresholds_text(thresholds: dict) -> str:
    return ", ".join(f"{metric} {value * 100:g}%" + (" + base p20-p80" if metric == "time" else "")
                     for metric, value in thresholds.items())


def _summary(report) -> str:
    parts = [f"{len(report.regressions)} regression(s)", f"{len(report.improvements)} improvement(s)",
             f"{report.unchanged_count} unchanged"]
    if report.noise:
        parts[-1] += f" ({len(report.noise)} beyond threshold but inside the base's p20-p80 spread)"
    if report.not_comparable:
        parts.append(f"{len(report.not_comparable)} not comparable (not counted)")
    parts += [f"{len(report.added)} added", f"{len(report.removed)} removed", f"{len(report.skipped)} skipped"]
    return ", ".join(parts) + f" (thresholds: {_thresholds_text(report.thresholds)})"


def _common_params(rows) -> dict:
    """The parameters every row shares (bench e2e's run arguments): said once, so the table keeps the ones that
    tell rows apart."""
    if not rows:
        return {}
    return {k: v for k, v in rows[0].params.items() if all(r.params.get(k, object()) == v for r in rows[1:])}


def _own_params(row, common: dict) -> str:
    return fmt_params({k: v for k, v in row.params.items() if k not in common})


def _ident_text(rec: dict) -> str:
    return f"{rec['name']} {rec['provider']} {rec['dtype']} {fmt_params(rec['params'])} {rec['metric']}"


def _print_human(report, base: str, new: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table

    out, err = Console(highlight=False), Console(stderr=True, highlight=False, soft_wrap=True)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    rows = [*report.regressions, *report.not_comparable, *report.improvements, *report.noise]
    if rows:
        common = _common_params(rows)
        with_params = any(_own_params(r, common) != "-" for r in rows)
        table = Table(title=f"{base} -> {new}")
        for col in ("name", "provider", "dtype", *(("params",) if with_params else ()), "metric"):
            table.add_column(col, overflow="fold")
        for col in ("base", "new", "change"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("verdict", no_wrap=True)
        table.add_column("rule")
        for r in rows:
            table.add_row(r.name, r.provider, r.dtype, *((_own_params(r, common),) if with_params else ()), r.metric,
                          f"{_num(r.base)} {r.unit}", f"{_num(r.new)} {r.unit}", _change(r),
                          f"[{STYLE[r.verdict]}]{VERDICT_TEXT.get(r.verdict, r.verdict)}[/]", escape(r.rule))
        if not out.is_terminal:  # a CI log or a pipe: as wide as the table, one line per row, instead of 80 columns
            natural = Measurement.get(out, out.options.update(max_width=100_000), table).maximum
            out.width = max(out.width, natural)
        out.print(table)
        if common:
            out.print(f"params of every row: {fmt_params(common)}", markup=False, soft_wrap=True)
    for label, recs in (("added", report.added), ("removed", report.removed)):
        for rec in recs:
            out.print(f"{label}: {escape(_ident_text(rec))}")
    out.print(_summary(report), markup=False, soft_wrap=True)


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _markdown_table(rows, common: dict, last: str) -> list[str]:
    """A GitHub table of rows; `last`: the final column, verdict or rule."""
    with_params = any(_own_params(r, common) != "-" for r in rows)
    head = ["name", "provider", "dtype", *(["params"] if with_params else []), "metric", "base", "new", "change",
            last]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---:" if col in ("base", "new", "change") else "---" for col in head) + "|"]
    for r in rows:
        cells = [r.name, r.provider, r.dtype, *([_own_params(r, common)] if with_params else []), r.metric,
                 f"{_num(r.base)} {r.unit}", f"{_num(r.new)} {r.unit}", _change(r),
                 VERDICT_TEXT.get(r.verdict, r.verdict) if last == "verdict" else r.rule]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines + [""]


def render_markdown(report, base: str, new: str) -> str:
    """A GitHub-flavoured Markdown block that reads in seconds: the summary, warnings, the regressions, the rows that
    are not comparable and why, then everything else collapsed; added/removed last."""
    lines = [f"### ltxbench compare: `{_cell(base)}` → `{_cell(new)}`", "",
             f"**Summary:** {_summary(report)}", ""]
    for warning in report.warnings:
        lines += [f"> **warning:** {_cell(warning)}", ""]
    common = _common_params(report.ordered())
    if common:
        lines += [f"Parameters of every row: `{_cell(fmt_params(common))}`", ""]
    if report.regressions:
        lines += [f"#### :red_circle: {len(report.regressions)} regression(s)", "",
                  *_markdown_table(report.regressions, common, "rule")]
    if report.not_comparable:
        lines += [f"#### {len(report.not_comparable)} not comparable (not counted)", "",
                  *_markdown_table(report.not_comparable, common, "rule")]
    rest = [*report.improvements, *report.noise, *report.unchanged]
    if rest:
        counts = (f"{len(report.improvements)} improvement(s), {len(report.noise)} within noise, "
                  f"{len(report.unchanged)} unchanged")
        lines += [f"<details><summary>{counts}</summary>", "", *_markdown_table(rest, common, "verdict"),
                  "</details>", ""]
    for label, recs in (("Added", report.added), ("Removed", report.removed)):
        if recs:
            lines += [f"**{label}:** " + "; ".join(f"`{_cell(_ident_text(rec))}`" for rec in recs), ""]
    return "\n".join(lines)
