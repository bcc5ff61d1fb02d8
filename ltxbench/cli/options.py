"""Every command-line option of `generate`, `bench e2e` and `profile`, declared once, and the one rebuilder of a
command line from its values.

A command names the shared options it takes (COMMAND_OPTIONS); the model families add their own
(`ModelFamily.options`), so a new family's options reach the commands without an edit here. `takes_options`
gives a command function the typer signature of all of them; the function receives them as keyword arguments.
Only typer and the standard library at top level (the families' modules are standard library only at theirs).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Optional

import typer

from ltxbench.configurations import COMPILE_CACHES, COMPILE_MODES, COMPILE_SCOPES, MIN_MEMORY_BUDGET_GIB
from ltxbench.models.family import Option

_DEVICE = "bf16 | fp16 | fp32 (default: bf16 on cuda, fp32 on cpu)."
_CONFIGS = "Comma-separated: baseline, optimized, compile, optimized+compile, a model family's peer configurations " \
           "(LLMs: liger, liger+compile), or all; video models: <config>@fa3 for FlashAttention-3 in that one, " \
           "<config>@auto for the attention backends measured fastest at its shapes"

SHARED = {o.name: o for o in (
    Option("prompt", ("--prompt",), str, ..., "Text prompt.", ("generate",)),
    Option("negative_prompt", ("--negative-prompt",), str, None, "Negative prompt (used when guidance > 1).",
           ("generate",)),
    Option("model", ("--model",), str, "ltx-2b", "A preset ({presets}), a hub id or a local path."),
    Option("weights", ("--weights",), str, None, "pretrained | random (built from the package's configs; the "
           "default for the presets that have no pretrained weights)."),
    Option("configs", ("--configs",), str, None, _CONFIGS + " (default: the four ours and torch's).",
           ("bench e2e", "profile"), helps={"profile": _CONFIGS + " (default: baseline,optimized)."}),
    Option("use_optimized_kernels", ("--use-optimized-kernels/--no-optimized-kernels",), bool, None,
           "Select ONE configuration, as the original script did.", ("generate", "bench e2e"),
           defaults={"generate": True}, helps={"generate": "Inject ltxbench kernels into the model."}),
    Option("compile", ("--compile",), bool, False, "With/without --use-optimized-kernels: one configuration.",
           ("generate", "bench e2e"), helps={"generate": "torch.compile the transformer (step 0 includes it)."}),
    Option("compile_mode", ("--compile-mode",), str, "default", "torch.compile mode of the compile configurations: "
           "default, reduce-overhead (CUDA graphs: steadier steps with --gpus 4, docs/parallel.md; not LTX-2), "
           "max-autotune, max-autotune-no-cudagraphs.",
           ("bench e2e", "profile"), choices=COMPILE_MODES),
    Option("compile_scope", ("--compile-scope",), str, None, "What the compile configurations compile: model (the "
           "whole transformer / LLM) or regional (each repeated block on its own, diffusers' regional compilation: "
           "much shorter compiles of large models) (default: the model family's; LTX-2: regional, else model).",
           ("bench e2e", "profile"), choices=COMPILE_SCOPES),
    Option("compile_cache", ("--compile-cache",), str, "shared", "Inductor's on-disk cache for the compile configs: "
           "shared (the usual one; a compile may hit what an earlier run wrote) or cold (a fresh one for this run, "
           "removed afterwards: compile times comparable between runs).", ("bench e2e",), choices=COMPILE_CACHES),
    Option("gemm_search", ("--gemm-search/--no-gemm-search",), bool, False, "With our kernels: time cuBLASLt's "
           "algorithms for each projection shape on its first use (10-55 s in step 0 for LTX-2B on an H100, then ~6% "
           "less step time) and store them for this GPU model; off, the projections run stored choices (from bench "
           "e2e or an earlier --gemm-search), else cuBLASLt's heuristic pick, as torch.", ("generate",)),
    Option("cpu_offload", ("--cpu-offload",), bool, False, "enable_model_cpu_offload (after injection).",
           ("generate",)),
    Option("batch_size", ("--batch-size",), int, 1, "Videos per prompt (video models) / sequences (LLMs).",
           ("bench e2e", "profile")),
    Option("warmup", ("--warmup-iterations",), int, 2, "Untimed iterations per configuration.", ("bench e2e",)),
    Option("repeats", ("--repeats",), int, 3, "Timed iterations per configuration (median reported).",
           ("bench e2e",)),
    Option("rounds", ("--rounds",), int, 1, "Run the configurations this many times in alternating order (A B, B A, "
           "...) and pool the samples, so that drift during the run favours no configuration.", ("bench e2e",)),
    Option("top", ("--top",), int, 20, "Kernels listed (and recorded) per configuration.", ("profile",)),
    Option("device", ("--device",), str, "cuda", "cuda | cpu."),
    Option("gpus", ("--gpus",), int, 1, "GPUs of this host: N > 1 re-launches the command under torchrun, one "
           "process per GPU; only rank 0 prints and writes."),
    Option("parallel", ("--parallel",), str, None, "How N GPUs split the work: cfg (the guidance pair's halves on 2 "
           "GPUs), ulysses or ring (diffusers' context parallelism over the video tokens), cfg+ulysses or cfg+ring "
           "(both; 4+ GPUs), hybrid (LTX-2, 2 GPUs: the guidance pair as cfg, each batch-1 pass as ulysses). "
           "Default: cfg on 2 GPUs (LTX-2: hybrid), cfg+ulysses on 4 or more (even), else ulysses."),
    Option("memory_budget_gib", ("--memory-budget",), float, None, "GiB of GPU memory the run may use (LTX-Video, "
           "LTX-2, Wan; one GPU): the pipeline is built in host memory and what does not fit streams from pinned host "
           "memory, layer by layer, exactly (docs/memory.md); the plan is printed before the run.",
           bounds=(MIN_MEMORY_BUDGET_GIB, 4096)),
    Option("kernel_provider", ("--kernel-provider",), str, None, "cuda | reference (default: cuda on cuda, reference "
           "on cpu)."),
    Option("dtype", ("--dtype",), str, None, _DEVICE),
    Option("precision", ("--precision",), str, "bf16", "Our kernels' projections: bf16 (exact) or fp8 (e4m3 "
           "weights and per-token activations on FP8 tensor cores; Hopper or newer; LTX-Video, LTX-2); "
           "fp8-attention: fp8 and self-attention in FP8 on FlashAttention-3 or cuDNN (one GPU). "
           "bench e2e / "
           "profile: fp8 adds the optimized-fp8 and optimized-fp8+compile configurations beside the others, "
           "fp8-attention those and optimized-fp8-attention[+compile]."),  # checked per family (its precisions)
    Option("fp8_accumulation", ("--fp8-accumulation",), str, None, "The FP8 GEMMs' accumulation: fast (on the "
           "tensor cores alone, as torchao's FP8 inference; ~18% faster GEMMs) or fp32 (partial sums promoted to "
           "fp32). Default with --precision fp8 / fp8-attention: fast (docs/precision.md#accumulation)."),
    Option("seed", ("--seed",), int, 42, "Seed of weights, noise and token ids (the same for every configuration).",
           bounds=(-(2**63), 2**64 - 1)),  # what torch's generators take
    Option("output", ("--output", "-o"), str, None, "Result JSON (CSV beside it); default results/runs/.",
           defaults={"generate": "out.mp4"}, helps={"generate": "mp4 path; the result JSON goes beside it."}),
    Option("trace_dir", ("--trace-dir",), str, None, "Chrome traces (default: beside the result JSON).",
           ("profile",)),
    Option("plot", ("--plot",), str, None, "Also draw the per-configuration phase split to this file (.png, .svg or "
           ".pdf).", ("bench e2e",)),
    Option("force", ("--force",), bool, False, "Overwrite the outputs if they exist."),
)}


def declared(command: str) -> list[Option]:
    """The options of `command`: the shared ones, then every family's. A name two families declare is one option
    (the first declaration's flags and type); where their defaults differ, its command-line default is None, each
    family applying its own (ModelFamily.settings), and the help says which is whose."""
    import dataclasses

    from ltxbench.models import families

    found = {o.name: o for o in SHARED.values() if command in o.commands}
    defaults: dict[str, dict] = {}
    helps: dict[str, dict] = {}
    for family in families():
        for option in family.options:
            if command in option.commands:
                found.setdefault(option.name, option)
                defaults.setdefault(option.name, {})[family.title] = option.default_for(command)
                helps.setdefault(option.name, {})[family.title] = option.help_for(command)
    for name, per_family in defaults.items():
        texts = helps[name]
        if len(set(texts.values())) > 1:  # each family's own rule (Wan's 4k+1 frames, LTX's 8k+1)
            whose: dict[str, list] = {}
            for title, text in texts.items():
                whose.setdefault(text.rstrip("."), []).append(title)
            found[name] = dataclasses.replace(found[name], help="; ".join(
                f"{text} ({', '.join(titles)})" for text, titles in whose.items()) + ".", helps={})
        if len(set(map(repr, per_family.values()))) > 1:
            text = ", ".join(f"{title} {value}" for title, value in per_family.items())
            option = found[name]
            found[name] = dataclasses.replace(option, default=None, defaults={},
                                              help=f"{option.help_for(command)} (default: {text})", helps={})
    return list(found.values())


def _parameter(option: Option, command: str) -> inspect.Parameter:
    from ltxbench.models import presets

    default = option.default_for(command)
    shown = [name for name, family in presets().items()  # generate: the video models only (it refuses LLMs)
             if command != "generate" or family.makes_video]
    text = option.help_for(command).replace("{presets}", ", ".join(shown))
    annotation = Optional[option.type] if default is None else option.type  # noqa: UP045 - typer reads Optional
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, *option.flags, help=text))


def takes_options(command: str) -> Callable:
    """Give `fn(**values)` the typer signature of `command`'s options."""

    def decorate(fn):
        @functools.wraps(fn)
        def checked(**values):
            check_choices(command, values)
            check_bounds(command, values)
            return fn(**values)

        checked.__signature__ = inspect.Signature([_parameter(o, command) for o in declared(command)],
                                                  return_annotation=None)
        return checked

    return decorate


def check_bounds(command: str, values: dict) -> None:
    """A shared option's value outside its declared bounds is a usage error naming the flag and the range (the
    families check their own options: ModelFamily.check_bounds)."""
    for option in declared(command):
        value = values.get(option.name)
        if option.name in SHARED:
            option.check(value)
        else:
            option.check_finite(value)


def check_choices(command: str, values: dict) -> None:
    """A value outside its option's declared choices is a usage error naming the flag, before anything runs."""
    from ltxbench.cli._validate import choice

    for option in declared(command):
        if option.choices is not None and values.get(option.name) is not None:
            choice(option.flags[0], values[option.name], option.choices)


def refuse_foreign(command: str, family, model: str) -> None:
    """A family's option typed on the command line for a model of another family (--stg-scale on LTX-Video,
    --num-frames on an LLM) is a usage error: the run would drop it, and its recorded command line would hold it.
    Defaults are not looked at: every command takes the union of the families' options."""
    from ltxbench.errors import UsageError
    from ltxbench.models import families

    ctx = _context()
    if ctx is None:  # called outside a command line
        return
    own = {o.name for o in family.options if command in o.commands}
    for option in declared(command):
        if option.name in SHARED or option.name in own:
            continue
        source = ctx.get_parameter_source(option.name)
        if source is None or source.name != "COMMANDLINE":
            continue
        on, _, off = option.flags[0].partition("/")
        flag = (on if ctx.params.get(option.name) else off) if off else "/".join(option.flags)
        takers = [f.title for f in families() if any(o.name == option.name and command in o.commands
                                                       for o in f.options)]
        raise UsageError(f"{flag} does not apply to {family.title} ({model})",
                         hint=f"drop {flag}: it is an option of {' and '.join(takers)} models")


def _context():
    """The running command's click context: from typer's own copy of click where it has one (typer 0.2x), else
    click's."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context
    return get_current_context(silent=True)


def command_line(command: str, values: dict) -> list[str]:
    """The command line that reruns `command` with `values` ({option name: value}; None and unknown names left out;
    a list as comma-separated text; a bool as its --flag or --no-flag)."""
    argv = ["ltxbench", *command.split()]
    for option in declared(command):
        value = values.get(option.name)
        if value is None:
            continue
        flag = option.flags[0]
        if isinstance(value, bool):
            on, _, off = flag.partition("/")
            if value or off:
                argv.append(on if value else off)
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)]
    return argv

