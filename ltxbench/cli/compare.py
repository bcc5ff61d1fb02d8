"""`ltxbench compare`: flag regressions between two result files (human table, JSON, or Markdown for CI).

Only typer and the standard library at top level; rich and the result modules load inside the command.
"""

from __future__ import annotations

import typer

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench compare results/h100/micro-base.json results/runs/micro-new.json\n\n"
    "  ltxbench compare base.json new.json --threshold 3%\n\n"
    "  ltxbench compare base.json new.json --format markdown >> $GITHUB_STEP_SUMMARY\n\n"
    "  ltxbench compare base.json new.json --format json | jq '.regressions[].name'\n\n"
    "Exit codes: 0 no regression, 1 regression (or a measurement of BASE missing or n/a in NEW, unless "
    "--allow-missing), 2 bad arguments, "
    "3 files unreadable, different schema, kind or GPU (see --allow-env-mismatch)."
)

FORMATS = ("human", "json", "markdown")


def compare_command(
    base: str = typer.Argument(..., metavar="BASE.json", help="Baseline result file."),
    new: str = typer.Argument(..., metavar="NEW.json", help="New result file, judged against the baseline."),
    threshold: str = typer.Option(
        "5%", "--threshold", "-t", help="Smallest change that counts, as 5% or 0.05 (and the new median must also "
        "lie outside the baseline's p20-p80 spread)."),
    format_: str = typer.Option("human", "--format", "-f", help="human (table), json, or markdown (for CI comments)."),
    allow_env_mismatch: bool = typer.Option(
        False, "--allow-env-mismatch", help="Compare results from different GPUs (a different kind is never "
        "comparable)."),
    allow_missing: bool = typer.Option(
        False, "--allow-missing", help="Pass although measurements of BASE are missing or n/a in NEW (listed)."),
) -> None:
    """Compare two result files record by record; exit 1 if any measurement regressed.

    Records are matched by kernel, provider, dtype, parameters and metric; records in only one file are
    listed as added/removed, and n/a records (no median) are skipped with a note. A measurement the base has and
    the new file lacks fails the check (exit 1) unless --allow-missing: a benchmark that stopped running is not a pass.
    """
    from ltxbench.errors import RegressionDetected, UsageError
    from ltxbench.results.compare import compare, parse_threshold
    from ltxbench.results.io import load_result

    if format_ not in FORMATS:
        raise UsageError(f"--format: unknown format {format_!r}; choose from {', '.join(FORMATS)}")
    t = parse_threshold(threshold)
    report = compare(load_result(base), load_result(new), t, allow_env_mismatch, allow_missing)
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
        raise RegressionDetected(f"{len(report.regressions)} record(s) regressed by more than {threshold}",
                                 hint=None)
    if report.exit_code:
        raise RegressionDetected(f"{len(report.lost)} measurement(s) of {base} missing or n/a in {new}",
                                 hint="pass --allow-missing if they were dropped on purpose")


def fmt_params(params: dict) -> str:
    def value(v):
        return "x".join(str(x) for x in v) if isinstance(v, list | tuple) else str(v)

    return " ".join(f"{k}={value(v)}" for k, v in sorted(params.items())) or "-"


def _num(x: float) -> str:
    return f"{x:.4g}"


def _change(row) -> str:
    return "n/a" if row.change is None else f"{row.change * 100:+.1f}%"


def _summary(report) -> str:
    parts = [f"{len(report.regressions)} regression(s)", f"{len(report.improvements)} improvement(s)",
             f"{report.unchanged_count} unchanged"]
    if report.noise:
        parts[-1] += f" ({len(report.noise)} beyond threshold but inside the base's p20-p80 spread)"
    parts += [f"{len(report.added)} added", f"{len(report.removed)} removed", f"{len(report.skipped)} skipped"]
    return ", ".join(parts) + f" (threshold {report.threshold * 100:g}%)"


def _rows(report):
    return [*report.regressions, *report.improvements, *report.noise]


def _ident_text(rec: dict) -> str:
    return f"{rec['name']} {rec['provider']} {rec['dtype']} {fmt_params(rec['params'])} {rec['metric']}"


def _print_human(report, base: str, new: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out, err = Console(highlight=False), Console(stderr=True, highlight=False)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    rows = _rows(report)
    if rows:
        table = Table(title=f"{base} -> {new}")
        for col in ("name", "provider", "dtype", "params", "metric"):
            table.add_column(col, overflow="fold")
        for col in ("base median", "new median", "change"):
            table.add_column(col, justify="right")
        table.add_column("verdict")
        style = {"regression": "bold red", "improvement": "green", "noise": "dim"}
        for r in rows:
            table.add_row(r.name, r.provider, r.dtype, fmt_params(r.params), r.metric, f"{_num(r.base)} {r.unit}",
                          f"{_num(r.new)} {r.unit}", _change(r), f"[{style[r.verdict]}]{r.verdict}[/]")
        out.print(table)
    for label, recs in (("added", report.added), ("removed", report.removed)):
        for rec in recs:
            out.print(f"{label}: {escape(_ident_text(rec))}")
    out.print(_summary(report), markup=False)


def render_markdown(report, base: str, new: str) -> str:
    """A GitHub-flavoured Markdown block: warnings, a table of changed records, added/removed, summary."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    icon = {"regression": ":red_circle: regression", "improvement": ":green_circle: improvement",
            "noise": "within noise"}
    lines = [f"### ltxbench compare: `{cell(base)}` → `{cell(new)}`", ""]
    for warning in report.warnings:
        lines += [f"> **warning:** {cell(warning)}", ""]
    rows = _rows(report)
    if rows:
        lines += ["| name | provider | dtype | params | metric | base median | new median | change | verdict |",
                  "|---|---|---|---|---|---:|---:|---:|---|"]
        for r in rows:
            lines.append("| " + " | ".join(cell(c) for c in (
                r.name, r.provider, r.dtype, fmt_params(r.params), r.metric, f"{_num(r.base)} {r.unit}",
                f"{_num(r.new)} {r.unit}", _change(r), icon[r.verdict])) + " |")
        lines.append("")
    for label, recs in (("Added", report.added), ("Removed", report.removed)):
        if recs:
            lines.append(f"**{label}:** " + "; ".join(f"`{cell(_ident_text(rec))}`" for rec in recs))
            lines.append("")
    lines.append(f"**Summary:** {_summary(report)}")
    return "\n".join(lines) + "\n"
