"""FlashAttention-3 stood in for on the CPU (attention in fp32), for the tests of --attention-backend fa3 and auto."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import StandIn, stand_in_module


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
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", stand_in_module("fa3_fwd_interface", stand_in))
    monkeypatch.setattr(dispatch, "flash_attn_3_func", None)
    return stand_in
