"""The memory plan of a `--memory-budget` run: what stays on the GPU, what streams from pinned host memory, whether
the VAE decodes in tiles (docs/memory.md). Pure arithmetic on sizes counted elsewhere (sizes.py, on the meta
device), standard library only: the CLI plans, prints and refuses before torch loads the model.

The plan is static: every component sits where the plan puts it for the whole run, so the GPU holds at once the
weights on it (the small components whole, the transformer and the text encoder outside their layer stacks, the
resident layers), the stacks' slots, the CUDA context and the largest phase's activations. Transformer blocks come
first (each streamed one is copied once per transformer call, 3 calls a step: LTX-2's default guidance), the text
encoder's layers next (copied once per prompt encode). Streamed blocks are spread evenly between resident ones, so a
load overlaps the compute of the blocks before it. The activation figures are estimates (activation_bytes,
decode_bytes); `bench e2e --memory-budget` measures the real peaks and enforces the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ltxbench.errors import EnvironmentProblem

GIB = 2**30
SLOTS = 2  # one block computing, one loading
# The widest set of (tokens, hidden) tensors alive at once inside a transformer block, in units of one such tensor:
# the feed-forward's up-projection and its GELU (4 each), the stream and its norm, q/k/v and the attention's output,
# RoPE tables in fp32 (2) and room for the allocator's rounding. An estimate, not a measurement.
ACTIVATION_WIDTHS = 18
# Tensors of the VAE decoder's last stage (full frames, its top channels) alive at once: a convolution's input and
# output, the residual, a norm, the upsampler. An estimate.
DECODE_WIDTHS = 6
CONTEXT_ALLOWANCE = GIB  # CUDA context, cuBLAS workspaces, kernel images: an allowance (bench e2e measures it)


def activation_bytes(tokens: int, hidden: int, samples: int, element_size: int = 2, vocab: int = 0) -> int:
    """Estimated activation peak of one call over `samples` sequences of `tokens` tokens of width `hidden`
    (ACTIVATION_WIDTHS of them), plus a language model's logits where `vocab` is given."""
    return samples * tokens * (ACTIVATION_WIDTHS * hidden + vocab) * element_size


def decode_bytes(frames: int, height: int, width: int, channels: int, patch: int, element_size: int = 2) -> int:
    """Estimated activation peak of a VAE decode whose last stage runs `channels` wide at (height/patch, width/patch)
    over `frames` frames."""
    return DECODE_WIDTHS * frames * (height // patch) * (width // patch) * channels * element_size


@dataclass(frozen=True)
class Stack:
    """A component with a stack of like layers (the transformer's blocks, the text encoder's layers): their count,
    the largest one's bytes (as it will be held: FP8 weights counted as such) and the bytes outside the stack
    that run on the GPU."""

    component: str
    blocks: int
    block_bytes: int
    outside_bytes: int


@dataclass(frozen=True)
class Footprint:
    """What a run needs (bytes): the two stacks, the components held whole on the GPU, the pipeline's weights as it
    is built (on the host; with FP8 the blocks' bf16 weights, kept there for revert), and the activation estimates
    of each phase."""

    transformer: Stack
    text_encoder: Stack
    others: tuple[tuple[str, int], ...]
    built_bytes: int
    denoise_bytes: int
    encode_bytes: int
    decode_bytes: int        # untiled
    decode_tiled_bytes: int


@dataclass(frozen=True)
class Streaming:
    """One stack's part of the plan: which of its blocks stream, through how many slots."""

    component: str
    blocks: int
    block_bytes: int
    streamed: tuple[int, ...]
    slots: int

    @property
    def resident(self) -> int:
        return self.blocks - len(self.streamed)

    @property
    def gpu_bytes(self) -> int:
        return (self.resident + (self.slots if self.streamed else 0)) * self.block_bytes

    @property
    def host_bytes(self) -> int:
        return len(self.streamed) * self.block_bytes

    def line(self, what: str) -> str:
        if not self.streamed:
            return f"{what}: all {self.blocks} on the GPU"
        return (f"{what}: {self.resident} of {self.blocks} on the GPU, {len(self.streamed)} streamed from pinned host "
                f"memory through {self.slots} slots of {_gib(self.block_bytes)}")


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    transformer: Streaming
    text_encoder: Streaming
    resident: tuple[tuple[str, int], ...]  # components on the GPU whole, with their bytes
    outside_bytes: int                     # the two stacks' components outside their stacks, on the GPU
    vae_tiling: bool
    activation_bytes: int
    context_bytes: int
    host_bytes: int                        # pinned: the streamed blocks' copies

    @property
    def gpu_bytes(self) -> int:
        """The planned peak: weights and slots on the GPU, activations, the context allowance."""
        return (sum(b for _, b in self.resident) + self.outside_bytes + self.transformer.gpu_bytes
                + self.text_encoder.gpu_bytes + self.activation_bytes + self.context_bytes)

    def lines(self) -> list[str]:
        whole = ", ".join(f"{name} {_gib(nbytes)}" for name, nbytes in self.resident)
        return [f"memory plan: budget {_gib(self.budget_bytes)}, planned peak {_gib(self.gpu_bytes)} (estimate)",
                f"  on the GPU: {whole}; the transformer and text encoder outside their layers "
                f"{_gib(self.outside_bytes)}",
                "  " + self.transformer.line("transformer blocks"),
                "  " + self.text_encoder.line("text encoder layers"),
                f"  activations {_gib(self.activation_bytes)} (estimate), CUDA context allowance "
                f"{_gib(self.context_bytes)}; VAE tiling {'on' if self.vae_tiling else 'off'}",
                f"  pinned host memory {_gib(self.host_bytes)}"]

    def as_dict(self) -> dict:
        def stack(s: Streaming) -> dict:
            return {"blocks": s.blocks, "streamed": list(s.streamed), "slots": s.slots, "block_bytes": s.block_bytes}

        return {"budget_gib": self.budget_bytes / GIB, "planned_peak_bytes": self.gpu_bytes,
                "resident": dict(self.resident), "transformer": stack(self.transformer),
                "text_encoder": stack(self.text_encoder), "vae_tiling": self.vae_tiling,
                "activation_bytes": self.activation_bytes, "pinned_host_bytes": self.host_bytes}


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def spread(n: int, count: int) -> tuple[int, ...]:
    """`count` of range(n), spread evenly (none adjacent while count <= n / 2)."""
    return tuple(sorted({math.floor((i + 0.5) * n / count) for i in range(count)})) if count else ()


def streamed_blocks(n: int, resident: int) -> tuple[int, ...]:
    """The blocks of n to stream when `resident` stay: spread evenly between the resident ones, so that the streamed
    ones come in runs as short as the counts allow."""
    stream = n - resident
    if stream <= n // 2:
        return spread(n, stream)
    kept = set(spread(n, resident))
    return tuple(i for i in range(n) if i not in kept)


def _stack_plan(stack: Stack, room: int, slots: int) -> tuple[Streaming, int]:
    """The most blocks of `stack` that `room` bytes hold (all, or as many as fit beside its slots); the room left."""
    if stack.blocks * stack.block_bytes <= room:
        return Streaming(stack.component, stack.blocks, stack.block_bytes, (), slots), room - stack.blocks * \
            stack.block_bytes
    resident = max(0, min(stack.blocks - slots, (room - slots * stack.block_bytes) // stack.block_bytes))
    plan = Streaming(stack.component, stack.blocks, stack.block_bytes, streamed_blocks(stack.blocks, resident), slots)
    return plan, room - plan.gpu_bytes


def plan_memory(budget_gib: float, need: Footprint, host_free: int | None = None, slots: int = SLOTS,
                context_bytes: int = CONTEXT_ALLOWANCE) -> MemoryPlan:
    """The plan for `budget_gib` (module docstring); EnvironmentProblem (exit 4), one line, where the budget cannot
    hold the weights outside the stacks, their slots and the activations, or the host (`host_free` bytes) cannot hold
    the pipeline it builds there."""
    budget = int(budget_gib * GIB)
    tr, te = need.transformer, need.text_encoder
    whole = tuple(need.others)
    fixed = context_bytes + tr.outside_bytes + te.outside_bytes + sum(b for _, b in whole)
    smallest = fixed + slots * (tr.block_bytes + te.block_bytes)
    compute = max(need.denoise_bytes, need.encode_bytes)
    # untiled (the video as the model decodes it) only where that costs no resident block: tiles change the
    # video a little, streamed blocks cost time at every step
    everything = fixed + sum(s.blocks * s.block_bytes for s in (tr, te))
    tiling = need.decode_bytes > compute and everything + need.decode_bytes > budget
    activations = max(compute, need.decode_tiled_bytes if tiling else need.decode_bytes)
    if smallest + activations > budget:
        raise EnvironmentProblem(
            f"--memory-budget {budget_gib:g} GiB cannot hold the weights outside the streamed layers "
            f"({_gib(fixed - context_bytes)}), {slots} slots per layer stack ({_gib(smallest - fixed)}), the "
            f"activations ({_gib(activations)}, estimated) and the CUDA context ({_gib(context_bytes)}): at least "
            f"{_gib(smallest + activations)}", hint="raise --memory-budget, or lower --num-frames, --height, --width "
                                                   "or --batch-size")
    room = budget - fixed - activations - slots * te.block_bytes  # the text encoder's slots at least
    transformer, room = _stack_plan(tr, room, slots)
    text_encoder, _ = _stack_plan(te, room + slots * te.block_bytes, slots)
    plan = MemoryPlan(budget, transformer, text_encoder, whole, tr.outside_bytes + te.outside_bytes, tiling,
                      activations, context_bytes, transformer.host_bytes + text_encoder.host_bytes)
    # built on the host; then each streamed block copied into its pinned slab (its old storage freed after)
    host_need = max(need.built_bytes, plan.host_bytes) + max(tr.block_bytes, te.block_bytes)
    if host_free is not None and host_need > host_free:
        raise EnvironmentProblem(
            f"--memory-budget {budget_gib:g} GiB builds the pipeline in host memory ({_gib(need.built_bytes)} of "
            f"weights, {_gib(plan.host_bytes)} of them then pinned for streaming) and the host has "
            f"{_gib(host_free)} available", hint="free host memory, or run on a machine with more RAM")
    return plan
