"""`ltxbench kernels`: the ops, their formulas and dtypes, the archs the sources target, the build status."""

from __future__ import annotations

import json

import typer

EXAMPLES = "Examples:\n\n  ltxbench kernels\n\n  ltxbench kernels --json | jq '.kernels[].name'"

# Compile-checked in CI; bf16 kernels are stubs below sm_80 and refused there at the call.
SUPPORTED_ARCHS = ("7.5", "8.0", "8.6", "8.9", "9.0")


def kernels_command(
    json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the ltxbench kernels, their formulas, dtypes and the build status (never compiles)."""
    from ltxbench.ops.build import build_status
    from ltxbench.ops.registry import SPECS

    kernels = [{"name": s.name, "aliases": list(s.aliases), "formula": s.summary, "dtypes": list(s.dtypes),
                "variants": list(s.variants), "replaces": list(s.inject_targets),
                "max_width": dict(s.max_width)} for s in SPECS.values()]
    doc = {"kernels": kernels, "archs": list(SUPPORTED_ARCHS), "build": build_status()}
    if json_:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        return

    from rich.table import Table

    from ltxbench.cli._console import console
    from ltxbench.ops.build import describe

    table = Table(title="ltxbench kernels (torch.ops.ltxbench)")
    table.add_column("op", no_wrap=True)  # names whole: they are what the user types
    for col in ("formula", "dtypes", "aliases", "replaces"):
        table.add_column(col, overflow="fold")
    for k in kernels:
        table.add_row(k["name"], k["formula"], ",".join(k["dtypes"]), ", ".join(k["aliases"]),
                      "; ".join(k["replaces"]))
    out = console()
    out.print(table)
    out.print(f"archs: {', '.join(SUPPORTED_ARCHS)} (bf16 needs 8.0+) · build: {describe(doc['build'])}", markup=False)
