"""FlashAttention-3 stood in for on the CPU (attention in fp32), for the tests of --attention-backend fa3 and auto."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch


def _attention(q, k, v, softmax_scale=None, scale_error=1.0):
    """softmax(q kᵀ · scale) v per (batch, head) in fp32 on (B, S, H, D), and its log-sum-exp (B, H, S)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.float()) * scale_error
    return out.to(q.dtype).contiguous(), scores.logsumexp(-1)  # contiguous (B, S, H, D), as the kernel writes it


class StandIn:
    """FlashAttention-3's flash_attn_func as math, counting its calls; `scale_error` 1.01 is a 1% wrong kernel."""

    def __init__(self, scale_error: float = 1.0):
        self.calls, self.scale_error = [], scale_error

    def __call__(self, q, k, v, softmax_scale=None, causal=False, return_attn_probs=False, **_):
        assert not causal
        self.calls.append(tuple(q.shape))
        out, lse = _attention(q, k, v, softmax_scale, self.scale_error)
        return (out, lse) if return_attn_probs else out


def _module(name: str, func) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.flash_attn_func = func
    return module


@pytest.fixture(scope="session")
def diffusers_flash_3_on_the_cpu():
    """diffusers' `_flash_3` op has a CUDA kernel only: a CPU one calling the same function, for the stand-in."""
    from diffusers.models import attention_dispatch as dispatch

    def cpu(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, v_descale=None,
            attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0):
        out, lse = dispatch.flash_attn_3_func(q=q, k=k, v=v, softmax_scale=softmax_scale, causal=causal,
                                              return_attn_probs=True)
        return out, lse.permute(0, 2, 1)

    dispatch._wrapped_flash_attn_3.register_kernel("cpu")(cpu)


@pytest.fixture
def fa3_fwd(monkeypatch, diffusers_flash_3_on_the_cpu):
    """pip's fa3-fwd stood in for (the source build absent), diffusers' `_flash_3` unbound as diffusers leaves it."""
    from diffusers.models import attention_dispatch as dispatch

    stand_in = StandIn()
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", _module("fa3_fwd_interface", stand_in))
    monkeypatch.setattr(dispatch, "flash_attn_3_func", None)
    return stand_in
