"""`ltxbench env`: what this machine offers the kernels (GPUs, driver, toolkit, versions, kernel build).

Only typer and the standard library at top level: torch (pulled in by the probes) and rich load inside
the command, so `ltxbench --help` stays instant.
"""

from __future__ import annotations

import typer

EXAMPLES = "Examples:\n\n  ltxbench env\n\n  ltxbench env --json > env.json\n\n  ltxbench env --variables"


def env_command(
    json_: bool = typer.Option(
        False, "--json", help="Print {env, build} as JSON on stdout (parseable; for bug reports and CI)."
    ),
    variables: bool = typer.Option(
        False, "--variables", help="List every LTXBENCH_* environment variable, what it does and its value here."
    ),
) -> None:
    """Show GPUs, driver, CUDA toolkit, package versions and whether the CUDA kernels are built.

    Works without a GPU: missing pieces are reported, never fatal (exit code 0).
    """
    if variables:
        _print_variables()
        return
    from ltxbench.ops.build import build_status
    from ltxbench.results.env import capture_env

    env = capture_env()
    try:
        build = build_status()
    except Exception as exc:  # noqa: BLE001 - `env` is the diagnostic command; it must always answer
        build = {"built": False, "reason": f"{type(exc).__name__}: {exc}"}
    if json_:
        import json
        import sys

        # Plain stdout, not Rich: Rich would wrap long lines and break `ltxbench env --json > env.json`.
        sys.stdout.write(json.dumps({"env": env, "build": build}, indent=2, sort_keys=True, default=str))
        sys.stdout.write("\n")
        return
    _print_table(env, build)


def _fmt(value) -> str:
    return "—" if value is None or value == "" else str(value)


def _print_table(env: dict, build: dict) -> None:
    from rich.table import Table

    from ltxbench.cli._console import console

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")

    gpus = env.get("gpus") or []
    if gpus:
        for gpu in gpus:
            table.add_row(
                f"gpu {gpu.get('index')}",
                f"{gpu.get('name')}  sm_{str(gpu.get('capability', '')).replace('.', '')}  "
                f"{gpu.get('sm_count')} SMs  {gpu.get('memory_gib')} GiB",
            )
    else:
        table.add_row("gpu", env.get("cuda_note") or "no CUDA device")
    table.add_row("driver", _fmt(env.get("driver")))
    versions = env.get("versions") or {}
    for name in ("torch", "cuda", "cudnn", "triton", "diffusers", "transformers", "accelerate", "ltxbench"):
        table.add_row(name, _fmt(versions.get(name)))
    from ltxbench.results.env import ATTENTION_PACKAGES

    extra = [f"{name} {versions[name]}" for name in ATTENTION_PACKAGES if versions.get(name)]
    table.add_row("attention kernels", ", ".join(extra) or "torch's SDPA only (pip install fa3-fwd: docs/kernels.md)")
    nvcc = env.get("nvcc") or {}
    nvcc_text = f"{nvcc.get('version')} ({nvcc.get('path')})" if nvcc.get("path") else "not found"
    table.add_row("nvcc", nvcc_text)
    table.add_row("CUDA_HOME", _fmt(env.get("cuda_home")))

    from ltxbench.ops.build import describe

    table.add_row("kernels", describe(build))

    git = env.get("git")
    if isinstance(git, dict):
        from ltxbench.results.provenance import label

        git_text = f"{label(git)} (from {git.get('source')})"
    else:
        git_text = _fmt(git) if git else "not a git checkout"
    table.add_row("git", git_text)
    set_here = env.get("variables") or {}
    listed = ", ".join(f"{k}={v}" for k, v in set_here.items())
    table.add_row("LTXBENCH_*", listed or "none set (--variables lists them)")

    console().print(table)


def _print_variables() -> None:
    from rich.table import Table

    from ltxbench.cli._console import console
    from ltxbench.variables import VARIABLES, set_variables

    values = set_variables()
    table = Table("variable", "kind", "what it does", "here")
    for var in VARIABLES:
        table.add_row(var.name, var.kind, var.meaning, values.get(var.name, "—"))
    for name in sorted(set(values) - {v.name for v in VARIABLES}):
        table.add_row(name, "unknown", "not read by ltxbench (a typo?)", values[name])
    console().print(table)
