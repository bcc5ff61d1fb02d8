"""The `ltxbench` command line.

Every command lives in its own module, imported when that command runs (LazyGroup), and imports torch/diffusers
inside its function body, so that `ltxbench --help` never pays for them. The exit-code policy (ltxbench.errors) is
applied once, here, in `PolicyGroup.invoke`, which wraps every command and sub-command.
"""

from __future__ import annotations

import importlib
import os

import typer
from typer.core import TyperGroup

from ltxbench.errors import EnvironmentProblem, LtxbenchError


def _classify(exc: BaseException, command: str | None = None) -> LtxbenchError | None:
    """Map third-party failures that mean 'the machine cannot do this' onto exit code 4 (command: the top-level
    command that raised it, for a hint that names only options it has)."""
    name = type(exc).__name__
    text = str(exc)
    if name == "OutOfMemoryError" or "CUDA out of memory" in text:
        offload = "--cpu-offload, " if command == "generate" else ""
        return EnvironmentProblem(
            f"out of GPU memory: {text.splitlines()[0] if text else name}",
            hint=f"lower --num-frames/--height/--width/--batch-size, or try {offload}--memory-budget GIB (video "
                 "models: weights streamed, docs/memory.md) or a GPU with more memory",
        )
    if isinstance(exc, MemoryError) or name == "_ArrayMemoryError":  # numpy's, for an array past the host's memory
        return EnvironmentProblem(f"out of host memory: {text.splitlines()[0] if text else name}",
                                  hint="lower --num-frames/--height/--width/--batch-size/--steps")
    if isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in text:
        return EnvironmentProblem(f"out of host memory: {text.splitlines()[0]}",
                                  hint="lower --num-frames/--height/--width/--batch-size, or use --dtype bf16")
    if isinstance(exc, RuntimeError) and "no kernel image is available" in text:
        return EnvironmentProblem(
            "the CUDA kernels were not built for this GPU's architecture",
            hint="unset TORCH_CUDA_ARCH_LIST or add this GPU's arch to it, then retry",
        )
    return None


def _report(err: LtxbenchError) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"[bold red]error:[/] {escape(err.message)}", markup=True)  # messages may hold [brackets]
    if err.hint:
        console.print(f"[dim]hint:[/] {escape(err.hint)}", markup=True)


def _interrupted(what: str) -> None:
    import sys

    print(f"interrupted: {what}", file=sys.stderr, flush=True)


def _debug() -> bool:
    return os.environ.get("LTXBENCH_DEBUG") == "1"


def _print_traceback() -> None:
    """LTXBENCH_DEBUG=1: the traceback goes to stderr before the one-line report; the exit code stays the same."""
    import traceback

    traceback.print_exc()


# Each command's module, imported only when that command runs or a help page lists it (and each imports only typer
# and the standard library at top level): a run imports its own command's code and no other's, which is what its
# result records as executed (ltxbench.results.provenance.executed_modules), so editing one command leaves the
# stored results of the others current. {command: (module of ltxbench.cli, function)}, in help order.
COMMANDS = {"env": ("env", "env_command"), "kernels": ("kernels", "kernels_command"),
            "generate": ("generate", "generate_command"), "compare": ("compare", "compare_command"),
            "profile": ("profile", "profile_command"), "report": ("report", "report_command")}
BENCH_COMMANDS = {"micro": ("bench_micro", "micro_command"), "e2e": ("bench_e2e", "e2e_command")}


def _load_command(name: str, module_name: str, function: str):
    """The click command of `ltxbench.cli.<module_name>.<function>`, its module's EXAMPLES as the epilog."""
    module = importlib.import_module(f"ltxbench.cli.{module_name}")
    single = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
    single.command(name, epilog=module.EXAMPLES)(getattr(module, function))
    return typer.main.get_command(single)


class LazyGroup(TyperGroup):
    """A group whose commands (`lazy`: name -> (module, function)) are built on first use."""

    lazy: dict[str, tuple[str, str]] = {}

    def list_commands(self, ctx):
        return [*self.lazy, *(name for name in super().list_commands(ctx) if name not in self.lazy)]

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            self.commands[name] = _load_command(name, *self.lazy[name])
        return super().get_command(ctx, name)


class BenchGroup(LazyGroup):
    lazy = BENCH_COMMANDS


class PolicyGroup(LazyGroup):
    lazy = COMMANDS

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LtxbenchError as err:
            if _debug():
                _print_traceback()
            _report(err)
            raise typer.Exit(err.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            # Ctrl-C that the command did not turn into a partial result (bench e2e keeps the configurations
            # measured, and says so itself): one line, the shell's 130. A rank leaves it to the process that
            # launched the ranks, which gets the same Ctrl-C.
            from ltxbench.parallel import launch

            if not launch.under_launcher():
                _interrupted("nothing written")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - classification point of the policy
            mapped = _classify(exc, ctx.invoked_subcommand)
            if mapped is None:
                raise  # a bug: the full traceback, whatever LTXBENCH_DEBUG says
            if _debug():
                _print_traceback()
            _report(mapped)
            raise typer.Exit(mapped.exit_code) from None


EPILOG = (
    "Examples:\n\n"
    "  ltxbench env --json\n\n"
    "  ltxbench kernels\n\n"
    "  ltxbench bench micro rmsnorm --dtype bf16 --shapes ltx\n\n"
    "Exit codes: 0 ok, 1 regression/failed check, 2 usage, 3 incomparable inputs, 4 environment/build/OOM. "
    "Set LTXBENCH_DEBUG=1 for tracebacks."
)

app = typer.Typer(
    cls=PolicyGroup,
    name="ltxbench",
    help="Fused CUDA kernels for video diffusion (LTX-Video, LTX-2, Wan) and LLM inference, and the benchmarks "
    "that prove them.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    cls=BenchGroup,
    help="Benchmarks: micro (one kernel vs baselines) and e2e (whole models).",
    epilog=("Examples:\n\n  ltxbench bench micro rmsnorm --shapes seed\n\n"
            "  ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 --phase transformer"),
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(bench_app, name="bench")


def main() -> None:
    from ltxbench.parallel import launch

    if launch.under_launcher():
        launch.run_rank(app)  # the rank's process ends there
    else:
        app()
