"""Kernel injection into diffusers' LTX-Video transformer (LTXVideoTransformer3DModel).

Per block (docs/models.md has the math):
  norm1(h) * (1 + scale_msa) + shift_msa            → rms_norm_modulate
  attn1: norm_q/norm_k + apply_rotary_emb on q, k   → qk_rms_norm_rope (angles from the grid, no fp32 tables)
  h + attn1 * gate_msa                              → gated_residual
  attn2: norm_q/norm_k (q and k differ in length)   → rms_norm each
  attn2: SDPA over the text tokens (additive mask)  → cross_attention (short-key tensor-core kernel)
  h + attn2; norm2(h) * (1 + scale_mlp) + shift_mlp → the out-projection's GEMM adds h (ops.linear, beta = 1;
                                                      tuned GEMMs) + rms_norm_modulate, else add_rms_norm_modulate
  h + ff * gate_mlp                                 → gated_residual, or with the next block's norm1:
                                                      add_rms_norm_modulate (model forward, chained blocks)
Model: norm_out (no-affine LayerNorm) + final modulation → layer_norm_modulate; what precedes the blocks built
before the (compiled) forward (step.py); attn2's keys/values once per generation (cross_kv.py); block 0's attn1
once for classifier-free guidance's identical halves (cfg.py). The patched block and model forwards are in
forward.py, the attention processor and forward in attention.py, the block's GEMMs (tuned linears, GELU epilogue) in
linears.py. Modulation per batch (B, 1, D) or per token (B, S, D, image-to-video / condition pipelines) both go
through the kernels' broadcast strides.
"""

from __future__ import annotations

import functools

import torch

from ltxbench.errors import UsageError
from ltxbench.inject import (
    OFFLOADED,
    ORIGINAL_CLASS,
    InjectionReport,
    all_or_nothing,
    generation_call,
    generation_scope,
    offloaded,
    original_class,
    patch_call,
    patch_forward,
    require_provider,
    run_device,
    set_attr,
)
from ltxbench.inject.fp8 import Fp8Norms, is_fast_accumulation, require_fp8
from ltxbench.inject.fp8_attention import FP8_ATTENTION, fp8_attention_for, require_precision
from ltxbench.inject.fp8_held import hold_modules
from ltxbench.inject.fuse import fuse_layers
from ltxbench.inject.ltx.attention import (
    ATTN_FORWARD_RULE,
    FusedLTXAttnProcessor,
    attention_forward,
    cross_key_value,
    forward_only_calls_processor,
)
from ltxbench.inject.ltx.cfg import PAIRED_ATTR, HalvesCheck
from ltxbench.inject.ltx.cross_kv import CACHE_ATTR, CrossKVCache, cache_sources
from ltxbench.inject.ltx.forward import fused_block_forward, fused_model_forward
from ltxbench.inject.ltx.linears import (
    GELU_MEASURED,
    TUNED_GEMM_RULE,
    ff_gelu_forward,
    tuned_linear_forward,
    tuned_linears,
)
from ltxbench.inject.ltx.precision import quantize_block, unquantizable
from ltxbench.inject.ltx.step import projected_prompt, step_call
from ltxbench.ops import get_provider
from ltxbench.ops.reference import ltx_rope_freqs, ltx_rope_grid

LEFT_ALONE = (
    ("VAE RMSNorm", "not touched: the VAE normalizes a strided channel dim (eps 1e-8) that no rule here targets"),
)


def _rope_from_coords(rope, hidden_states, num_frames=None, height=None, width=None, rope_interpolation_scale=None,
                      video_coords=None):
    """LTXVideoRotaryPosEmbed.forward returning (grid (B, S, 3), freqs (D // 6,)) instead of fp32 (B, S, D)
    cos/sin tables: the fused attention computes the angles in-kernel. Only our processors consume it.
    The grid made contiguous here, once per forward: diffusers builds it as a transposed view (last stride S),
    which the q/k kernel's binding copied at each of the 28 attn1 calls (and inductor recomputed per call)."""
    grid = ltx_rope_grid(rope, hidden_states.size(0), num_frames, height, width, rope_interpolation_scale,
                         video_coords, device=hidden_states.device)
    return grid.contiguous(), ltx_rope_freqs(rope.dim, rope.theta, device=hidden_states.device)


def _cross_kv_builder(ops):
    """build(model, prompt embeddings) for CrossKVCache: caption_projection, then every attn2's key and value."""

    def build(model, encoder_hidden_states):
        prompt = projected_prompt(model, encoder_hidden_states, encoder_hidden_states.size(0))
        return prompt, [cross_key_value(ops, block.attn2, prompt) for block in model.transformer_blocks]

    return build


def _transformer_of(target):
    from diffusers import LTXVideoTransformer3DModel

    transformer = getattr(target, "transformer", target)
    if not isinstance(transformer, LTXVideoTransformer3DModel):
        raise UsageError(f"apply_kernels expects an LTX pipeline or LTXVideoTransformer3DModel, "
                         f"got {type(target).__name__}")
    return transformer


def _plain_norms(block) -> bool:
    return getattr(block.norm1, "weight", None) is None and getattr(block.norm2, "weight", None) is None


def new_generation(target) -> None:
    """Forget what the patched model kept from earlier calls: the cached attn2 keys and values and the CFG check's
    last answer (`generation` does this on entry and exit)."""
    model = vars(getattr(target, "transformer", target))
    if CACHE_ATTR in model:
        model[CACHE_ATTR].clear()
    if PAIRED_ATTR in model:
        model[PAIRED_ATTR].last = None


def generation(target):
    """One generation of the patched LTX model (`target`: the transformer or its pipeline): attn2's keys and values
    are kept across its steps only inside this scope, and forgotten on entry and exit (an exception included), so
    no weight change between generations can meet an old entry (cross_kv.py). A patched pipeline's call is one
    generation; a caller that runs the transformer's steps itself wraps them in this to keep the cache."""
    return generation_scope(target, CACHE_ATTR, new_generation)


_generation_call = generation_call(generation)  # `__call__` of the patched pipeline: its own call as one generation


def _patched_already(transformer) -> bool:
    modules = [transformer, getattr(transformer, "rope", None), *transformer.transformer_blocks]
    return any(m is not None and ORIGINAL_CLASS in vars(type(m)) for m in modules) or any(
        isinstance(getattr(b, name).processor, FusedLTXAttnProcessor)
        for b in transformer.transformer_blocks for name in ("attn1", "attn2"))


MODEL_RULE = ("model: ff residual + next norm1 (add_rms_norm_modulate), final layer_norm_modulate; what precedes the "
              "blocks built before the (compiled) forward (ltx_step)")
CROSS_KV_RULE = "model: attn2 keys/values and caption projection once per generation (cross_kv cache)"
GENERATION_RULE = "pipeline: each call one generation (what the model keeps across steps is forgotten after it)"
RESIDUAL_RULE = "attn2: out-projection + residual add as one GEMM (ops.linear, beta = 1)"
ATTN1_FP8_RULE = "attn1: FP8 attention ({}) on qk_rms_norm_rope_fp8's q/k and v"  # the backend's name
PAIRED_RULE = "model: block 0's attn1 once for classifier-free guidance's identical halves (checked per step)"
ATTN2_RULES = {True: "attn2: rms_norm q, k; cross_attention (default backend)", False: "attn2: rms_norm q, k"}
# Head dims where ops.cross_attention beat SDPA (cuDNN) for attn2, bf16, H200 (results/h200/micro-xattn*-6f3727d):
# hd 64 (2B) 36.9 vs 42.7 us at 49 frames, 84.3 vs 107.4 at 161; hd 128 (13B, 161 frames) 155.3 vs 242.6. Other head
# dims take the kernel's scalar fp32 path, never measured faster than SDPA: there None keeps SDPA.
CROSS_ATTENTION_HEAD_DIMS = (64, 128)


@all_or_nothing
def apply_kernels(target, provider: str = "cuda", *, rope_from_coords: bool = True, fuse_projections: bool = True,
                  gelu_epilogue: bool = True, gelu_tanh: bool = False,
                  cross_attention: bool | None = None, cross_kv_cache: bool = True,
                  tuned_gemm: bool = True, pair_cfg_halves: bool = True, precision: str = "bf16",
                  fp8_accumulation: str = "fast") -> InjectionReport:
    """Patch an LTX pipeline's transformer (or the transformer itself) in place; returns the report, whose
    `revert()` (or use as a context manager) restores the original forwards and processors.

    provider "cuda": our kernels (the transformer must be on a CUDA device); "reference": the same fusions
    in pure torch, so the mechanics run anywhere. Apply after `.to(device)`, before CPU offload.
    fuse_projections: attn1's q/k/v and attn2's k/v as one GEMM each (the Linear weights become views of the
    concatenation: one copy in memory). gelu_epilogue: the feed-forward up-projection and its GELU(tanh) as
    one cuBLASLt GEMM with a GELU epilogue; else gelu_tanh=True routes the activation alone through
    `ops.gelu_tanh` (torch's own GELU measured faster, see GELU_MEASURED). cross_attention: attn2's attention
    through `ops.cross_attention` instead of SDPA, where diffusers would run its default (native) backend; None
    (the default) does so at the head dims where it measured faster (CROSS_ATTENTION_HEAD_DIMS). cross_kv_cache:
    attn2's keys and values (and the caption projection) computed once per generation, not once per step
    (cross_kv.py; needs the chained model forward; a generation is one call of the pipeline given here, or a
    `generation(transformer)` scope). tuned_gemm: the blocks' projections (fused q/k/v, attn2's q,
    both out-projections, the feed-forward's two) through `ops.linear`, cuBLASLt with the algorithm per shape
    chosen by timing on its first call (docs/kernels.md#attention-and-gemm) or stored by an earlier process on this
    GPU model (ops.load_gemm_choices); else torch's linear (cuBLASLt's heuristic pick).
    The attn2 k/v projections run once per generation with the cache, so they stay torch's. pair_cfg_halves: where
    a step's batch is two identical halves (classifier-free guidance), block 0's norm1, attn1 and gated residual
    run on one half (cfg.py: checked on the device, the answer read one step late, so no synchronization
    before a step; needs the chained model forward). precision "fp8": every block projection stored and run in FP8,
    the modulated norms and the GELU writing their outputs in FP8 (precision.py; Hopper or newer); the bf16 weights
    of those projections leave the device until revert. precision "fp8-attention": "fp8", and attn1's attention in
    FP8 on FlashAttention-3 or cuDNN (ltxbench.inject.fp8_attention; exit 4 where neither is). fp8_accumulation:
    the FP8 GEMMs' (fast: on the tensor cores alone; fp32: partial sums promoted, ~18% slower; ops.linear_fp8).
    """
    require_precision(precision)
    is_fast_accumulation(fp8_accumulation)  # a bad value is refused whatever the precision
    transformer = _transformer_of(target)
    if _patched_already(transformer):  # a second set of patches would stack, and reverting one would leave the other
        report = InjectionReport(provider)
        report.skip("transformer", "patched by ltxbench already: revert that injection's report first")
        return report
    if offloaded(transformer):
        report = InjectionReport(provider)
        report.skip("transformer", OFFLOADED)
        return report
    ops = get_provider(provider)
    require_provider(provider, ops, transformer, "transformer", move="pipeline")
    fp8 = precision in ("fp8", FP8_ATTENTION)
    # exit 4 where no FP8 attention is installed; exit 2 for a head dim it refuses
    attention8 = fp8_attention_for(transformer.transformer_blocks[0].attn1, provider) \
        if precision == FP8_ATTENTION else None
    if fp8:
        require_fp8(run_device(transformer))
        reason = unquantizable(transformer.transformer_blocks)
        if reason is not None:
            raise UsageError(f"precision fp8: {reason}", hint="run this model in bf16")
        tuned_gemm = fuse_projections = gelu_epilogue = gelu_tanh = False  # every projection is FP8 instead
    norms = Fp8Norms(ops) if fp8 else ops  # the fused block code's norms: FP8 outputs for the FP8 projections
    if provider == "cuda" and tuned_gemm:
        # earlier processes' searches on this GPU model (ops.gemm_cache)
        ops.load_gemm_choices(run_device(transformer))
    report = InjectionReport(provider)
    classes: dict = {}  # (class, forward) -> its patched subclass
    if rope_from_coords:
        patch_forward(report, "rope: angles from coordinates", transformer.rope, _rope_from_coords, classes)
    dtype = transformer.proj_in.weight.dtype
    uniform = all(b.scale_shift_table.dtype == dtype for b in transformer.transformer_blocks)
    if "forward" in vars(transformer):
        report.skip("model forward (block chain + final layer_norm_modulate)",
                    "the forward is already wrapped by a hook (offload, context parallel): left as is")
    elif not uniform or transformer.scale_shift_table.dtype != dtype:
        report.skip("model forward (block chain + final layer_norm_modulate)",
                    "modulation tables and activations differ in dtype: the kernels take one dtype")
    elif len(transformer.transformer_blocks) and all(_plain_norms(b) for b in transformer.transformer_blocks):
        if cross_kv_cache:
            cache = CrossKVCache(_cross_kv_builder(ops),
                                 functools.partial(cache_sources, processor_type=FusedLTXAttnProcessor))
            set_attr(report, CROSS_KV_RULE, transformer, CACHE_ATTR, cache)
            if target is transformer:
                report.skip(GENERATION_RULE, "given the transformer, not its pipeline: attn2's keys/values are kept "
                                             "across steps only inside ltxbench.inject.ltx.generation(transformer)")
            else:
                patch_call(report, GENERATION_RULE, target, _generation_call, classes)
        else:
            report.skip(CROSS_KV_RULE, "turned off (cross_kv_cache=False): every step computes attn2's keys/values")
        if pair_cfg_halves:
            set_attr(report, PAIRED_RULE, transformer, PAIRED_ATTR, HalvesCheck())
        else:
            report.skip(PAIRED_RULE, "turned off (pair_cfg_halves=False): both halves run block 0's attn1")
        patch_forward(report, MODEL_RULE, transformer, fused_model_forward(norms), classes, call=step_call)
    block_forward = fused_block_forward(norms)
    linear_forward = tuned_linear_forward(ops)
    for index, block in enumerate(transformer.transformer_blocks):
        if not _plain_norms(block):
            report.skip(f"transformer_blocks.{index}", "norm1/norm2 carry a weight: not the LTX block math")
            continue
        patch_forward(report, "block: rms_norm_modulate, gated_residual x2, add_rms_norm_modulate", block,
                      block_forward, classes)
        own = cross_attention
        if own is None:
            own = block.attn2.to_q.out_features // block.attn2.heads in CROSS_ATTENTION_HEAD_DIMS
        for name, rule in (("attn1", ATTN1_FP8_RULE.format(attention8.name) if attention8
                                   else "attn1: qk_rms_norm_rope"),
                           ("attn2", ATTN2_RULES[own])):
            attn = getattr(block, name)
            processor = FusedLTXAttnProcessor(ops, attn.processor, cross_attention=name == "attn2" and own,
                                              tuned_gemm=tuned_gemm,
                                              fp8_attention=attention8 if name == "attn1" else None)
            set_attr(report, rule, attn, "processor", processor)
            if name == "attn2" and processor.fuses_residual(attn):
                report.note(RESIDUAL_RULE)
            if forward_only_calls_processor(original_class(attn)):
                patch_forward(report, ATTN_FORWARD_RULE, attn, attention_forward, classes)
            else:
                report.skip(f"transformer_blocks.{index}.{name} forward", "not diffusers' processor shim: left as is")
        if fp8:
            quantize_block(report, ops, block, classes, fp8_accumulation)
        if fuse_projections:
            fuse_layers(report, block.attn1, ("to_q", "to_k", "to_v"), "attn1: one q/k/v GEMM")
            fuse_layers(report, block.attn2, ("to_k", "to_v"), "attn2: one k/v GEMM")
        if tuned_gemm:
            for layer in tuned_linears(block, fuse_projections, gelu_epilogue):
                if type(layer) is torch.nn.Linear:
                    patch_forward(report, TUNED_GEMM_RULE, layer, linear_forward, classes)
                else:
                    report.skip(TUNED_GEMM_RULE, f"transformer_blocks.{index}: a {type(layer).__name__}, not a "
                                                 "plain nn.Linear (a wrapper's own math is kept)")
    if gelu_epilogue or gelu_tanh:
        from diffusers.models.activations import GELU

        rule = "ff: up-projection + GELU-tanh as one GEMM (epilogue)" if gelu_epilogue else "ff: gelu_tanh"
        gelu_forward = ff_gelu_forward(ops, gelu_epilogue, tuned_gemm)
        for index, block in enumerate(transformer.transformer_blocks):
            act = block.ff.net[0]
            if isinstance(act, GELU) and act.approximate == "tanh" and act.proj.bias is not None:
                patch_forward(report, rule, act, gelu_forward, classes)
            else:
                report.skip(rule, f"transformer_blocks.{index}.ff: not a biased GELU(approximate='tanh')")
    elif not fp8:
        report.skip("ff GELU-tanh", GELU_MEASURED + "; apply_kernels(..., gelu_tanh=True) routes it anyway")
    if fp8:
        hold_modules(report, transformer)  # a weight or layer replaced from now on is refused (fp8_held)
    for target_name, reason in LEFT_ALONE:
        report.skip(target_name, reason)
    return report
