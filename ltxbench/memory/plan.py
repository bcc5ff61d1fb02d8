"""The memory plan of a `--memory-budget` run: what stays on the GPU, what streams from pinned host memory, whether
the VAE decodes in tiles (docs/memory.md). Pure arithmetic on sizes counted elsewhere (sizes.py, on the meta
device), standard library only: the CLI plans, prints and refuses before torch loads the model.

The plan is phased: a generation runs the text encode (text encoder, LTX-2's connectors), the denoise (the
transformer) and the decode (VAE; LTX-2's audio VAE and vocoder) one after the other, and a component holds GPU
memory only in its phase (pinned host copies otherwise; apply.py moves them). The denoise alone sizes the
transformer's resident blocks: budget - allowance (CUDA context, allocator) - transformer outside its blocks - slots
- denoise activations.
The transformer's weights stay on the GPU through the encode or the decode only where that phase fits beside them
(the encode with the whole text encoder resident); otherwise they go to the host for it and come back for the next
transformer call. The text encoder's layers get what its phase leaves. Streamed blocks are spread evenly between
resident ones, so a load overlaps the compute of the blocks before it. Where everything fits at once the plan is
static (nothing moves). The activation figures are estimates (activation_bytes, decode_bytes); `bench e2e
--memory-budget` measures the real peaks and enforces the budget.
"""

from __future__ import annotations

import dataclasses
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
# The caching allocator's reserved but free blocks at a phase's peak, which the budget must hold too: LTX-2 19B's
# denoise on an H200 left 0.41 GiB of them at 24 GiB, and ran out of memory at 16 GiB with 0.64 GiB of them.
ALLOCATOR_SLACK = 3 * GIB // 4
ALLOWANCE = CONTEXT_ALLOWANCE + ALLOCATOR_SLACK


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
    is built (built_bytes: random ones may be drawn on the GPU, then moved to the host), the FP8 copies of the blocks
    made afterwards on the host beside the bf16 weights (kept there for revert), and the activation estimates of
    each phase."""

    transformer: Stack
    text_encoder: Stack
    others: tuple[tuple[str, int], ...]
    built_bytes: int
    denoise_bytes: int
    encode_bytes: int
    decode_bytes: int        # untiled
    decode_tiled_bytes: int
    experts: int = 1         # transformers of the same stack, each the denoiser of its own steps (Wan 2.2 A14B: 2)
    fp8_copy_bytes: int = 0  # the blocks' FP8 copies, made on the host after the build


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


# components held whole that run in the encode (LTX-2's connectors, Wan 2.1 I2V's CLIP); the others in the decode
ENCODE_PARTS = ("connectors", "image_encoder")
PHASES = ("encode", "denoise", "decode")
EXPERTS = ("transformer", "transformer_2")  # the denoisers of a pipeline with experts (Wan 2.2 A14B), in order


@dataclass(frozen=True)
class MemoryPlan:
    """Phased (the budget cannot hold everything at once): each component is on the GPU only in its phase (text
    encoder and connectors: encode; transformer: denoise; VAEs and vocoder: decode) and in pinned host memory
    otherwise, except the transformer, which stays through the phases in `transformer_stays` (those that fit beside
    it). Not phased: everything on the GPU for the whole run. With `experts` transformers (Wan 2.2 A14B), each expert
    is planned as the transformer and holds the denoise phase alone during its own steps: the other goes to the host."""

    budget_bytes: int
    transformer: Streaming
    text_encoder: Streaming
    resident: tuple[tuple[str, int], ...]  # components held whole (on the GPU in their phase), with their bytes
    transformer_outside: int               # the transformer outside its blocks
    text_encoder_outside: int              # the text encoder outside its layers (its host-only parts left out)
    vae_tiling: bool
    activations: tuple[tuple[str, int], ...]  # (phase, estimated peak) for each of PHASES
    context_bytes: int                     # the allowance: CUDA context and the allocator's free cached blocks
    phased: bool = True
    transformer_stays: tuple[str, ...] = ()   # phases besides the denoise with the transformer left on the GPU
    built_bytes: int = 0                      # the whole pipeline's weights, as built (no FP8 copies yet)
    experts: int = 1                          # transformers planned alike (EXPERTS), one on the GPU at a time

    def stack(self, component: str) -> Streaming:
        """The plan of `component`'s stack: the transformer's for every expert, or the text encoder's."""
        return self.transformer if component in EXPERTS else self.text_encoder

    def _whole(self, phase: str) -> int:
        return sum(b for name, b in self.resident if (name in ENCODE_PARTS) == (phase == "encode"))

    def weights_bytes(self, phase: str) -> int:
        """The weights and slots on the GPU during `phase`."""
        transformer = self.transformer_outside + self.transformer.gpu_bytes
        encoder = self.text_encoder_outside + self.text_encoder.gpu_bytes
        if not self.phased:
            return self.experts * transformer + encoder + self._whole("encode") + self._whole("decode")
        own = {"encode": encoder + self._whole("encode"), "denoise": transformer, "decode": self._whole("decode")}
        return own[phase] + (transformer if phase in self.transformer_stays else 0)

    def phase_bytes(self, phase: str) -> int:
        """The planned peak of `phase`: its weights and slots, its activations, the context allowance."""
        return self.weights_bytes(phase) + dict(self.activations)[phase] + self.context_bytes

    @property
    def gpu_bytes(self) -> int:
        """The planned peak of the run: its largest phase."""
        return max(self.phase_bytes(p) for p in PHASES)

    @property
    def moved(self) -> tuple[str, ...]:
        """Components that move between the GPU and pinned host memory at phase changes."""
        if not self.phased:
            return ()
        stays = all(p in self.transformer_stays for p in ("encode", "decode")) and self.experts == 1
        return (*(() if stays else EXPERTS[:self.experts]), "text_encoder", *(name for name, _ in self.resident))

    @property
    def host_bytes(self) -> int:
        """Pinned host memory: the streamed blocks' copies and those of the weights that move at phase changes."""
        expert = self.transformer_outside + self.transformer.resident * self.transformer.block_bytes
        moving = {**dict.fromkeys(EXPERTS, expert), "text_encoder": self.text_encoder_outside
                  + self.text_encoder.resident * self.text_encoder.block_bytes, **dict(self.resident)}
        return (self.experts * self.transformer.host_bytes + self.text_encoder.host_bytes
                + sum(moving[name] for name in self.moved))

    def lines(self) -> list[str]:
        def whole(phase):
            return "".join(f", {name} {_gib(b)}" for name, b in self.resident
                           if (name in ENCODE_PARTS) == (phase == "encode"))

        head = [f"memory plan: budget {_gib(self.budget_bytes)}, planned peak {_gib(self.gpu_bytes)} (estimate), "
                f"allowance {_gib(self.context_bytes)} (CUDA context, allocator's free cached blocks)",
                "  " + self.transformer.line("transformer blocks" if self.experts == 1 else
                                             f"transformer blocks (each of {self.experts} experts, one at a time)"),
                "  " + self.text_encoder.line("text encoder layers")]
        if not self.phased:
            body = [f"  every phase: all weights on the GPU ({_gib(self.weights_bytes('denoise'))}), activations "
                    f"{_gib(max(b for _, b in self.activations))} (estimate)"]
        else:
            beside = {p: (f", the transformer {_gib(self.transformer_outside + self.transformer.gpu_bytes)}"
                          if p in self.transformer_stays else "") for p in PHASES}
            own = {"encode": f"text encoder {_gib(self.text_encoder_outside + self.text_encoder.gpu_bytes)} (layers "
                             f"and slots included){whole('encode')}",
                   "denoise": f"transformer {_gib(self.transformer_outside + self.transformer.gpu_bytes)} (outside "
                              f"its blocks {_gib(self.transformer_outside)})",
                   "decode": whole("decode").removeprefix(", ")}
            body = [f"  {p}: {own[p]}{beside[p]}; activations {_gib(dict(self.activations)[p])} (estimate); peak "
                    f"{_gib(self.phase_bytes(p))}" for p in PHASES]
        return [*head, *body, f"  VAE tiling {'on' if self.vae_tiling else 'off'}; pinned host memory "
                              f"{_gib(self.host_bytes)}"]

    def as_dict(self) -> dict:
        def stack(s: Streaming) -> dict:
            return {"blocks": s.blocks, "streamed": list(s.streamed), "slots": s.slots, "block_bytes": s.block_bytes}

        return {"budget_gib": self.budget_bytes / GIB, "planned_peak_bytes": self.gpu_bytes, "phased": self.phased,
                "experts": self.experts,
                "phase_peak_bytes": {p: self.phase_bytes(p) for p in PHASES},
                "transformer_stays": list(self.transformer_stays), "moved": list(self.moved),
                "resident": dict(self.resident), "transformer": stack(self.transformer),
                "text_encoder": stack(self.text_encoder), "vae_tiling": self.vae_tiling,
                "activation_bytes": dict(self.activations), "pinned_host_bytes": self.host_bytes}


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


def _refuse(budget_gib: float, phase: str, what: str, need: int, context: int) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"--memory-budget {budget_gib:g} GiB cannot hold the {phase} phase: {what}, the allowance for the CUDA "
        f"context and the allocator ({_gib(context)}) and its activations (estimated): at least {_gib(need)}",
        hint="raise --memory-budget, or lower --num-frames, --height, --width or --batch-size")


def plan_memory(budget_gib: float, need: Footprint, host_free: int | None = None, slots: int = SLOTS,
                context_bytes: int = ALLOWANCE) -> MemoryPlan:
    """The plan for `budget_gib` (module docstring); EnvironmentProblem (exit 4), one line, where a phase cannot fit
    the budget, or the host (`host_free` bytes) cannot hold the pipeline it builds there."""
    budget = int(budget_gib * GIB)
    tr, te = need.transformer, need.text_encoder
    whole = tuple(need.others)
    encode_whole = sum(b for name, b in whole if name in ENCODE_PARTS)
    decode_whole = sum(b for name, b in whole if name not in ENCODE_PARTS)
    everything = (context_bytes + need.experts * (tr.outside_bytes + tr.blocks * tr.block_bytes) + te.outside_bytes
                  + encode_whole + decode_whole + te.blocks * te.block_bytes)
    if everything + max(need.denoise_bytes, need.encode_bytes, need.decode_bytes) <= budget:
        plan = MemoryPlan(budget, *(Streaming(s.component, s.blocks, s.block_bytes, (), slots) for s in (tr, te)),
                          whole, tr.outside_bytes, te.outside_bytes, False,
                          (("encode", need.encode_bytes), ("denoise", need.denoise_bytes),
                           ("decode", need.decode_bytes)), context_bytes, phased=False, experts=need.experts)
        return _host_checked(plan, budget_gib, need, host_free)
    # the denoise alone sizes the transformer's resident blocks: the other phases' weights are on the host then
    smallest = context_bytes + tr.outside_bytes + slots * tr.block_bytes + need.denoise_bytes
    if smallest > budget:
        raise _refuse(budget_gib, "denoise", f"the transformer outside its blocks ({_gib(tr.outside_bytes)}) and "
                      f"{slots} slots ({_gib(slots * tr.block_bytes)})", smallest, context_bytes)
    transformer, _ = _stack_plan(tr, budget - context_bytes - tr.outside_bytes - need.denoise_bytes, slots)
    held = tr.outside_bytes + transformer.gpu_bytes  # the transformer on the GPU, which stays where a phase fits
    # the decode: untiled (the video as the model decodes it) where the decode phase holds it; tiles blend at seams
    tiling = context_bytes + decode_whole + need.decode_bytes > budget
    decode = need.decode_tiled_bytes if tiling else need.decode_bytes
    if context_bytes + decode_whole + decode > budget:
        raise _refuse(budget_gib, "decode", f"the VAEs and vocoder ({_gib(decode_whole)})",
                      context_bytes + decode_whole + decode, context_bytes)
    stays = ("decode",) if context_bytes + decode_whole + decode + held <= budget else ()
    # the encode: the transformer stays only where the whole text encoder fits beside it
    encode_fixed = context_bytes + te.outside_bytes + encode_whole + need.encode_bytes
    if encode_fixed + slots * te.block_bytes > budget:
        raise _refuse(budget_gib, "encode", f"the text encoder outside its layers ({_gib(te.outside_bytes)}), "
                      f"{slots} slots ({_gib(slots * te.block_bytes)}) and the connectors ({_gib(encode_whole)})",
                      encode_fixed + slots * te.block_bytes, context_bytes)
    if encode_fixed + te.blocks * te.block_bytes + held <= budget:
        stays = ("encode", *stays)
    text_encoder, _ = _stack_plan(te, budget - encode_fixed - (held if "encode" in stays else 0), slots)
    plan = MemoryPlan(budget, transformer, text_encoder, whole, tr.outside_bytes, te.outside_bytes, tiling,
                      (("encode", need.encode_bytes), ("denoise", need.denoise_bytes), ("decode", decode)),
                      context_bytes, phased=True, transformer_stays=stays, experts=need.experts)
    return _host_checked(plan, budget_gib, need, host_free)


def _host_checked(plan: MemoryPlan, budget_gib: float, need: Footprint, host_free: int | None) -> MemoryPlan:
    """`plan`, or EnvironmentProblem where the host cannot hold it: the pipeline built there, then its pinned copies
    made one storage at a time (each old storage freed after)."""
    tr, te = need.transformer, need.text_encoder
    weights = need.built_bytes + need.fp8_copy_bytes
    largest = max(tr.block_bytes, te.block_bytes, *dict(need.others).values(), tr.outside_bytes, te.outside_bytes)
    host_need = max(weights, plan.host_bytes) + largest
    if host_free is not None and host_need > host_free:
        raise EnvironmentProblem(
            f"--memory-budget {budget_gib:g} GiB builds the pipeline in host memory ({_gib(weights)} of "
            f"weights, {_gib(plan.host_bytes)} of them then pinned) and the host has "
            f"{_gib(host_free)} available", hint="free host memory, or run on a machine with more RAM")
    return dataclasses.replace(plan, built_bytes=need.built_bytes)
