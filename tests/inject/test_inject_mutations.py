"""The parity tests can fail: inputs of the magnitudes trained models have, and a 1% perturbation of each fused
formula in the patched path (shift, scale, gate, eps, RoPE angle, the residual fold; LLM: norm weight, eps, residual,
RoPE angle, SwiGLU; Gemma 3: its `1 + weight` (the weight, and the 1), eps, residual, RoPE angle, GEGLU, and GEGLU's
gate half and GELU form) must move the patched output past the parity tolerance (CPU, reference provider, fp32).

Random initializations damp the terms these formulas carry: diffusers' default modulation tables and timestep
embedding are ~1e-2, so a 10% error in the shift stayed below the tolerance. Here the modulation (tables and timestep
embedding) is of order 0.3-0.5, as trained DiT models carry, and one token is quiet (its mean square of the order of
the norm's eps), the one place where eps decides the result. The LLM keeps transformers' initialization: embeddings of
std 0.02 are what trained Llama-family checkpoints have, and there eps (1e-5) is a few percent of the mean square.
Gemma 3 (eps 1e-6) gets norm weights of a trained model's size and one quiet token, as the LTX transformer does.
"""

from __future__ import annotations

import math

import pytest
import torch

from ltxbench.inject import llm
from ltxbench.inject.ltx import apply_kernels
from tests.helpers import gemma_build, llm_build, llm_prompt, ltx_inputs, ltx_transformer, max_rel_error

# max |patched - unpatched| / max |unpatched|, fp32: the reference path is the same math op for op (0 measured on
# the CPU); the cuda kernels round differently (full fp32, no TF32: a few 1e-7)
PARITY_TOL = {"reference": 2e-6, "cuda": 2e-5}


def realistic_ltx(device="cpu"):
    """Tiny LTX transformer with trained-size modulation and a quiet first token; (model, inputs)."""
    model = ltx_transformer(device=device)
    inputs = ltx_inputs(model, device)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for table in [b.scale_shift_table for b in model.transformer_blocks] + [model.scale_shift_table]:
            table.copy_(0.3 * torch.randn(table.shape, generator=g))
        temb, _ = model.time_embed(inputs["timestep"].flatten(), batch_size=2, hidden_dtype=torch.float32)
        model.time_embed.linear.weight.mul_(0.5 / temb.std())
        model.time_embed.linear.bias.zero_()
        model.proj_in.bias.zero_()
        inputs["hidden_states"][:, 0] *= 1e-3  # proj_in of it: mean square ~1e-6, block 0's norm1 eps
    return model, inputs


def _provider(name: str):
    from ltxbench.ops import get_provider

    return get_provider(name)


def _scaled(name: str, **factors):
    """A mutation of op `name`: (provider -> the provider's op with the named arguments (where given, not None)
    multiplied by their factors)."""
    return lambda provider: _scaled_op(getattr(provider, name), **factors)


def _scaled_op(fn, **factors):
    import inspect

    signature = inspect.signature(fn)

    def mutated(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for arg, factor in factors.items():
            if bound.arguments.get(arg) is not None:
                bound.arguments[arg] = bound.arguments[arg] * factor
        return fn(*bound.args, **bound.kwargs)

    return mutated


def _rope_angle(provider):
    """rope_1d with every angle of its cos/sin tables 1% larger."""
    fn = provider.rope_1d

    def mutated(q, k, cos, sin, positions=None, interleaved=False):
        angle = torch.atan2(sin.float(), cos.float()) * PERTURBED
        return fn(q, k, angle.cos().to(cos.dtype), angle.sin().to(sin.dtype), positions, interleaved)

    return mutated


def _swiglu(provider):
    fn = provider.swiglu
    return lambda x, gate_half=0: fn(x, gate_half) * PERTURBED


PERTURBED = 1.01
LTX_MUTATIONS = {
    "shift": {op: _scaled(op, shift=PERTURBED) for op in ("rms_norm_modulate", "add_rms_norm_modulate",
                                                         "layer_norm_modulate")},
    "scale": {op: _scaled(op, scale=PERTURBED) for op in ("rms_norm_modulate", "add_rms_norm_modulate",
                                                         "layer_norm_modulate")},
    "gate": {op: _scaled(op, gate=PERTURBED) for op in ("gated_residual", "add_rms_norm_modulate")},
    "eps": {op: _scaled(op, eps=PERTURBED) for op in ("rms_norm_modulate", "add_rms_norm_modulate",
                                                     "layer_norm_modulate", "qk_rms_norm_rope", "rms_norm")},
    "rope angle": {"qk_rms_norm_rope": _scaled("qk_rms_norm_rope", freqs=PERTURBED)},
    "residual fold": {"linear": _scaled("linear", residual=PERTURBED)},
}


def _mutate(provider: str, mutation: dict, monkeypatch) -> None:
    from ltxbench.inject.llm.norm_fusion import norm_ops

    module = _provider(provider)
    for name, make in mutation.items():
        home = module if hasattr(module, name) else norm_ops(module)  # the fused norm + projection ops' own module
        monkeypatch.setattr(home, name, make(home))


def _ltx_error(provider="reference", mutation=None, monkeypatch=None) -> float:
    model, inputs = realistic_ltx("cpu" if provider == "reference" else "cuda")
    with torch.no_grad():
        expected = model(**inputs)[0]
        _mutate(provider, mutation or {}, monkeypatch)
        with apply_kernels(model, provider):
            got = model(**inputs)[0]
    return max_rel_error(got, expected)


def _check(family: str, error_of, mutations: dict, provider: str, formula, monkeypatch) -> None:
    """formula None: the clean patched path is within the tolerance; else its 1% mutation is well outside it."""
    tolerance = PARITY_TOL[provider]
    if formula is None:
        error = error_of(provider)
        print(f"{family} {provider}: clean {error:.3g}")
        assert error < tolerance
        return
    error = error_of(provider, mutations[formula], monkeypatch)
    print(f"{family} {provider}: 1% error in the {formula}: {error:.3g} (tolerance {tolerance:g})")
    assert error > 2 * tolerance, f"a 1% error in the {formula} moved the {family} output by only {error:.2e}"


def _check_ltx(provider, formula, monkeypatch):
    _check("LTX", _ltx_error, LTX_MUTATIONS, provider, formula, monkeypatch)


@pytest.mark.parametrize("formula", [None, *LTX_MUTATIONS])
def test_ltx_parity_holds_and_fails_for_a_one_percent_error(formula, monkeypatch):
    _check_ltx("reference", formula, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("formula", [None, *LTX_MUTATIONS])
def test_ltx_cuda_parity_in_fp32_holds_and_fails_for_a_one_percent_error(formula, monkeypatch):
    _check_ltx("cuda", formula, monkeypatch)


LLM_MUTATIONS = {
    "norm weight": {op: _scaled(op, weight=PERTURBED) for op in ("rms_norm", "fused_add_rms_norm")},
    "eps": {op: _scaled(op, eps=PERTURBED) for op in ("rms_norm", "fused_add_rms_norm")},
    "residual": {"fused_add_rms_norm": _scaled("fused_add_rms_norm", residual=PERTURBED)},
    "rope angle": {"rope_1d": _rope_angle},
    "swiglu": {"swiglu": _swiglu},
}


def _folded_swiglu(provider):
    """add_rms_norm_linear with its SwiGLU output 1% larger."""
    fn = provider.add_rms_norm_linear

    def mutated(*args, **kwargs):
        out, h = fn(*args, **kwargs)
        return (out * PERTURBED if kwargs.get("activation") == "swiglu" else out), h

    return mutated


# A decode step's rows (at most 4): the norms folded into the q/k/v and gate/up GEMVs, the SwiGLU into the latter's
# epilogue (inject/llm/norm_fusion.py).
LLM_DECODE_MUTATIONS = {
    "folded norm weight": {op: _scaled(op, norm_weight=PERTURBED) for op in ("rms_norm_linear", "add_rms_norm_linear")},
    "folded eps": {op: _scaled(op, eps=PERTURBED) for op in ("rms_norm_linear", "add_rms_norm_linear")},
    "folded residual": {"add_rms_norm_linear": _scaled("add_rms_norm_linear", residual=PERTURBED)},
    "folded swiglu": {"add_rms_norm_linear": _folded_swiglu},
    "rope angle": {"rope_1d": _rope_angle},
}


def _llm_error(provider="reference", mutation=None, monkeypatch=None, tokens=None, batch=2) -> float:
    device = "cpu" if provider == "reference" else "cuda"
    model = llm_build("llama", device=device)
    assert math.isclose(model.model.embed_tokens.weight.std().item(), 0.02, rel_tol=0.1)  # trained-size embeddings
    ids = llm_prompt().to(device)[:batch, :tokens]
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        _mutate(provider, mutation or {}, monkeypatch)
        with llm.apply_kernels(model, provider):
            got = model(input_ids=ids).logits
    return max_rel_error(got, expected)


def _check_llm(provider, formula, monkeypatch):
    _check("LLM", _llm_error, LLM_MUTATIONS, provider, formula, monkeypatch)


@pytest.mark.parametrize("formula", [None, *LLM_MUTATIONS])
def test_llm_parity_holds_and_fails_for_a_one_percent_error(formula, monkeypatch):
    _check_llm("reference", formula, monkeypatch)


def _llm_decode_error(provider="reference", mutation=None, monkeypatch=None) -> float:
    # 4 rows, as many as a decode step's path takes, in one sequence: q·k sees rope at distances up to 3 (at 2 tokens
    # only distance 1 moved, and a 1% angle error landed at 1.8x the cuda tolerance)
    return _llm_error(provider, mutation, monkeypatch, tokens=4, batch=1)


@pytest.mark.parametrize("formula", [None, *LLM_DECODE_MUTATIONS])
@pytest.mark.parametrize("provider", ["reference", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_llm_decode_rows_parity_holds_and_fails_for_a_one_percent_error(provider, formula, monkeypatch):
    _check("LLM decode rows", _llm_decode_error, LLM_DECODE_MUTATIONS, provider, formula, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("formula", [None, *LLM_MUTATIONS])
def test_llm_cuda_parity_in_fp32_holds_and_fails_for_a_one_percent_error(formula, monkeypatch):
    _check_llm("cuda", formula, monkeypatch)


def _geglu(provider, factor=PERTURBED, gate_half=None, approximate=None):
    fn = provider.geglu

    def mutated(x, gate_half_=1, approximate_=False):
        half = gate_half_ if gate_half is None else gate_half
        return fn(x, half, approximate_ if approximate is None else approximate) * factor

    return mutated


GEMMA_MUTATIONS = {
    "1 + weight": {op: _scaled(op, weight=PERTURBED) for op in ("rms_norm", "fused_add_rms_norm")},
    "the 1 of 1 + weight": {op: _scaled(op, weight_offset=PERTURBED) for op in ("rms_norm", "fused_add_rms_norm")},
    "eps": {op: _scaled(op, eps=PERTURBED) for op in ("rms_norm", "fused_add_rms_norm")},
    "residual": {"fused_add_rms_norm": _scaled("fused_add_rms_norm", residual=PERTURBED)},
    "rope angle": {"rope_1d": _rope_angle},
    "geglu": {"geglu": _geglu},
    "geglu gate half": {"geglu": lambda provider: _geglu(provider, 1.0, gate_half=1)},
    "geglu erf gelu": {"geglu": lambda provider: _geglu(provider, 1.0, approximate=False)},
}


def _gemma_error(provider="reference", mutation=None, monkeypatch=None) -> float:
    device = "cpu" if provider == "reference" else "cuda"
    model = gemma_build(device=device)
    ids = llm_prompt().to(device)
    with torch.no_grad():  # a quiet first token: its embedding's mean square near eps (1e-6)
        model.model.embed_tokens.weight[ids[0, 0]] *= 5e-3
        expected = model(input_ids=ids).logits
        _mutate(provider, mutation or {}, monkeypatch)
        with llm.apply_kernels(model, provider) as report:
            assert not report.skipped
            got = model(input_ids=ids).logits
    return max_rel_error(got, expected)


def _check_gemma(provider, formula, monkeypatch):
    _check("Gemma 3", _gemma_error, GEMMA_MUTATIONS, provider, formula, monkeypatch)


@pytest.mark.parametrize("formula", [None, *GEMMA_MUTATIONS])
def test_gemma_parity_holds_and_fails_for_a_one_percent_error(formula, monkeypatch):
    _check_gemma("reference", formula, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("formula", [None, *GEMMA_MUTATIONS])
def test_gemma_cuda_parity_in_fp32_holds_and_fails_for_a_one_percent_error(formula, monkeypatch):
    _check_gemma("cuda", formula, monkeypatch)
