"""Kernel injection into transformers' LLaMA-family decoders: llama, mistral, qwen2, qwen3 (transformers 5.x);
Gemma 3 (gemma3_text, and gemma3's text tower) has its own rules in gemma.py.

Rules (docs/models.md has the math):
  RMSNorm (input/post-attention/final, Qwen3 q_norm/k_norm) → ops.rms_norm(cast_before_weight=True)
  decoder layer: `residual + attn` and post_attention_layernorm → ops.fused_add_rms_norm
                 `residual + mlp`                               → down_proj GEMM accumulating into the residual
                                                                  (addmm_, beta 1: no separate add kernel)
  MLP: gate_proj and up_proj as ONE [gate | up] projection      → F.linear + ops.swiglu + down_proj
  attention: q_proj/k_proj/v_proj as ONE projection; apply_rotary_pos_emb → ops.rope_1d   (attention.py)
  a decode step's projections and lm_head (at most 4 rows)      → ops.linear: its GEMV kernel (cuda/gemv.cu)
  a prompt's projections (tuned_gemm)                           → ops.linear: cuBLASLt, algorithm chosen by timing
  static cache lengths the layers wrote                        → advanced once per forward (attention.py)
Anything else (unknown classes, forwards already wrapped by hooks, forwards whose
source differs from the code reproduced here) is skipped with a reason, never patched. Inference only: a
forward that would need gradients through the fused MLP weight runs the original forward instead.

RoPE tables: built from the (cos, sin) position_embeddings that the model passes to every layer, not from
the rotary embedding's inv_freq and position_ids. Those cos/sin ARE what the unpatched model rotates with,
so this is right for every rope_type (llama3, yarn, and dynamic/longrope whose inv_freq changes with the
length), for any position_ids (left padding, packed sequences, a KV-cache offset with a dynamic or static
cache) and past max_position_embeddings, and rounds cos/sin as the unpatched model does (bf16 in a bf16
model), with no GPU sync to validate positions. The table is cos[..., :hd/2] (the halves are duplicated
for rotate-half) as fp32 ((B|1)·S, hd/2), one row per token, passed without positions (the kernel reads the
token's own row, with no position load to wait for): one small copy per forward, shared by all layers
(cached on the identity of the cos/sin tensors in eager mode; computed in the graph under torch.compile).
"""

from __future__ import annotations

import inspect

import torch

from ltxbench.inject import (
    OFFLOADED,
    ORIGINAL_CLASS,
    InjectionReport,
    all_or_nothing,
    forward_source,
    offloaded,
    original_class,
    patch_forward,
    require_provider,
    run_device,
    source_of,
)
from ltxbench.inject.fuse import follow_moves, fuse_linears, release
from ltxbench.inject.llm.attention import (
    ATTN_SOURCE,
    CACHE_UPDATE_KWARGS,
    RULE_LENGTHS,  # noqa: F401  (the report names it: llm.RULE_LENGTHS)
    RULE_ROPE,
    advance_lengths_once,
    attn_forward,
    fuse_qkv,
    linear_forward,
    projection_linear,
    sliding_kwarg,
)
from ltxbench.inject.llm.layer import FUSED_ATTR, layer_forward, mlp_forward
from ltxbench.inject.llm.norm_fusion import NORM_ROWS, eps_of
from ltxbench.ops import get_provider

FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
RULE_NORM = "rms_norm"
RULE_LAYER = "decoder layer: residual + post_attention_layernorm (fused_add_rms_norm)"
RULE_MLP = "mlp: fused gate_up projection + swiglu"
RULE_DECODE = "o_proj, down_proj, lm_head: a decode step's rows (at most 4) through ops.linear's GEMV kernel"
RULES = (RULE_NORM, RULE_LAYER, RULE_MLP, RULE_ROPE, RULE_DECODE)

# Source fragments of the transformers 5.x forwards reproduced here (a tuple: one of them): a release that rewrites
# them is skipped (the attention's: attention.py).
LAYER_SOURCE = ("residual = hidden_states", "hidden_states = self.input_layernorm(hidden_states)",
                "hidden_states = residual + hidden_states", "self.post_attention_layernorm(hidden_states)",
                "hidden_states = self.mlp(hidden_states)")
MLP_SOURCE = ("self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",)


def source_has(function, fragments) -> bool:
    """Every fragment in `function`'s source (a tuple: one of its alternatives)."""
    src = source_of(function)
    return all(any(f in src for f in ((f,) if isinstance(f, str) else f)) for f in fragments)


def _matches(cls, fragments) -> bool:
    return source_has(cls.forward, fragments)


# ---- RMSNorm ------------------------------------------------------------------------------------------


def _norm_forward(ops):
    def forward(self, hidden_states):
        # transformers promotes to the weight's dtype (ops don't), and computes float64 rows in float32
        if self.weight.dtype != hidden_states.dtype or hidden_states.dtype not in NORM_ROWS:
            return original_class(self).forward(self, hidden_states)
        return ops.rms_norm(hidden_states, self.weight, eps_of(self), cast_before_weight=True)

    return forward


def _silu(mlp) -> bool:
    from transformers.activations import SiLUActivation

    return isinstance(mlp.act_fn, (SiLUActivation, torch.nn.SiLU))


# ---- entry point --------------------------------------------------------------------------------------

def verified(report, rule, module, class_name: str, sources=()) -> bool:
    """`module` is an unpatched `class_name` without a hook on its forward, and each (function, fragments) of
    `sources` holds its fragments (the transformers 5.x code a rule reproduces); else a skip saying why."""
    cls = type(module)
    differs = next((function for function, fragments in sources if not source_has(function, fragments)), None)
    if ORIGINAL_CLASS in vars(cls):
        report.skip(rule, f"{cls.__name__} is patched by ltxbench already: left as is")
    elif cls.__name__ != class_name:
        report.skip(rule, f"{cls.__name__} is not {class_name}: its math is not verified")
    elif "forward" in vars(module):
        report.skip(rule, f"{cls.__name__}.forward is already wrapped by a hook (offload, compile): left as is")
    elif differs is not None:
        report.skip(rule, f"{cls.__name__}.{getattr(differs, '__name__', 'forward')} differs from the transformers "
                          "5.x code this rule reproduces")
    else:
        return True
    return False


def _patch(report, rule, module, forward, name: str, prefix: str, classes: dict, needs: tuple = ()) -> bool:
    """Patch module's forward unless its class is not the expected one, its source differs, a hook owns it or it
    is patched already."""
    if not verified(report, rule, module, f"{prefix}{name}", ((type(module).forward, needs),) if needs else ()):
        return False
    patch_forward(report, rule, module, forward, classes)
    return True


def patch_projections(report, linears, forward, classes) -> None:
    """o_proj / down_proj / lm_head (plain nn.Linear, unhooked, unpatched) run `forward` (attention.linear_forward);
    any other layer is left as it is, with the reason."""
    for name, layer in linears:
        if type(layer) is not torch.nn.Linear:
            report.skip(RULE_DECODE, f"{name}: {type(layer).__name__} is not a plain nn.Linear: left as is")
        elif "forward" in vars(layer) or layer._forward_pre_hooks or layer._forward_hooks:
            report.skip(RULE_DECODE, f"{name}: its forward is wrapped or hooked: left as is")
        else:
            patch_forward(report, RULE_DECODE, layer, forward, classes)


def fuse_gate_up(report, rule: str, mlp, index: int, mlp_forward, classes) -> None:
    """The MLP's gate and up projections fused into one GEMM (kept as FUSED_ATTR, released at revert, fused again
    after a move) and its forward patched; skipped with the reason where the two cannot fuse."""
    fused = fuse_linears((mlp.gate_proj, mlp.up_proj))
    if isinstance(fused, str):
        report.skip(rule, f"layers.{index}: gate_proj/up_proj: {fused}")
        return
    setattr(mlp, FUSED_ATTR, fused)
    report.on_revert(lambda m=mlp: release(vars(m).pop(FUSED_ATTR)))
    follow_moves(report, mlp, fused)
    patch_forward(report, rule, mlp, mlp_forward, classes)


@all_or_nothing
def apply_kernels(model, provider: str = "cuda", tuned_gemm: bool = True) -> InjectionReport:
    """Patch a llama/mistral/qwen2/qwen3/gemma3 causal LM (or its base model) in place; `report.revert()` restores
    every forward (the fused gate/up weights stay numerically identical views). tuned_gemm: a prompt's projections
    on ops.linear too (cuda: cuBLASLt with the algorithm per shape chosen by timing on its first call or taken from
    the choices stored for this GPU model, ops.load_gemm_choices; reference: its fp32-accumulating math), else
    torch's linear."""
    if offloaded(model):
        report = InjectionReport(provider)
        report.skip("model", OFFLOADED)
        return report
    ops = get_provider(provider)
    require_provider(provider, ops, model, "model")
    report = InjectionReport(provider)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    from ltxbench.inject.llm.gemma import GEMMA_FAMILIES, apply_gemma

    if tuned_gemm and provider == "cuda":  # earlier processes' searches on this GPU model (ops.gemm_cache)
        ops.load_gemm_choices(run_device(model))
    if model_type in GEMMA_FAMILIES:
        apply_gemma(model, ops, report, tuned_gemm)
        return report
    prefix = FAMILIES.get(model_type)
    if prefix is None:
        known = ", ".join((*FAMILIES, *GEMMA_FAMILIES))
        for rule in RULES:
            report.skip(rule, f"model_type {model_type!r} is not one of {known}: its norms/MLP/RoPE math is not "
                              "verified, nothing patched")
        return report
    base = getattr(model, "model", model)
    linear = projection_linear(ops, tuned_gemm)
    norm_forward, decoder_forward = _norm_forward(ops), layer_forward(ops, linear, tuned_gemm)
    gate_up_forward, projection_forward = mlp_forward(ops, linear), linear_forward(linear)
    classes: dict = {}  # (class, forward) -> its patched subclass
    norms_ok = {}
    for name, module in base.named_modules():
        if type(module).__name__.endswith("RMSNorm"):
            norms_ok[name] = _patch(report, RULE_NORM, module, norm_forward, "RMSNorm", prefix, classes)
    rope_cache: dict = {}
    attn_forwards: dict = {}  # attention class -> its forward (one patched subclass per class)
    for index, layer in enumerate(base.layers):
        if not norms_ok.get(f"layers.{index}.post_attention_layernorm"):
            report.skip(RULE_LAYER, f"layers.{index}: post_attention_layernorm not verified")
        else:
            _patch(report, RULE_LAYER, layer, decoder_forward, "DecoderLayer", prefix, classes, LAYER_SOURCE)
        mlp = layer.mlp
        if type(mlp).__name__ != f"{prefix}MLP" or not _matches(type(mlp), MLP_SOURCE):
            report.skip(RULE_MLP, f"layers.{index}: {type(mlp).__name__} is not the verified {prefix}MLP")
        elif not _silu(mlp):
            report.skip(RULE_MLP, f"layers.{index}: activation {type(mlp.act_fn).__name__} is not silu")
        elif "forward" in vars(mlp) or ORIGINAL_CLASS in vars(type(mlp)):
            report.skip(RULE_MLP, f"layers.{index}: mlp.forward is already wrapped (a hook, ltxbench): left as is")
        else:
            fuse_gate_up(report, RULE_MLP, mlp, index, gate_up_forward, classes)
        attn = layer.self_attn
        sliding = sliding_kwarg(type(attn))
        if sliding is None:
            report.skip(RULE_ROPE, f"layers.{index}: {type(attn).__name__} passes sliding_window in an unknown way")
        elif getattr(attn, "q_norm", None) is not None and not (norms_ok.get(f"layers.{index}.self_attn.q_norm")
                                                               and norms_ok.get(f"layers.{index}.self_attn.k_norm")):
            report.skip(RULE_ROPE, f"layers.{index}: q_norm/k_norm not verified")
        else:
            if type(attn) not in attn_forwards:
                eager = inspect.getmodule(type(attn)).eager_attention_forward
                qk_norm = getattr(attn, "q_norm", None) is not None
                new_cache_api = CACHE_UPDATE_KWARGS in forward_source(type(attn))
                attn_forwards[type(attn)] = attn_forward(ops, linear, rope_cache, sliding, eager, qk_norm,
                                                         new_cache_api)
            if _patch(report, RULE_ROPE, attn, attn_forwards[type(attn)], "Attention", prefix, classes, ATTN_SOURCE):
                fuse_qkv(report, attn, index)
        patch_projections(report, [(f"layers.{index}.self_attn.o_proj", attn.o_proj),
                                   (f"layers.{index}.mlp.down_proj", getattr(mlp, "down_proj", None))],
                          projection_forward, classes)
    if getattr(model, "lm_head", None) is not None:  # generate's last-token logits: the largest GEMV of a step
        patch_projections(report, [("lm_head", model.lm_head)], projection_forward, classes)
    if attn_forwards and report.rules[RULE_ROPE]:
        advance_lengths_once(report, base)
    return report
