"""LTXBENCH_QKV_ROPE_CACHE (on unless 0): a decode step's input norm, q/k/v, RoPE and static KV cache writes as one op
(rms_norm_qkv_rope_cache), on tiny fp32 models (CPU, reference provider); the op itself: tests/ops."""

from __future__ import annotations

import types
from collections import Counter

import pytest
import torch

from ltxbench.inject import llm
from ltxbench.inject.llm.norm_fusion import ROPE_CACHE_KNOB
from ltxbench.ops import norm_linear, reference
from tests.helpers import llm_build, llm_decode_steps

OPS = ("rms_norm", "fused_add_rms_norm", "swiglu", "rope_1d", "linear", "rope_1d_cache", "decode_attention",
       "rms_norm_linear", "add_rms_norm_linear", "rms_norm_qkv_rope_cache")


def provider(calls: Counter, change=None):
    """The reference provider counting calls per op; `change` wraps rms_norm_qkv_rope_cache (a mutation)."""

    def wrap(name):
        fn = getattr(reference if hasattr(reference, name) else norm_linear.reference, name)
        if change is not None and name == "rms_norm_qkv_rope_cache":
            fn = change(fn)

        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    return types.SimpleNamespace(**{n: wrap(n) for n in OPS})


def decode(model, monkeypatch, knob: str | None, change=None, compiled=False):
    """(logits, caches, calls) of llm_decode_steps on the patched model, the knob set to `knob` (None: unset)."""
    calls: Counter = Counter()
    monkeypatch.setattr(llm, "get_provider", lambda name: provider(calls, change))
    if knob is None:
        monkeypatch.delenv(ROPE_CACHE_KNOB, raising=False)
    else:
        monkeypatch.setenv(ROPE_CACHE_KNOB, knob)
    torch._dynamo.reset()
    with llm.apply_kernels(model, "reference"):
        logits, caches = llm_decode_steps(model, compiled=compiled)
    return logits, caches, calls


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_decode_steps_take_one_op_for_norm_qkv_rope_and_cache_writes(model_type, monkeypatch):
    """With the knob on, every decode-step layer that wrote its static cache layer with rope_1d_cache (batch 2: 2
    rows; Llama: all, Mistral's sliding layers none) runs rms_norm_qkv_rope_cache instead; the logits of three steps
    and every cached row and length equal the unpatched model's (fp32 reference math: to rounding). Unset (the
    default) is on; 0 runs the two-op path. Qwen2's q/k/v biases keep it off."""
    model = llm_build(model_type)
    expected, expected_cache = llm_decode_steps(model, compiled=False)
    two_op = None
    for knob, fused in (("0", False), (None, model_type != "qwen2"), ("1", model_type != "qwen2")):
        got, got_cache, calls = decode(model, monkeypatch, knob)
        two_op = calls["rope_1d_cache"] if two_op is None else two_op
        assert calls["rms_norm_qkv_rope_cache"] == (two_op if fused else 0), knob
        assert calls["rope_1d_cache"] == (0 if fused else two_op), knob
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        for (k, v, length), (k0, v0, length0) in zip(got_cache, expected_cache, strict=True):
            assert length == length0
            torch.testing.assert_close(k, k0, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(v, v0, atol=1e-6, rtol=1e-5)
    if model_type == "llama":
        assert two_op == 3 * len(model.model.layers)


def test_compiled_decode_steps_with_the_fused_op_match_the_unpatched_model(monkeypatch):
    """The same under torch.compile(fullgraph=True), as generate() compiles a decode step: the op's fake keeps it in
    the graph, and the cache's length still advances once a step."""
    model = llm_build("llama")
    expected, expected_cache = llm_decode_steps(model, compiled=False)
    got, got_cache, _ = decode(model, monkeypatch, "1", compiled=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for (k, v, length), (k0, v0, length0) in zip(got_cache, expected_cache, strict=True):
        assert length == length0 == 9
        torch.testing.assert_close(k, k0, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(v, v0, atol=1e-6, rtol=1e-5)


def _rotation_off_by_one_percent(fn):
    def changed(x, norm_weight, eps, weight, cos, sin, k_cache, v_cache, offset, weight_offset=0.0):
        return fn(x, norm_weight, eps, weight, cos, sin * 1.01, k_cache, v_cache, offset, weight_offset)

    return changed


def _rows_one_late(fn):
    def changed(x, norm_weight, eps, weight, cos, sin, k_cache, v_cache, offset, weight_offset=0.0):
        return fn(x, norm_weight, eps, weight, cos, sin, k_cache, v_cache, offset + 1, weight_offset)

    return changed


@pytest.mark.parametrize("change", [_rotation_off_by_one_percent, _rows_one_late])
def test_the_decode_parity_fails_for_a_one_percent_rotation_error_or_a_stale_cache_row(change, monkeypatch):
    """The parity above can fail: sin 1% too large in the fused op, or k and v written one row late (a length that
    ran ahead), move the logits or the cached rows beyond its tolerance."""
    model = llm_build("llama")
    expected, expected_cache = llm_decode_steps(model, compiled=False)
    got, got_cache, calls = decode(model, monkeypatch, "1", change=change)
    assert calls["rms_norm_qkv_rope_cache"] > 0
    same_logits = torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    same_cache = all(torch.allclose(k, k0, atol=1e-6, rtol=1e-5)
                     for (k, _, _), (k0, _, _) in zip(got_cache, expected_cache, strict=True))
    assert not (same_logits and same_cache)


@pytest.mark.gpu
def test_cuda_decode_steps_give_the_two_op_paths_bits(monkeypatch):
    """Compiled bf16 decode steps of a tiny Llama with our CUDA kernels: the fused op gives the logits and the caches
    of the two-op path bit for bit (its bits are rms_norm_linear's, then rope_1d_cache's: tests/ops)."""
    model = llm_build("llama", dtype=torch.bfloat16, device="cuda")
    calls: list = []  # a list append: a side effect dynamo keeps inside a fullgraph compile
    fused_op = norm_linear.rms_norm_qkv_rope_cache

    def counted(*args, **kwargs):
        calls.append(1)
        return fused_op(*args, **kwargs)

    monkeypatch.setattr(norm_linear, "rms_norm_qkv_rope_cache", counted)
    runs, seen = {}, {}
    for knob in ("0", "1"):
        monkeypatch.setenv(ROPE_CACHE_KNOB, knob)
        torch._dynamo.reset()
        calls.clear()
        with llm.apply_kernels(model, "cuda"):
            runs[knob] = llm_decode_steps(model, compiled=True, device="cuda")
        seen[knob] = len(calls)
    assert seen["1"] > 0 and seen["0"] == 0  # the fused op is in the compiled steps with the knob on, only then
    (got, got_cache), (want, want_cache) = runs["1"], runs["0"]
    assert torch.equal(got, want)
    for (k, v, length), (k0, v0, length0) in zip(got_cache, want_cache, strict=True):
        assert length == length0 == 9 and torch.equal(k, k0) and torch.equal(v, v0)

