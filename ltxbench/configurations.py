"""The run vocabulary: what a configuration patches, in which precision, and whether it is compiled.

A `Configuration` is parsed once from its name (`--configs`, or the flags of a single selection) and its parts are
read from it everywhere else: `patch` ("none", "ours" or a peer library's name), `precision` (what our projections
run in), `compiled` and `attention` (an attention backend set for this configuration alone, or None: the run's). It
is a `str` whose value is its name, so that records, result keys and JSON keep the names users type. Names:
baseline, compile, optimized[-<precision>][+compile], <peer>[+compile], each with @<attention> (e.g. compile@fa3: the
unpatched model compiled, its self-attentions on FlashAttention-3; a peer only where its family runs the model's own
attention, LTX-2's stg-off).

Only the standard library: the CLI, the families, the runners and the result readers all import it.
"""

from __future__ import annotations

PRECISIONS = ("bf16", "fp8", "fp8-attention")  # --precision: ours in bf16, FP8 projections, and FP8 self-attention
# <config>@<attention>: fa3, FlashAttention-3 on the self-attentions; auto, the backend measured fastest per attention
# (ltxbench.inject.attention_backend, attention_auto)
ATTENTIONS = ("fa3", "auto")
FP8_ACCUMULATIONS = ("fast", "fp32")  # --fp8-accumulation: the FP8 GEMMs' (ops.linear_fp8), fast the default
COMPILED = "+compile"
STANDARD = ("baseline", "optimized", "compile", "optimized+compile")  # ours and torch's; families add peers
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that replay CUDA graphs
COMPILE_SCOPES = ("model", "regional")  # the whole model (nn.Module.compile) or each repeated block (regional)
COMPILE_CACHES = ("shared", "cold")  # bench e2e --compile-cache: inductor's usual cache, or a fresh one
# The record param naming the --memory-budget (GiB) a configuration ran under: the same configuration under another
# budget (or none) is another measurement (results.schema.record_key keys on the params).
MEMORY_BUDGET = "memory_budget_gib"
MIN_MEMORY_BUDGET_GIB = 2  # the smallest --memory-budget: a CUDA context and one streamed block's two slots


class Configuration(str):
    """One configuration of a run, parsed from its name; the name itself is the value."""

    patch: str      # "none" (the model as it is), "ours" (our kernels), or a peer library's name
    precision: str  # what our projections run in: bf16, fp8 or fp8-attention (bf16 for every other patch)
    compiled: bool  # torch.compile over the patch
    attention: str | None  # an attention backend of this configuration alone (ATTENTIONS), or None

    def __new__(cls, name: str):
        if isinstance(name, Configuration):
            return name
        self = super().__new__(cls, name)
        rest, at, attention = name.partition("@")
        if at and attention not in ATTENTIONS:
            raise ValueError(f"not a configuration: {name!r} (attention {attention!r}: one of {', '.join(ATTENTIONS)})")
        self.attention = attention or None
        base = rest.removesuffix(COMPILED)
        compiled = base != rest
        if rest in ("baseline", "compile"):
            self.patch, self.precision, self.compiled = "none", "bf16", rest == "compile"
            return self
        if not base or base in ("baseline", "compile") or "+" in base:
            raise ValueError(f"not a configuration: {name!r}")
        if base == "optimized" or base.startswith("optimized-"):
            precision = base.removeprefix("optimized").removeprefix("-") or "bf16"
            if precision not in PRECISIONS or precision == "bf16" and base != "optimized":
                raise ValueError(f"not a configuration: {name!r} (precision {precision!r})")
            if at and precision == "fp8-attention":
                raise ValueError(f"not a configuration: {name!r} (fp8-attention runs its own attention kernel)")
            self.patch, self.precision = "ours", precision
        else:  # a peer: with @<attention> only where its family lets it (ModelFamily.attention_peers)
            self.patch, self.precision = base, "bf16"
        self.compiled = compiled
        return self

    @classmethod
    def of(cls, patch: str, precision: str = "bf16", compiled: bool = False,
           attention: str | None = None) -> Configuration:
        suffix = f"@{attention}" if attention else ""
        if patch == "none":
            return cls(("compile" if compiled else "baseline") + suffix)
        base = ("optimized" if precision == "bf16" else f"optimized-{precision}") if patch == "ours" else patch
        return cls(base + (COMPILED if compiled else "") + suffix)

    @property
    def name(self) -> str:
        return str(self)

    @property
    def ours(self) -> bool:
        return self.patch == "ours"

    @property
    def peer(self) -> str | None:
        """The peer library's configuration name (without +compile), or None for ours and the unpatched model."""
        return None if self.patch in ("none", "ours") else self.patch

    @property
    def standard(self) -> bool:
        """One of the four every family runs: the unpatched model or ours in bf16, eager or compiled."""
        return self in STANDARD

    def __getnewargs__(self):  # pickling (multi-process runs) rebuilds it from its name
        return (str(self),)


def with_attention(configs, attention: str, peers: tuple[str, ...] = ()) -> tuple[Configuration, ...]:
    """Each of `configs` that can take its own attention backend (the unpatched model, ours but FP8 attention, and the
    `peers` that run the model's own attention), with `attention`."""
    configs = map(Configuration, configs)
    return tuple(Configuration.of(c.patch, c.precision, c.compiled, attention) for c in configs
                 if c.attention is None and c.patch in ("none", "ours", *peers) and c.precision != "fp8-attention")


def added_by(precision: str) -> tuple[Configuration, ...]:
    """The configurations --precision adds beside the chosen ones: ours in that precision (fp8-attention: in fp8 too),
    eager and compiled."""
    precisions = {"fp8": ("fp8",), "fp8-attention": ("fp8", "fp8-attention")}.get(precision, ())
    return tuple(Configuration.of("ours", p, compiled) for p in precisions for compiled in (False, True))


def precision_label(record: dict) -> str:
    """What a record's numbers ran in, for tables: its dtype, and for FP8 the GEMMs' accumulation when fast."""
    fast = str(record["dtype"]).startswith("fp8") and record.get("params", {}).get("fp8_accumulation") == "fast"
    return f"{record['dtype']}, fast accumulation" if fast else record["dtype"]
