"""The one interface every model family implements (LTX-Video, LLMs, ...), its typed run settings and its CLI options.

A family is one class (`models/<family>.py`) registered in `ltxbench.models.FAMILIES`; the commands (`generate`,
`bench e2e`, `profile`) and the runners in `bench/` talk to it only through this interface. Only the standard
library at top level: the CLI resolves the family and validates the settings before torch is imported.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ltxbench.configurations import (
    CUDA_GRAPH_MODES,
    FP8_ACCUMULATIONS,
    STANDARD,
    Configuration,
    added_by,
    with_attention,
)
from ltxbench.errors import UsageError

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
COMMANDS = ("generate", "bench e2e", "profile")


@dataclass(frozen=True)
class Option:
    """One command-line option of a family, declared once: the settings field `name`, its flag(s) (a bool's as
    "--x/--no-x"), its type, default (per command where they differ) and help, the commands that take it, and the
    (lowest, highest) value the family runs, checked before torch loads (ModelFamily.settings)."""

    name: str
    flags: tuple[str, ...]
    type: type
    default: Any
    help: str
    commands: tuple[str, ...] = COMMANDS
    defaults: dict = field(default_factory=dict)  # command -> default, where a command differs
    helps: dict = field(default_factory=dict)     # command -> help, where a command differs
    bounds: tuple | None = None                    # (lowest, highest) allowed value, both included
    choices: tuple | None = None                   # the values it takes (cli.options checks them first)

    def default_for(self, command: str) -> Any:
        return self.defaults.get(command, self.default)

    def help_for(self, command: str) -> str:
        return self.helps.get(command, self.help)

    def check_finite(self, value) -> None:
        """UsageError naming the flag for nan or inf (typer parses them as floats; they pass every `< 0` check)."""
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{self.flags[0]} {value} must be a finite number")

    def check(self, value, owner: str | None = None) -> None:
        """check_finite, then UsageError naming the flag and the range for a value outside the bounds; `owner`: the
        family whose bounds these are, named in the message."""
        self.check_finite(value)
        if self.bounds is None or value is None:
            return
        lo, hi = self.bounds
        if not lo <= value <= hi:
            whose = f"{owner}'s" if owner else "the"
            side = f"below {whose} minimum of {lo}" if value < lo else f"above {whose} maximum of {hi}"
            shown = f"{value:g}" if isinstance(value, float) else value
            raise UsageError(f"{self.flags[0]} {shown} is {side} (allowed: {lo} to {hi})")


@dataclass(kw_only=True)
class RunSettings:
    """What every run takes, whatever the family; a family's settings subclass this with its own fields. Field
    order is the order of the run's recorded arguments (run.config in a result)."""

    model: str
    weights: str
    configs: list[str] | None = None   # bench e2e, profile: the configurations, in run order
    device: str = "cuda"
    dtype: str = "bf16"
    precision: str = "bf16"            # our kernels' projections: bf16 (exact) | fp8 (ltxbench.inject.fp8)
    fp8_accumulation: str | None = None  # their FP8 GEMMs' accumulation: fast | fp32 (None: bf16 only)
    kernel_provider: str = "cuda"
    seed: int = 42
    warmup: int | None = None          # bench e2e: untimed iterations per configuration
    repeats: int | None = None         # bench e2e: timed iterations per configuration
    rounds: int | None = None          # bench e2e: passes over the configurations, in alternating order
    batch_size: int = 1
    top: int | None = None             # profile: kernels listed per configuration
    compile_mode: str = "default"
    compile_scope: str = "model"      # model (nn.Module.compile) | regional (each repeated block: diffusers')
    family: str = ""
    compile_cache: str | None = None   # bench e2e: shared | cold inductor cache
    gpus: int = 1                      # processes of one run, one per GPU (ltxbench.parallel.launch)
    parallel: str | None = None        # how they split the work (resolved: None on one GPU)
    memory_budget_gib: float | None = None  # --memory-budget: GPU memory the run may use (ltxbench.memory)

    def as_args(self) -> dict:
        """The settings as the recorded arguments: fields a command does not take (None) are left out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class PeerConfig:
    """A configuration of the library a family's users would pick instead of ours (e.g. Liger for LLMs):
    apply(target) returns a report with revert() and as_dict(), as an InjectionReport."""

    name: str
    apply: Callable[[Any], Any]


class ModelFamily:
    """Base of the model families: what `--model` resolves to. Subclasses set the class attributes and implement
    the methods that raise NotImplementedError; the defaults below serve the families that need nothing else."""

    name: ClassVar[str]                       # recorded as the runs' "family"
    title: ClassVar[str]                      # for messages ("LTX-Video", "LLM")
    presets: ClassVar[dict[str, str | None]]  # preset -> hub id of its pretrained weights (None: random only)
    # preset -> settings it runs with where the command line gives none (a tiny preset's CPU-sized video)
    preset_defaults: ClassVar[dict[str, dict]] = {}
    settings_class: ClassVar[type[RunSettings]] = RunSettings
    options: ClassVar[tuple[Option, ...]] = ()
    makes_video: ClassVar[bool] = False             # `generate` takes it
    supports_parallel: ClassVar[bool] = False       # runs over several GPUs (--gpus N, --parallel)
    # --parallel it takes
    parallel_splits: ClassVar[tuple[str, ...]] = ("cfg", "ulysses", "ring", "cfg+ulysses", "cfg+ring")
    two_gpu_split: ClassVar[str] = "cfg"  # --gpus 2 without --parallel
    precisions: ClassVar[tuple[str, ...]] = ("bf16",)  # --precision values its injection takes
    attentions: ClassVar[tuple[str, ...]] = ()  # <config>@<attention> it takes (configurations.ATTENTIONS)
    attention_peers: ClassVar[tuple[str, ...]] = ()  # its peers that run the model's own attention: <peer>@<attention>

    # its models/<family>_run module (what a run does), imported by `runs` when a run of this family first needs it:
    # no other family's run loads it, so editing it leaves their stored results current
    run_module: ClassVar[str]

    @property
    def runs(self):
        import importlib

        return importlib.import_module(self.run_module)

    # --- resolving --model ------------------------------------------------------------------------------
    def claims(self, model: str) -> bool:
        """Whether `model` (not a preset of any family) is one of this family's: a hub id, a path."""
        return False

    def random_only(self, model: str) -> bool:
        return model in self.presets and self.presets[model] is None

    # --- before torch ----------------------------------------------------------------------------------
    def settings(self, command: str, **values) -> RunSettings:
        """The typed settings from a command's option values (those that are not fields, e.g. --output, left out)."""
        names = {f.name for f in dataclasses.fields(self.settings_class)} - {"family"}
        # None: not given (an option whose default differs by family leaves it to this family's settings)
        given = {k: v for k, v in values.items() if k in names and v is not None}
        preset = {k: v for k, v in self.preset_defaults.get(values.get("model"), {}).items() if k not in given}
        settings = self.settings_class(family=self.name, **preset, **given)
        self.check_bounds(settings, command)
        if settings.precision not in self.precisions:
            raise UsageError(f"--precision {settings.precision!r}: {self.title} runs "
                             f"{' or '.join(self.precisions)}", hint=f"choose from {', '.join(self.precisions)}")
        # FP8 runs under --precision fp8*, or where --configs names an FP8 configuration itself
        runs_fp8 = settings.precision != "bf16" or any(Configuration(c).precision != "bf16"
                                                       for c in settings.configs or ())
        if not runs_fp8 and settings.fp8_accumulation is not None:
            raise UsageError("--fp8-accumulation applies to the FP8 precisions: add --precision fp8 or fp8-attention",
                             hint="drop --fp8-accumulation, or choose an FP8 --precision")
        if runs_fp8:
            accumulation = settings.fp8_accumulation or FP8_ACCUMULATIONS[0]
            if accumulation not in FP8_ACCUMULATIONS:
                raise UsageError(f"--fp8-accumulation {accumulation!r}: choose {' or '.join(FP8_ACCUMULATIONS)}",
                                 hint="fast (the default) or fp32")
            settings = dataclasses.replace(settings, fp8_accumulation=accumulation)
        if settings.precision == "fp8-attention" and settings.gpus > 1:  # FlashAttention-3 over one GPU's tokens
            raise UsageError(f"--precision fp8-attention runs on one GPU, not --gpus {settings.gpus}",
                             hint="use --precision fp8 over several GPUs")
        return settings

    def check_bounds(self, settings: RunSettings, command: str) -> None:
        """Refuse a value outside its option's declared bounds (UsageError naming the flag and the range): a frame
        count or size far beyond what the model runs would otherwise fail only after the model is built."""
        for option in self.options:
            value = getattr(settings, option.name, None)
            if command in option.commands:
                option.check(value, self.title)
            else:
                option.check_finite(value)

    def validate(self, settings: RunSettings, command: str) -> None:
        """Refuse values this family cannot run (UsageError naming the flag), before anything heavy loads."""

    def peers(self) -> dict[str, PeerConfig]:
        """Peer-library configurations this family offers besides ours (name -> PeerConfig)."""
        return {}

    def config_names(self) -> tuple[str, ...]:
        """Every configuration a run of this family can take: ours (the FP8 ones of each precision it takes), then
        each peer alone and compiled."""
        fp8 = tuple(dict.fromkeys(c for precision in self.precisions for c in added_by(precision)))
        peers = tuple(Configuration.of(peer, compiled=compiled) for peer in self.peers() for compiled in (False, True))
        ours_and_torch = tuple(map(Configuration, STANDARD)) + fp8
        attended = tuple(c for attention in self.attentions
                         for c in with_attention(ours_and_torch + peers, attention, self.attention_peers))
        return ours_and_torch + peers + attended

    # --- with torch ------------------------------------------------------------------------------------
    def build(self, settings: RunSettings):
        """The model or pipeline (random weights from the package's configs, or pretrained), on settings.device."""
        raise NotImplementedError

    def compiled_modules(self, target) -> list:
        """The modules the compile configurations compile, each on its own (a pipeline's denoisers, the LLM
        itself)."""
        return [target]

    def set_attention(self, target, settings: RunSettings, log=None) -> dict | None:
        """The run's attention backend (--attention-backend) on `target` before any configuration: what was set, for
        the record; None where the family takes no such option or none was given."""
        return None

    def inject(self, target, settings: RunSettings):
        """Our kernels into `target` (ltxbench.inject.<family>): an InjectionReport, reverted by the runner."""
        raise NotImplementedError

    def apply_config(self, target, settings: RunSettings, config: str):
        """What configuration `config` patches before its (optional) compile: ours for optimized*, a peer's for
        <peer>*, nothing (None) for baseline and compile."""
        config = Configuration(config)
        if config.ours:  # optimized-fp8*: FP8 projections (and attention), else bf16
            return self.inject(target, dataclasses.replace(settings, precision=config.precision))
        peer = self.peers().get(config.peer)
        return peer.apply(target) if peer is not None else None

    def bench(self, target, settings: RunSettings, log: Callable[[str], None]) -> dict:
        """{config: summary} for settings.configs (ltxbench.bench.e2e.run_configs with this family's iteration)."""
        raise NotImplementedError

    def records(self, results: dict, params: dict, settings: RunSettings) -> list[dict]:
        """The result records of a `bench e2e` run (one per phase and configuration)."""
        raise NotImplementedError

    def plot_parts(self, records: list[dict]) -> list[str]:
        """Record labels stacked per configuration in `bench e2e --plot` (see ltxbench.bench.e2e_report.plot)."""
        return []

    def profile(self, target, settings: RunSettings, traces: dict, log: Callable[[str], None]) -> dict:
        """{config: profile summary} (ltxbench.bench.profile.profile_configs with this family's workload)."""
        raise NotImplementedError

    def bench_argv(self, settings: RunSettings) -> list[str]:
        """This family's options of a `bench e2e` command line that reruns a profiled workload (for nsys/ncu)."""
        return []


def refuse_cuda_graphs(mode: str, why: str | None, flag: str = "--compile-mode") -> None:
    """A CUDA-graph compile mode where the run cannot replay graphs (why: the hint; None: allowed)."""
    if why and mode in CUDA_GRAPH_MODES:
        raise UsageError(f"{flag} {mode} (CUDA graphs) is not supported here", hint=why)


def positive_ints(flag: str, text: str) -> list[int]:
    """'512,2048' -> [512, 2048]; UsageError naming the flag otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r} must be comma-separated integers") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} {text!r} must list positive integers")
    return values


def with_precision(configs: list[str], precision: str) -> list[str]:
    """--precision fp8 adds the FP8 configurations beside the ones chosen (bf16 ones stay: the comparison);
    fp8-attention adds those and the ones with FP8 attention as well."""
    return configs + [c for c in added_by(precision) if c not in configs]


def torch_dtype(name: str):
    """The torch dtype of --dtype's name."""
    import torch

    if name not in DTYPES:
        raise UsageError(f"--dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])



def parse_configs(text: str, allowed: tuple[str, ...] = STANDARD) -> list[Configuration]:
    """'baseline,optimized' -> ['baseline', 'optimized'] (order kept, duplicates dropped); 'all' -> every allowed
    configuration but the FP8 ones; UsageError on others."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise UsageError("--configs is empty", hint=f"choose from {', '.join(allowed)} or all")
    if names == ["all"]:  # the FP8 ones come with --precision (with_precision): they need a Hopper GPU; the ones
        # with an attention backend of their own need its package
        return [Configuration(c) for c in allowed if Configuration(c).precision == "bf16"
                and Configuration(c).attention is None]
    bad = [c for c in names if c not in allowed]
    if bad:
        raise UsageError(f"--configs: unknown configuration {bad[0]!r}",
                         hint=f"choose from {', '.join(allowed)} or all")
    return [Configuration(c) for c in dict.fromkeys(names)]


def select_configs(configs: str | None, optimized: bool | None, compile_: bool, default: str,
                   allowed: tuple[str, ...] = STANDARD) -> list[Configuration]:
    """--configs, or the original script's single selection (--use-optimized-kernels/--compile); not both."""
    if configs is not None and (optimized is not None or compile_):
        raise UsageError("--configs cannot be combined with --use-optimized-kernels/--no-optimized-kernels/--compile",
                         hint="use --configs for several configurations, or the flags for one")
    if configs is not None:
        return parse_configs(configs, allowed)
    if optimized is None and not compile_:
        return parse_configs(default, allowed)
    return [Configuration.of("ours" if optimized else "none", compiled=compile_)]
