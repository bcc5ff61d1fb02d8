"""Kernel injection into LTX-2 (diffusers' LTX2VideoTransformer3DModel). Reversible; returns an InjectionReport.

Rules:
  block (block.py): every block's forward through our kernels, video and audio streams alike: the modulated
  RMSNorms (rms_norm_modulate), each gated residual folded into the next norm's pass (add_rms_norm_modulate), the
  q/k RMSNorm across heads + RoPE as one kernel (split or interleaved), the feed-forward's GELU-tanh in its
  up-projection's GEMM epilogue, the text attentions' residual in their out-projection's GEMM, the audio<->video
  attentions' modulation.
  projections: the self-attentions' q/k/v and the audio<->video attentions' k/v as one GEMM each.
  text keys/values (text_kv.py): attn2 / audio_attn2 keys and values once per generation, also under regional
  compile (looked up outside the block's graph); text masks of all ones (the connectors') left out, so the text
  attentions attend unmasked.
  STG pass (stg.py): where no block has perturbed attention (LTX-2.0), the pipeline's spatio-temporal-guidance pass
  computes the guidance pair's positive half again; it is answered from that half instead (checked per call).

Refused and reported, left as diffusers runs them: a block forward or attention processor whose source is not the
code these rules reproduce (diffusers 0.42.1), LTX-2.3's perturbed or gated attention and prompt modulation, norms with
weights, an active dropout. Apply after `.to(device)`, before CPU offload.
"""

from __future__ import annotations

import contextlib

import torch

from ltxbench.errors import UsageError
from ltxbench.inject import (
    CALLS_ANSWERED,
    OFFLOADED,
    InjectionReport,
    all_or_nothing,
    generation_call,
    generation_scope,
    offloaded,
    patch_call,
    patch_forward,
    require_provider,
    run_device,
)
from ltxbench.inject.fp8 import Fp8Norms, is_fast_accumulation, require_fp8
from ltxbench.inject.fp8_attention import FP8_ATTENTION, fp8_attention_for, require_precision
from ltxbench.inject.fp8_held import hold_modules
from ltxbench.inject.fuse import fuse_layers
from ltxbench.inject.ltx2.attention import plain_attention, plain_feed_forward
from ltxbench.inject.ltx2.block import FUSED_PROCESSORS_ATTR, fused_block_forward
from ltxbench.inject.ltx2.precision import quantize_block, unquantizable
from ltxbench.inject.ltx2.stg import MEMO_ATTR, STG_RULE, PairMemo, transformer_call
from ltxbench.inject.ltx2.text_kv import (
    CACHE_ATTR,
    PROCESSOR_SOURCE,
    PROJECTION_RULE,
    TEXT_KV_RULE,
    TEXT_MASK_RULE,
    TextKVCache,
    TextKVProcessor,
    keep_projections,
    processor_class,
)
from ltxbench.inject.patching import source_digest

__all__ = ["ATTN1_FP8_RULE", "BLOCK_RULE", "CACHE_ATTR", "GENERATION_RULE", "MEMO_ATTR", "PROJECTION_RULE",
           "PROJECTIONS_RULE", "STG_RULE", "TEXT_KV_RULE", "TEXT_MASK_RULE", "TextKVCache", "TextKVProcessor",
           "apply_kernels", "generation", "new_generation"]

BLOCK_RULE = ("block: modulated RMSNorms, gated residuals into the next norm, q/k RMSNorm + RoPE, GEMM epilogues "
              "(GELU-tanh, residual), a2v/v2a modulation")
PROJECTIONS_RULE = "attn1/audio_attn1 q/k/v, a2v/v2a k/v: one GEMM each (fused weights)"
ATTN1_FP8_RULE = "attn1: FP8 attention ({}) on q/k from the split-RoPE kernel in FP8 and v quantized"  # the backend
GENERATION_RULE = ("pipeline: each call one generation (the text keys/values and the guidance pair kept across its "
                   "calls are forgotten after)")
# sha256 (first 16 hex digits) of LTX2VideoTransformerBlock.forward and .get_mod_params in diffusers 0.42.1: the code
# block.py reproduces.
BLOCK_SOURCES = ("1dbdd9ab731b53b9", "493775244f201a41")
ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
NORMS = ("norm1", "norm2", "norm3", "audio_norm1", "audio_norm2", "audio_norm3", "audio_to_video_norm",
         "video_to_audio_norm")
FUSED_PROJECTIONS = (("attn1", ("to_q", "to_k", "to_v")), ("audio_attn1", ("to_q", "to_k", "to_v")),
                     ("audio_to_video_attn", ("to_k", "to_v")), ("video_to_audio_attn", ("to_k", "to_v")))
LTX2_3_FLAGS = ("perturbed_attn", "cross_attn_adaln", "video_cross_attn_adaln", "audio_cross_attn_adaln")


def new_generation(target) -> None:
    """Forget the text keys/values and the guidance pair kept from earlier calls (`generation` does this on entry and
    exit)."""
    state = vars(getattr(target, "transformer", target))
    for attr in (CACHE_ATTR, MEMO_ATTR):
        if attr in state:
            state[attr].clear()


@contextlib.contextmanager
def generation(target):
    """One generation of the patched model (`target`: the transformer or its pipeline): the text keys/values and the
    guidance pair are kept across its calls only inside this scope. A patched pipeline's call is one generation."""
    with generation_scope(target, CACHE_ATTR, new_generation), generation_scope(target, MEMO_ATTR, new_generation):
        yield


_generation_call = generation_call(generation)  # `__call__` of the patched pipeline: its own call as one generation


def _block_refusal(block) -> str | None:
    """Why block.py cannot stand for this block's forward (None: it can)."""
    cls = type(block)
    if (source_digest(cls.forward), source_digest(cls.get_mod_params)) != BLOCK_SOURCES:
        return f"{cls.__name__}.forward is not the code this rule reproduces (diffusers 0.42.1)"
    flags = [flag for flag in LTX2_3_FLAGS if getattr(block, flag, False)]
    if flags:
        return f"{', '.join(flags)} on (LTX-2.3 block math): not reproduced"
    if any(getattr(getattr(block, name), "weight", None) is not None for name in NORMS):
        return "a block norm carries a weight: not the LTX-2 block math"
    for name in ATTENTIONS:
        reason = plain_attention(getattr(block, name))
        if reason:
            return f"{name}: {reason}"
    for name in ("ff", "audio_ff"):
        reason = plain_feed_forward(getattr(block, name))
        if reason:
            return f"{name}: {reason}"
    return None


def _text_kv_processors(report: InjectionReport, transformer, cache: TextKVCache) -> None:
    """attn2 / audio_attn2 through TextKVProcessor: the cache also serves the original block forward (a call the
    fused path leaves to it, or fused_blocks=False)."""
    cls = processor_class()
    for index, block in enumerate(transformer.transformer_blocks):
        for name in ("attn2", "audio_attn2"):
            attn = getattr(block, name)
            if type(attn.processor) is not cls:
                report.skip(f"block {index} {name}", f"its processor is {type(attn.processor).__name__}, not "
                            f"{cls.__name__}: left as is")
                continue
            original = attn.processor
            attn.processor = TextKVProcessor(original, cache)
            report.patched(TEXT_KV_RULE, lambda attn=attn, original=original: setattr(attn, "processor", original))


@all_or_nothing
def apply_kernels(target, provider: str = "cuda", *, text_kv_cache: bool = True, fused_blocks: bool = True,
                  fuse_projections: bool = True, reuse_stg_pass: bool = True,
                  precision: str = "bf16", fp8_accumulation: str = "fast",
                  text_encoder: bool = True) -> InjectionReport:
    """Patch an LTX2Pipeline (or its transformer) in place; revert with the report (or use it as a context manager).

    provider "cuda": our kernels (the transformer must be on a CUDA device); "reference": the same fusions in pure
    torch (ltxbench.ops.reference), so the mechanics run anywhere. text_kv_cache: attn2 / audio_attn2 keys and values
    once per generation (a call of the pipeline given here, or a `generation(transformer)` scope). fused_blocks: the
    block rule (module docstring); fuse_projections: with it, the projections that read one input as one GEMM.
    reuse_stg_pass: the STG pass answered from the guidance pair where it cannot differ (stg.py), in a generation.
    precision "fp8": every block projection stored and run in FP8, the norms and GELUs writing FP8 (precision.py;
    Hopper or newer; needs the fused blocks); the bf16 weights of those projections leave the device until revert.
    precision "fp8-attention": "fp8", and the video self-attention in FP8 on FlashAttention-3 or cuDNN
    (ltxbench.inject.fp8_attention; exit 4 where neither is installed).
    fp8_accumulation: the FP8 GEMMs' (fast: on the tensor cores alone; fp32: partial sums promoted; ops.linear_fp8).
    text_encoder: a pipeline's Gemma 3 text encoder patched by the LLM rules (ltxbench.inject.llm; bf16 whatever the
    precision), its rules reported under "text_encoder: ".
    """
    require_precision(precision)
    is_fast_accumulation(fp8_accumulation)  # a bad value is refused whatever the precision
    if precision != "bf16" and not fused_blocks:
        raise UsageError(f"precision {precision} needs the fused blocks (fused_blocks=True): their norms write FP8")
    from ltxbench.ops import get_provider

    transformer = getattr(target, "transformer", target)
    report = InjectionReport(provider)
    if {CACHE_ATTR, MEMO_ATTR} & set(vars(transformer)) or any(FUSED_PROCESSORS_ATTR in vars(b)
                                                                for b in transformer.transformer_blocks):
        report.skip("transformer", "patched by ltxbench already: revert that injection's report first")
        return report
    if offloaded(transformer):
        report.skip("transformer", OFFLOADED)
        return report
    ops = get_provider(provider)
    if fused_blocks:
        require_provider(provider, ops, transformer, "transformer", move="pipeline")
    # exit 4 where no FP8 attention is installed; exit 2 for a head dim it refuses
    attention8 = fp8_attention_for(transformer.transformer_blocks[0].attn1, provider) \
        if precision == FP8_ATTENTION else None
    if precision != "bf16":  # refused before anything is patched
        _require_fp8_blocks(transformer)
    cls = processor_class()
    known_processor = source_digest(cls.__call__) == PROCESSOR_SOURCE
    cache = None
    if not text_kv_cache:
        report.skip(TEXT_KV_RULE, "turned off (text_kv_cache=False): every call computes the text keys/values")
    elif not known_processor:
        report.skip(TEXT_KV_RULE, f"{cls.__name__}.__call__ is not the code this rule reproduces (diffusers 0.42.1)")
    else:
        cache = TextKVCache()
        _text_kv_processors(report, transformer, cache)
    if not fused_blocks:
        report.skip(BLOCK_RULE, "turned off (fused_blocks=False)")
    elif not known_processor:
        report.skip(BLOCK_RULE, f"{cls.__name__}.__call__ is not the code the fused attentions reproduce")
    else:
        _patch_blocks(report, transformer, ops, cache, fuse_projections, provider, precision, fp8_accumulation,
                      attention8)
    if cache is not None and report.rules:
        keep_projections(report, transformer, cache)
        vars(transformer)[CACHE_ATTR] = cache
        report.on_revert(lambda: vars(transformer).pop(CACHE_ATTR, None))
    if reuse_stg_pass:
        memo = vars(transformer)[MEMO_ATTR] = PairMemo()
        report.on_revert(lambda: vars(transformer).pop(MEMO_ATTR, None))
        report.outcome(CALLS_ANSWERED, lambda: list(memo.answered))
    else:
        report.skip(STG_RULE, "turned off (reuse_stg_pass=False)")
    text_masks = CACHE_ATTR in vars(transformer)
    if reuse_stg_pass or text_masks:  # one `__call__` for both (transformer_call): the masks left out, then the memo
        patch_call(report, STG_RULE if reuse_stg_pass else TEXT_MASK_RULE, transformer, transformer_call, {})
        if reuse_stg_pass and text_masks:
            report.note(TEXT_MASK_RULE)
    if CACHE_ATTR in vars(transformer) or MEMO_ATTR in vars(transformer):
        if target is not transformer:
            patch_call(report, GENERATION_RULE, target, _generation_call, {})
        else:
            report.skip(GENERATION_RULE, "given the transformer alone: the text keys/values and the guidance pair are "
                                         "kept across calls only inside ltxbench.inject.ltx2.generation(transformer)")
    _patch_text_encoder(report, target, transformer, provider, text_encoder)
    return report


def _patch_text_encoder(report, target, transformer, provider: str, wanted: bool) -> None:
    """The pipeline's text encoder through the LLM rules (Gemma 3's), reverted with the rest."""
    encoder = getattr(target, "text_encoder", None) if target is not transformer else None
    if encoder is None:
        return
    if not wanted:
        report.skip("text_encoder", "turned off (text_encoder=False)")
        return
    device = run_device(encoder) if not offloaded(encoder) else None
    if provider == "cuda" and device is not None and device.type != "cuda":  # kept on the host to save GPU memory
        report.skip("text_encoder", f"on {device}: the cuda kernels run on a CUDA device; it runs as it is")
        return
    from ltxbench.inject import llm

    report.include(llm.apply_kernels(encoder, provider), "text_encoder")


def _require_fp8_blocks(transformer) -> None:
    """UsageError (exit 2) unless every block runs fused and in FP8; exit 4 on a GPU without FP8 tensor cores."""
    require_fp8(run_device(transformer))
    blocks = transformer.transformer_blocks
    reason = next(filter(None, map(_block_refusal, blocks)), None) or unquantizable(
        blocks, (processor_class(), TextKVProcessor))
    if reason is not None:
        raise UsageError(f"precision fp8: {reason}", hint="run this model in bf16")


def _patch_blocks(report, transformer, ops, cache, fuse_projections: bool, provider: str, precision: str,
                  fp8_accumulation: str, attention8=None) -> None:
    processors = (processor_class(), TextKVProcessor)
    fp8 = precision != "bf16"
    if fp8:
        fuse_projections = False  # the FP8 weights are stored concatenated instead
    elif provider == "cuda":  # earlier processes' GEMM searches on this GPU model (ops.gemm_cache)
        ops.load_gemm_choices(run_device(transformer))
    forward = fused_block_forward(Fp8Norms(ops) if fp8 else ops, cache, attention8)
    classes: dict = {}
    for index, block in enumerate(transformer.transformer_blocks):
        reason = _block_refusal(block)
        if reason:
            report.skip(f"transformer_blocks.{index}", reason)
            continue
        patch_forward(report, BLOCK_RULE, block, forward, classes)
        if attention8 is not None:
            report.note(ATTN1_FP8_RULE.format(attention8.name))
        vars(block)[FUSED_PROCESSORS_ATTR] = processors
        report.on_revert(lambda block=block: vars(block).pop(FUSED_PROCESSORS_ATTR, None))
        if fp8:
            with torch.no_grad():
                quantize_block(report, ops, block, classes, fp8_accumulation)
        if fuse_projections:
            with torch.no_grad():
                for name, layers in FUSED_PROJECTIONS:
                    fuse_layers(report, getattr(block, name), layers, PROJECTIONS_RULE, f"{name} projections")
    if fp8:
        hold_modules(report, transformer)  # a weight or layer replaced from now on is refused (fp8_held)
