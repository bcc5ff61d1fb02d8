"""Kernel injection into Wan (diffusers' WanTransformer3DModel, Wan 2.1 and 2.2). Reversible; returns an
InjectionReport. The first, exact rules, each through an existing op whose math is Wan's own:

  block: WanTransformerBlock.forward with norm1 and norm3 (fp32 LayerNorm without affine, then `* (1 + scale) +
  shift`, rounded once) through `layer_norm_modulate`, and the two gated residuals (`x + a * gate` in fp32, rounded
  once) through `gated_residual`. Wan's modulation (its tables plus the time embedding) is fp32 and the ops take it
  as it is; norm2 (an affine LayerNorm), attn2's plain residual and the attentions run as diffusers runs them.
  q/k norms + RoPE: attn1's processor with norm_q / norm_k (torch.nn.RMSNorm over all heads, weight multiplied in
  fp32, rounded once) and the rotary embedding in one `qk_rms_norm_rope` (attention.py); attn2's norms, and attn1's
  where that is refused, through `rms_norm`.
  feed-forward GELU: each block's up-projection and its GELU-tanh as one GEMM whose epilogue adds the bias and
  applies the GELU (`linear_gelu_tanh`: the pre-activation is never written; the reference provider computes the
  model's two steps); a projection hooked, wrapped or offloaded after the injection runs itself, then `gelu_tanh`.

Refused and reported, left as diffusers runs them: a block or GELU forward whose source is not the code these rules
reproduce (diffusers 0.42.1), norms of another class or without weights, another GELU approximation. Over 16-bit
activations the cuda provider's modulated LayerNorm and gated residual read Wan's float32 scale, shift and gate as
they are (rows up to 8192 wide: wider blocks are refused). Apply after `.to(device)`.
"""

from __future__ import annotations

import torch

from ltxbench.errors import UsageError
from ltxbench.inject import (
    OFFLOADED,
    InjectionReport,
    all_or_nothing,
    observed,
    offloaded,
    original_class,
    patch_call,
    patch_forward,
    require_provider,
)
from ltxbench.inject.fp8_held import hold_modules
from ltxbench.inject.layers import eps_of, gemm_can_stand_for
from ltxbench.inject.patching import source_digest as digest
from ltxbench.inject.wan.attention import ATTN1_FP8_RULE, QK_ROPE_RULE, self_attention_call
from ltxbench.inject.wan.attention import refusal as qk_rope_refusal
from ltxbench.inject.wan.precision import quantize_block, unquantizable
from ltxbench.ops.registry import F32_MODULATION_WIDTH

__all__ = ["BLOCK_RULE", "GELU_RULE", "GENERATION_RULE", "QK_NORM_RULE", "QK_ROPE_RULE", "apply_kernels",
           "experts"]

BLOCK_RULE = "block: norm1/norm3 modulated LayerNorm, gated residuals (fp32 modulation, one rounding)"
QK_NORM_RULE = "attn1/attn2 norm_q, norm_k: RMSNorm across heads"
GELU_RULE = "ffn: up-projection + GELU-tanh as one GEMM (epilogue)"
GENERATION_RULE = "pipeline: each call one generation (the guidance pair's negative prompt kept only inside it)"
# sha256 (first 16 hex digits) of the sources these rules reproduce, diffusers 0.42.1
BLOCK_SOURCE = "21c15441b009932c"                      # WanTransformerBlock.forward
GELU_SOURCES = ("538b05d6963a325c", "d203f2720ee05f35")  # diffusers' GELU.forward, GELU.gelu
MAX_F32_MODULATION_ROW = F32_MODULATION_WIDTH["wan-f32"]  # the widest row the cuda provider's kernels take


def block_forward(ops):
    """WanTransformerBlock.forward (diffusers 0.42.1) with the modulated norms and gated residuals as ops."""

    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        if observed(self.norm1) or observed(self.norm3):  # hooked since the injection: they must run themselves
            return original_class(self).forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb)
        if temb.ndim == 4:  # per-token time embedding (Wan 2.2 5B): (B, S, 6, D)
            mod = [m.squeeze(2) for m in (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
        else:               # (B, 6, D)
            mod = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = mod
        norm = ops.layer_norm_modulate(hidden_states, scale_msa, shift_msa, self.norm1.eps)
        attn_output = self.attn1(norm, None, None, rotary_emb)
        hidden_states = ops.gated_residual(hidden_states, attn_output, gate_msa)
        norm = self.norm2(hidden_states.float()).type_as(hidden_states)
        hidden_states = hidden_states + self.attn2(norm, encoder_hidden_states, None, None)
        norm = ops.layer_norm_modulate(hidden_states, c_scale_msa, c_shift_msa, self.norm3.eps)
        return ops.gated_residual(hidden_states, self.ffn(norm), c_gate_msa)

    return forward


def rms_norm_forward(ops):
    """torch.nn.RMSNorm.forward (affine) as ops.rms_norm: fp32 statistics and weight multiply, one rounding."""

    def forward(self, x):
        return ops.rms_norm(x, self.weight, eps_of(self))

    return forward


def gelu_forward(ops):
    """diffusers' GELU (tanh approximation) as ops.linear_gelu_tanh on its projection's weight and bias, where the
    projection is a plain nn.Linear with a bias, unhooked, on the device and without autograd; else the projection as
    it runs (its hooks, its wrapper, its offload), then ops.gelu_tanh."""

    def forward(self, hidden_states):
        proj = self.proj
        if proj.bias is not None and gemm_can_stand_for(proj, hidden_states):
            return ops.linear_gelu_tanh(hidden_states, proj.weight, proj.bias)
        return ops.gelu_tanh(proj(hidden_states))

    return forward


def _block_refusal(block) -> str | None:
    from diffusers.models.normalization import FP32LayerNorm

    cls = type(block)
    if digest(cls.forward) != BLOCK_SOURCE:
        return f"{cls.__name__}.forward is not the code this rule reproduces (diffusers 0.42.1)"
    for name in ("norm1", "norm3"):
        norm = getattr(block, name)
        if type(norm) is not FP32LayerNorm or norm.weight is not None:
            return f"{name} is not an FP32LayerNorm without affine parameters"
    return None


def _gelu_refusal(layer) -> str | None:
    from diffusers.models.activations import GELU

    if type(layer) is not GELU:
        return f"its activation is {type(layer).__name__}, not diffusers' GELU"
    if (digest(GELU.forward), digest(GELU.gelu)) != GELU_SOURCES:
        return "GELU.forward is not the code this rule reproduces (diffusers 0.42.1)"
    if layer.approximate != "tanh":
        return f"GELU approximation {layer.approximate!r}, not 'tanh'"
    return None


def experts(target) -> list[tuple[str, torch.nn.Module]]:
    """(name, transformer) of each denoiser of a WanPipeline: its `transformer` and, in Wan 2.2 A14B, the low-noise
    expert `transformer_2` (unless it is the same module); a transformer given alone is ("transformer", it)."""
    if not hasattr(target, "transformer"):
        return [("transformer", target)]
    found = [(name, module) for name in ("transformer", "transformer_2")
             if (module := getattr(target, name, None)) is not None]
    return [(name, module) for i, (name, module) in enumerate(found)
            if all(module is not other for _, other in found[:i])]  # one module in both slots: patched once


@all_or_nothing
def apply_kernels(target, provider: str = "cuda", *, blocks: bool = True, qk_norms: bool = True,
                  qk_rope: bool = True, gelu: bool = True, pair_guidance: bool = True, precision: str = "bf16",
                  fp8_accumulation: str = "fast") -> InjectionReport:
    """Patch a WanPipeline (every expert: `experts`) or its transformer in place; revert with the one report (or use
    it as a context manager).

    provider "cuda": our kernels (the transformer must be on a CUDA device); "reference": the same ops in pure torch
    (ltxbench.ops.reference), so the mechanics run anywhere. blocks, qk_norms, qk_rope, gelu: the rules (module
    docstring; qk_rope off leaves attn1's norms to the qk_norms rule).
    pair_guidance: a pipeline's guidance pair as one call of batch 2 (pair.py; a pipeline's rule, not applied to a
    transformer given alone). precision "fp8": every block projection stored and run in FP8 (precision.py; the
    feed-forward then runs on its FP8 weights, not through the GELU rule), all blocks or none (UsageError naming what
    cannot); "fp8-attention": "fp8", and attn1's attention in FP8 on FlashAttention-3 or cuDNN
    (ltxbench.inject.fp8_attention). Skipped modules of the second expert are named from `transformer_2.`."""
    from ltxbench.inject.fp8 import is_fast_accumulation
    from ltxbench.inject.fp8_attention import FP8_ATTENTION, fp8_attention_for, require_precision
    from ltxbench.ops import get_provider

    require_precision(precision)
    is_fast_accumulation(fp8_accumulation)
    fp8 = precision in ("fp8", FP8_ATTENTION)
    attention8 = None
    if precision == FP8_ATTENTION:  # exit 4 where no FP8 attention is installed; exit 2 for a head dim it refuses
        if not qk_rope:
            raise UsageError(f"precision {FP8_ATTENTION} runs in the fused q/k norm + RoPE rule: keep qk_rope on")
        attention8 = fp8_attention_for(experts(target)[0][1].blocks[0].attn1, provider)
    for _name, transformer in experts(target) if fp8 else ():  # refused before anything is patched
        _require_fp8_blocks(transformer)
    report = InjectionReport(provider)
    classes: dict = {}  # one subclass per class and rule, shared by the experts (regional compile guards on it)
    forwards: dict = {}
    for name, transformer in experts(target):
        if offloaded(transformer):
            report.skip(name, OFFLOADED)
            continue
        ops = get_provider(provider)
        require_provider(provider, ops, transformer, name, move="pipeline")
        # one forward function per rule, shared by every block and both experts: patch_forward makes a subclass per
        # function, and regional compile guards on the class (a class per block would recompile for each)
        forwards = forwards or {"block": block_forward(ops), "rms": rms_norm_forward(ops), "gelu": gelu_forward(ops),
                                "attn1": self_attention_call(ops, attention8)}
        prefix = "" if name == "transformer" else f"{name}."
        _patch_expert(report, transformer, ops, forwards, prefix, classes, blocks=blocks, qk_norms=qk_norms,
                      qk_rope=qk_rope, gelu=gelu and not fp8, attention8=attention8)
        for block in transformer.blocks if fp8 else ():
            quantize_block(report, ops, block, classes, fp8_accumulation)
        if fp8:
            hold_modules(report, transformer)  # a weight or layer replaced from now on is refused (fp8_held)
    if fp8 and gelu:
        report.skip(GELU_RULE, "precision fp8: the feed-forward runs on its FP8 weights, its GELU writing FP8")
    for name, wanted in (("qk_norms", qk_norms), ("qk_rope", qk_rope), ("gelu", gelu)):
        if not wanted:
            report.skip({"qk_norms": QK_NORM_RULE, "qk_rope": QK_ROPE_RULE, "gelu": GELU_RULE}[name],
                        f"turned off ({name}=False)")
    _pair_guidance(report, target, classes, pair_guidance)
    return report


def _require_fp8_blocks(transformer) -> None:
    """UsageError (exit 2) unless every block can run in FP8; exit 4 on a GPU without FP8 tensor cores."""
    from ltxbench.inject import run_device
    from ltxbench.inject.fp8 import require_fp8

    require_fp8(run_device(transformer))
    reason = unquantizable(transformer.blocks)
    if reason is not None:
        raise UsageError(f"precision fp8: {reason}", hint="run this model in bf16")


def _pair_guidance(report, target, classes: dict, wanted: bool) -> None:
    """The guidance pair rule (pair.py) on a pipeline's experts, its generations scoped by the pipeline's call."""
    from ltxbench.inject import generation_call, generation_scope
    from ltxbench.inject.wan.pair import PAIR_ATTR, PAIR_RULE, GuidancePair, encode_and_keep, pair_call

    if not wanted:
        report.skip(PAIR_RULE, "turned off (pair_guidance=False)")
        return
    if not hasattr(target, "transformer"):  # the pair needs the pipeline's negative prompt: a pipeline's rule
        return
    from diffusers import WanTransformer3DModel

    denoisers = [module for name, module in experts(target) if not offloaded(module)]
    if not denoisers:
        return
    other = next((m for m in denoisers if original_class(m) is not WanTransformer3DModel), None)
    if other is not None:  # VACE's and Animate's take per-sample inputs beside the three the pair stacks
        report.skip(PAIR_RULE, f"{original_class(other).__name__} is not WanTransformer3DModel: its other inputs "
                               "would not be stacked with the pair")
        return
    pair = GuidancePair()
    for module in denoisers:
        vars(module)[PAIR_ATTR] = pair
        report.on_revert(lambda module=module: vars(module).pop(PAIR_ATTR, None))
        patch_call(report, PAIR_RULE, module, pair_call, classes)
    own = vars(target).get("encode_prompt", _NONE)  # a wrapper of the user's: given back at revert
    vars(target)["encode_prompt"] = encode_and_keep(pair, target.encode_prompt)
    report.on_revert(lambda: vars(target).pop("encode_prompt", None) if own is _NONE
                     else vars(target).__setitem__("encode_prompt", own))
    patch_call(report, GENERATION_RULE, target, generation_call(
        lambda pipe: generation_scope(pipe, PAIR_ATTR, lambda _pipe: pair.forget())), {})


_NONE = object()


def _patch_expert(report, transformer, ops, forwards: dict, prefix: str, classes: dict, *, blocks: bool,
                  qk_norms: bool, qk_rope: bool, gelu: bool, attention8=None) -> None:
    """The rules on one transformer's blocks, into `report` (skips named from `prefix`)."""
    width = transformer.blocks[0].scale_shift_table.shape[-1]
    if not blocks:
        if not prefix:  # said once
            report.skip(BLOCK_RULE, "turned off (blocks=False)")
    elif report.provider == "cuda" and width > MAX_F32_MODULATION_ROW:
        report.skip(f"{prefix}{BLOCK_RULE}", f"blocks {width} wide: the cuda provider's float32-modulation rows take "
                                             f"at most {MAX_F32_MODULATION_ROW}")
    else:
        for index, block in enumerate(transformer.blocks):
            reason = _block_refusal(block)
            if reason:
                report.skip(f"{prefix}blocks.{index}", reason)
            else:
                patch_forward(report, BLOCK_RULE, block, forwards["block"], classes)
    for index, block in enumerate(transformer.blocks):
        fused = False
        if qk_rope:
            reason = qk_rope_refusal(block.attn1)
            if reason:
                report.skip(f"{prefix}blocks.{index}.attn1", reason)
            else:
                patch_call(report, QK_ROPE_RULE, block.attn1.processor, forwards["attn1"], classes)
                if attention8 is not None:
                    report.note(ATTN1_FP8_RULE.format(attention8.name))
                fused = True
        for attn_name in (("attn2",) if fused else ("attn1", "attn2")) if qk_norms else ():
            for norm_name in ("norm_q", "norm_k"):
                norm = getattr(getattr(block, attn_name), norm_name)
                if type(norm) is not torch.nn.RMSNorm or norm.weight is None:
                    report.skip(f"{prefix}blocks.{index}.{attn_name}.{norm_name}", "not an affine torch.nn.RMSNorm")
                    continue
                patch_forward(report, QK_NORM_RULE, norm, forwards["rms"], classes)
        if gelu:
            layer = block.ffn.net[0]
            reason = _gelu_refusal(layer)
            if reason:
                report.skip(f"{prefix}blocks.{index}.ffn", reason)
            else:
                patch_forward(report, GELU_RULE, layer, forwards["gelu"], classes)
