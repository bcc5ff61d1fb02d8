"""A Llama-family decoder layer's forward and its MLP's, as the rules of ltxbench.inject.llm patch them in: the
attention residual and post_attention_layernorm fused (or, on a decode step's rows, folded into the gate/up GEMV:
norm_fusion.py), the MLP's gate and up projections as one GEMM + swiglu, the down projection adding the residual."""

from __future__ import annotations

import torch

from ltxbench.inject import observed, original_class
from ltxbench.inject.fuse import fused_linear, unobserved
from ltxbench.inject.llm import norm_fusion
from ltxbench.inject.llm.attention import decode_rows
from ltxbench.inject.llm.norm_fusion import NORM_ROWS, eps_of

FUSED_ATTR = "_ltxbench_gate_up"  # FusedWeights: [gate | up] (2I, H), gate/up weights are views of it


# ---- decoder layer ------------------------------------------------------------------------------------

def layer_forward(ops, linear, tuned_gemm: bool):
    """XDecoderLayer.forward (returns the hidden states tensor) with the attention residual and
    post_attention_layernorm fused. Arguments after hidden_states by keyword, as the models pass them; the KV
    cache goes on to the attention in `kwargs` under the name the caller used (`past_key_values` or `cache`).
    `linear`: the gate/up GEMM's (projection_linear); `tuned_gemm`: the down projection's too, for any rows."""

    fold_norms = norm_fusion.enabled()  # a decode step's norms inside the GEMVs after them (norm_fusion.py)

    def forward(self, hidden_states, *, attention_mask=None, position_ids=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        if fold_norms and norm_fusion.attention_takes_input_norm(self.self_attn, self.input_layernorm, hidden_states):
            kwargs = {**kwargs, norm_fusion.INPUT_NORM_KWARG: self.input_layernorm}
        else:
            hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
        post = self.post_attention_layernorm
        # meta: offloaded; observed: hooked, it must run itself
        if (post.weight.dtype == hidden_states.dtype == residual.dtype and hidden_states.dtype in NORM_ROWS
                and not post.weight.is_meta and not observed(post)):
            out = _post_norm_in_gate_up(ops, self.mlp, hidden_states, residual, post) if fold_norms else None
            if out is not None:
                return out
            hidden_states, residual = ops.fused_add_rms_norm(hidden_states, residual, post.weight, eps_of(post),
                                                             cast_before_weight=True)
            out = _mlp_into_residual(ops, linear, self.mlp, hidden_states, residual, tuned_gemm)
            if out is not None:
                return out
        else:
            residual = residual + hidden_states
            hidden_states = post(residual)
        return residual + self.mlp(hidden_states)

    return forward


def _down_takes_residual(mlp, residual) -> bool:
    """The down projection may add `residual` in its GEMM: a plain nn.Linear (an adapter put in its place runs its own
    forward), unhooked since the injection, without bias, in the residual's dtype, no gradients, the MLP unhooked (a
    hooked MLP must run itself)."""
    down = mlp.down_proj
    return not (original_class(down) is not torch.nn.Linear or down.bias is not None
                or down.weight.dtype != residual.dtype or torch.is_grad_enabled() or not unobserved(down)
                or observed(mlp))


def _post_norm_in_gate_up(ops, mlp, attn_out, residual, post):
    """`h + mlp(post_attention_layernorm(h))`, h = residual + attn_out, with the add, the norm and the SwiGLU inside the
    gate/up GEMV (norm_fusion.py) and h added by the down projection's; None where that path does not apply."""
    if not _down_takes_residual(mlp, residual):
        return None
    fused = norm_fusion.swiglu_with_post_norm(ops, mlp, vars(mlp).get(FUSED_ATTR), attn_out, residual, post)
    if fused is None:
        return None
    act, h = fused
    return ops.linear(act, mlp.down_proj.weight, None, "none", h)


def _mlp_into_residual(ops, linear, mlp, x, residual, tuned_gemm: bool):
    """`residual + mlp(x)` with the down projection's GEMM accumulating into `residual` (beta = 1: ops.linear for a
    decode step's rows and, with tuned_gemm, for any; else torch's addmm in place), or None when the MLP is not our
    patched one or its down projection cannot take the residual (_down_takes_residual). Only for a residual this layer
    created (fused_add_rms_norm's output): nobody else holds it."""
    down = mlp.down_proj
    if not _down_takes_residual(mlp, residual):
        return None
    act = _gate_up_swiglu(ops, linear, mlp, x)
    if act is None:
        return None
    if tuned_gemm or decode_rows(act):  # the GEMV kernel or the tuned GEMM adds the residual (not in place)
        return ops.linear(act, down.weight, None, "none", residual)
    rows, act_rows = residual.view(-1, residual.shape[-1]), act.view(-1, act.shape[-1])
    if torch.compiler.is_compiling():  # functionalized, the in-place form costs a copy back into `residual`
        return torch.addmm(rows, act_rows, down.weight.t()).view(residual.shape)
    rows.addmm_(act_rows, down.weight.t())
    return residual


# ---- MLP ----------------------------------------------------------------------------------------------

def _gate_up_swiglu(ops, linear, mlp, x):
    """`silu(gate(x)) * up(x)` as one [gate | up] GEMM (`linear`: projection_linear) + ops.swiglu, or None when the
    fused weights cannot stand for the layers (not fused here, moved/replaced, or training)."""
    gate_up = fused_linear(x, (mlp.gate_proj, mlp.up_proj), vars(mlp).get(FUSED_ATTR), linear)
    return None if gate_up is None else ops.swiglu(gate_up, 0)


def mlp_forward(ops, linear):
    def forward(self, x):
        act = _gate_up_swiglu(ops, linear, self, x)
        if act is None:
            return original_class(self).forward(self, x)  # the original math
        return self.down_proj(act)

    return forward
