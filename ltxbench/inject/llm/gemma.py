"""Gemma 3's rules (model_type gemma3_text, and the text tower of gemma3): transformers 5.x Gemma3RMSNorm,
Gemma3DecoderLayer, Gemma3MLP and Gemma3Attention, computed with the ops only where they give Gemma's own numbers.

  Gemma3RMSNorm: `(x.float() · rsqrt(mean(x²) + eps)) · (1 + weight.float())`, rounded once to x's dtype
      → ops.rms_norm(x, weight, eps, weight_offset=1): the kernel adds the 1 to the weight in fp32 as it reads it
      and multiplies in fp32 (no `1 + weight` tensor, which rounded to bf16 would be a rounding Gemma does not do).
      A weight in another dtype than the rows (mixed precision) runs on fp32 copies, rounded once.
  decoder layer (sandwich norms): `residual + post_attention_layernorm(attn)` and pre_feedforward_layernorm
      → ops.fused_add_rms_norm(..., weight_offset=1): the sum rounded to the rows' dtype, as torch's add, then
      normalized.
      `residual + post_feedforward_layernorm(mlp)` stays an add: the norm sits between the down projection and the
      residual, so the GEMM cannot accumulate into it.
  MLP `down(gelu_tanh(gate(x)) · up(x))` → one [gate | up] GEMM + ops.geglu(gate_half=0, approximate=True).
  attention: q/k/v as one GEMM, q_norm/k_norm (Gemma3RMSNorm per head, the rule above) and RoPE through
      ops.rope_1d from the per-layer-type (cos, sin) the model passes (attention.py: the LLaMA rule, whose tables
      keep one pair per layer type).
The embedding (`embed · sqrt(hidden)` in the embedding's dtype) and the logit soft-capping stay transformers'.
"""

from __future__ import annotations

import functools
import inspect

import torch.nn.functional as F

from ltxbench.inject import observed, original_class, patch_forward, source_of
from ltxbench.inject.fuse import fused_linear
from ltxbench.inject.llm import (  # the package loads before it imports this
    FUSED_ATTR,
    NORM_ROWS,
    RULE_DECODE,
    fuse_gate_up,
    patch_projections,
    verified,
)
from ltxbench.inject.llm.attention import (
    ATTN_SOURCE,
    CACHE_UPDATE_KWARGS,
    RULE_ROPE,
    attn_forward,
    fuse_qkv,
    linear_forward,
    projection_linear,
)

GEMMA_FAMILIES = {"gemma3_text": "Gemma3", "gemma3": "Gemma3"}  # model_type -> class prefix
RULE_NORM = "gemma rms_norm (1 + weight)"
RULE_LAYER = "gemma decoder layer: residual + pre_feedforward_layernorm (fused_add_rms_norm)"
RULE_MLP = "gemma mlp: fused gate_up projection + geglu (tanh GELU)"
RULES = (RULE_NORM, RULE_LAYER, RULE_MLP, RULE_ROPE, RULE_DECODE)

# Source fragments of the transformers 5.x code reproduced here: a release that rewrites them is skipped.
NORM_SOURCE = ("output = self._norm(x.float())", "output = output * (1.0 + self.weight.float())",
               "return output.type_as(x)")
NORM_MATH = ("x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",)  # Gemma3RMSNorm._norm
LAYER_SOURCE = ("residual = hidden_states", "hidden_states = self.input_layernorm(hidden_states)",
                "hidden_states = self.post_attention_layernorm(hidden_states)",
                "hidden_states = self.pre_feedforward_layernorm(hidden_states)",
                "hidden_states = self.mlp(hidden_states)",
                "hidden_states = self.post_feedforward_layernorm(hidden_states)",
                "hidden_states = residual + hidden_states")
MLP_SOURCE = ("self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",)
ATTN_QK_NORM = ("query_states = self.q_norm(query_states)", "key_states = self.k_norm(key_states)",
                "sliding_window=self.sliding_window")



def text_model(model):
    """The Gemma3TextModel of a Gemma3ForCausalLM, a Gemma3ForConditionalGeneration or a Gemma3Model."""
    inner = getattr(model, "model", model)
    return getattr(inner, "language_model", inner)


# ---- RMSNorm ------------------------------------------------------------------------------------------

def gemma_rms_norm(ops, norm, x):
    """Gemma3RMSNorm's numbers through ops.rms_norm, or None for rows it would not reproduce (not fp32/16-bit:
    Gemma computes float64 rows in fp32)."""
    if x.dtype not in NORM_ROWS:
        return None
    if norm.weight.dtype == x.dtype:
        return ops.rms_norm(x, norm.weight, norm.eps, weight_offset=1.0)
    return ops.rms_norm(x.float(), 1.0 + norm.weight.float(), norm.eps).to(x.dtype)


def _norm_forward(ops):
    def forward(self, x):
        out = None if self.weight.is_meta else gemma_rms_norm(ops, self, x)  # meta: offloaded, its hook runs it
        return original_class(self).forward(self, x) if out is None else out

    return forward


# ---- decoder layer ------------------------------------------------------------------------------------

def _layer_forward(ops):
    """Gemma3DecoderLayer.forward with the attention residual and pre_feedforward_layernorm fused (rows and weight of
    one fp32 or 16-bit dtype). Arguments after hidden_states by keyword, as the model passes them; the KV cache goes
    on in `kwargs`."""

    def forward(self, hidden_states, *, position_embeddings=None, attention_mask=None, position_ids=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                          attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states)
        pre = self.pre_feedforward_layernorm
        if (hidden_states.dtype == residual.dtype == pre.weight.dtype and hidden_states.dtype in NORM_ROWS
                and not pre.weight.is_meta and not observed(pre)):  # hooked: it must run itself
            hidden_states, residual = ops.fused_add_rms_norm(hidden_states, residual, pre.weight, pre.eps,
                                                             weight_offset=1.0)
        else:
            residual = residual + hidden_states
            hidden_states = pre(residual)
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return residual + hidden_states

    return forward


# ---- MLP ----------------------------------------------------------------------------------------------

def _mlp_forward(ops, linear):
    def forward(self, x):
        gate_up = fused_linear(x, (self.gate_proj, self.up_proj), vars(self).get(FUSED_ATTR), linear)
        if gate_up is None:  # the fused weights cannot stand for the layers (moved, replaced, training)
            return original_class(self).forward(self, x)
        return self.down_proj(ops.geglu(gate_up, 0, True))

    return forward


def _tanh_gelu(mlp) -> bool:
    """GELUTanh running F.gelu(approximate="tanh") (not its Python formula, which rounds differently)."""
    from transformers.activations import GELUTanh

    act = getattr(mlp.act_fn, "act", None)
    return (isinstance(mlp.act_fn, GELUTanh) and isinstance(act, functools.partial) and act.func is F.gelu
            and act.keywords == {"approximate": "tanh"} and not act.args)


# ---- entry point --------------------------------------------------------------------------------------

def apply_gemma(model, ops, report, tuned_gemm: bool = False) -> None:
    """Patch the Gemma 3 text model of `model` in place (llm.apply_kernels calls this for GEMMA_FAMILIES; tuned_gemm
    as there)."""
    base = text_model(model)
    classes: dict = {}
    norm_forward = _norm_forward(ops)
    norms_ok = {}
    for name, module in base.named_modules():
        if type(module).__name__.endswith("RMSNorm"):
            cls = type(module)
            norms_ok[name] = verified(report, RULE_NORM, module, "Gemma3RMSNorm",
                                      ((cls.forward, NORM_SOURCE), (getattr(cls, "_norm", None), NORM_MATH)))
            if norms_ok[name]:
                patch_forward(report, RULE_NORM, module, norm_forward, classes)
    linear = projection_linear(ops, tuned_gemm)
    layer_forward, mlp_forward = _layer_forward(ops), _mlp_forward(ops, linear)
    projection_forward = linear_forward(linear)
    rope_cache: dict = {}
    attn_forwards: dict = {}
    for index, layer in enumerate(base.layers):
        sandwich = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                    "post_feedforward_layernorm")
        if not all(norms_ok.get(f"layers.{index}.{n}") for n in sandwich):
            report.skip(RULE_LAYER, f"layers.{index}: its norms are not verified")
        elif verified(report, RULE_LAYER, layer, "Gemma3DecoderLayer", ((type(layer).forward, LAYER_SOURCE),)):
            patch_forward(report, RULE_LAYER, layer, layer_forward, classes)
        _patch_mlp(report, layer.mlp, index, mlp_forward, classes)
        attn = layer.self_attn
        if not (norms_ok.get(f"layers.{index}.self_attn.q_norm") and norms_ok.get(f"layers.{index}.self_attn.k_norm")):
            report.skip(RULE_ROPE, f"layers.{index}: q_norm/k_norm not verified")
        elif verified(report, RULE_ROPE, attn, "Gemma3Attention", ((type(attn).forward, ATTN_FRAGMENTS),)):
            if type(attn) not in attn_forwards:
                eager = inspect.getmodule(type(attn)).eager_attention_forward
                new_cache_api = CACHE_UPDATE_KWARGS in source_of(type(attn).forward)  # 5.24+; 5.17: past_key_values
                attn_forwards[type(attn)] = attn_forward(ops, linear, rope_cache, _sliding, eager, True,
                                                         new_cache_api)
            patch_forward(report, RULE_ROPE, attn, attn_forwards[type(attn)], classes)
            fuse_qkv(report, attn, index)
        patch_projections(report, [(f"layers.{index}.self_attn.o_proj", attn.o_proj),
                                   (f"layers.{index}.mlp.down_proj", getattr(layer.mlp, "down_proj", None))],
                          projection_forward, classes)
    if getattr(model, "lm_head", None) is not None:
        patch_projections(report, [("lm_head", model.lm_head)], projection_forward, classes)


def _sliding(attn) -> dict:
    return {"sliding_window": attn.sliding_window}  # None on the global layers, as the original passes it


ATTN_FRAGMENTS = (*ATTN_SOURCE, *ATTN_QK_NORM)


def _patch_mlp(report, mlp, index: int, mlp_forward, classes) -> None:
    if not verified(report, RULE_MLP, mlp, "Gemma3MLP", ((type(mlp).forward, MLP_SOURCE),)):
        return
    if not _tanh_gelu(mlp):
        report.skip(RULE_MLP, f"layers.{index}: activation {type(mlp.act_fn).__name__} is not F.gelu(tanh)")
    else:
        fuse_gate_up(report, RULE_MLP, mlp, index, mlp_forward, classes)
