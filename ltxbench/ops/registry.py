"""One KernelSpec per op: the single description read by the tests, `bench micro`, `kernels` and injection.

A spec names the op, how to build its inputs for a shape and variant, which shapes to test and to
benchmark (named after the models that produce them), its tolerances, the minimum bytes it must move,
and the host-library formulas it replaces (its baselines).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ltxbench.ops import eager

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# HANDBOOK §5: (atol, rtol) against an fp32-math reference.
TOLERANCES = {
    "elementwise": {torch.float32: (1e-5, 1.3e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)},
    "reduction": {torch.float32: (1e-4, 1e-4), torch.float16: (1e-3, 1e-3), torch.bfloat16: (2e-2, 1.6e-2)},
}

# Odd widths that defeat 16-byte vectors, tiny and wide rows, few and many rows: (B, S, D).
ODD_SHAPES = ((1, 1, 7), (2, 3, 83), (3, 5, 769), (1, 2, 5125))
VECTOR_SHAPES = ((1, 1, 8), (2, 17, 64), (2, 33, 2048), (1, 4, 4096), (1, 2, 8200), (1, 2, 40960))
TEST_SHAPES = ODD_SHAPES + VECTOR_SHAPES

SEED_SHAPES = {"seed-1x1024x2048": (1, 1024, 2048), "seed-2x1024x2048": (2, 1024, 2048),
               "seed-4x1024x2048": (4, 1024, 2048), "seed-2x4096x3072": (2, 4096, 3072),
               "seed-4x4096x3072": (4, 4096, 3072)}
LTX_SHAPES = {"ltx2b-49f-cfg": (2, 2688, 2048), "ltx2b-161f-cfg": (2, 8064, 2048),
              "ltx13b-161f-cfg": (2, 8064, 4096)}
LLM_SHAPES = {"llama3-8b-decode": (1, 1, 4096), "llama3-8b-prefill": (1, 4096, 4096),
              "norm-32768x2048": (1, 32768, 2048), "norm-8192x4096": (1, 8192, 4096)}


def _randn(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32, device="cpu").to(device=device, dtype=dtype)


def _modulation(b, s, d, dtype, device, gen, variant):
    """scale, shift as the model produces them: per batch (B,1,D), per token (B,S,D), or LTX's
    strided views from `(table + temb.reshape(B,T,6,D)).unbind(2)`."""
    if variant == "ltx-unbind":
        ada = 0.1 * _randn((b, 1, 6, d), dtype, device, gen)
        return ada[:, :, 1], ada[:, :, 0]
    t = s if variant == "per-token" else 1
    return 0.1 * _randn((b, t, d), dtype, device, gen), 0.1 * _randn((b, t, d), dtype, device, gen)


def _gate(b, s, d, dtype, device, gen, variant):
    return _randn((b, s if variant == "per-token" else 1, d), dtype, device, gen)


def _weight(d, dtype, device, gen):
    return 1 + 0.1 * _randn((d,), dtype, device, gen)


def inputs_rms_norm(shape, dtype, device, gen, variant):
    b, s, d = shape
    w = None if variant == "no-weight" else _weight(d, dtype, device, gen)
    return {"x": _randn(shape, dtype, device, gen), "weight": w, "eps": 1e-6,
            "cast_before_weight": variant == "weight-llama-cast"}


def inputs_fused_add(shape, dtype, device, gen, variant):
    b, s, d = shape
    return {"x": _randn(shape, dtype, device, gen), "residual": _randn(shape, dtype, device, gen),
            "weight": _weight(d, dtype, device, gen), "eps": 1e-6,
            "cast_before_weight": variant == "llama-cast"}


def inputs_rms_mod(shape, dtype, device, gen, variant):
    b, s, d = shape
    scale, shift = _modulation(b, s, d, dtype, device, gen, variant)
    return {"x": _randn(shape, dtype, device, gen), "weight": None, "scale": scale, "shift": shift, "eps": 1e-6}


def inputs_layer_mod(shape, dtype, device, gen, variant):
    b, s, d = shape
    scale, shift = _modulation(b, s, d, dtype, device, gen, variant)
    # An offset mean checks that the variance is computed around the mean, not from E[x²] - E[x]².
    x = _randn(shape, dtype, device, gen) + 3
    return {"x": x, "scale": scale, "shift": shift, "eps": 1e-6}


def inputs_gated_residual(shape, dtype, device, gen, variant):
    b, s, d = shape
    return {"h": _randn(shape, dtype, device, gen), "a": _randn(shape, dtype, device, gen),
            "gate": _gate(b, s, d, dtype, device, gen, variant)}


def inputs_add_rms_mod(shape, dtype, device, gen, variant):
    b, s, d = shape
    gate = None if variant == "no-gate" else _gate(b, s, d, dtype, device, gen, "per-batch")
    scale, shift = _modulation(b, s, d, dtype, device, gen, "per-batch")
    return {"h": _randn(shape, dtype, device, gen), "a": _randn(shape, dtype, device, gen), "gate": gate,
            "scale": scale, "shift": shift, "eps": 1e-6}


def io_bytes(inputs: dict, outputs_like_first: int) -> int:
    """Minimum traffic: every tensor input read once (at its real, un-broadcast size) + outputs written."""
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    first = tensors[0]
    read = sum(t.numel() * t.element_size() for t in tensors)
    return read + outputs_like_first * first.numel() * first.element_size()


@dataclass(frozen=True)
class KernelSpec:
    name: str
    summary: str                       # the formula, as documented to users
    make_inputs: Callable              # (shape, dtype, device, generator, variant) -> kwargs of the op
    variants: tuple[str, ...]
    n_outputs: int
    baselines: dict[str, Callable]     # provider name -> the host library's formula (same kwargs subset)
    kind: str = "reduction"            # tolerance class
    aliases: tuple[str, ...] = ()
    test_shapes: tuple = TEST_SHAPES
    bench_shapes: dict = field(default_factory=dict)
    inject_targets: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")

    @property
    def fn(self) -> Callable:
        import ltxbench.ops as ops

        return getattr(ops, self.name)

    @property
    def reference(self) -> Callable:
        from ltxbench.ops import reference

        return getattr(reference, self.name)

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return TOLERANCES[self.kind][dtype]

    def bytes_moved(self, inputs: dict) -> int:
        return io_bytes(inputs, self.n_outputs)


def _drop(*names):
    """Adapt a baseline to the op's kwargs by dropping the ones the library formula doesn't take."""
    def wrap(fn):
        return lambda **kw: fn(**{k: v for k, v in kw.items() if k not in names})
    return wrap


SPECS: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec(
        name="rms_norm", summary="x * rsqrt(mean(x²) + eps) [* weight]",
        make_inputs=inputs_rms_norm, variants=("no-weight", "weight", "weight-llama-cast"), n_outputs=1,
        baselines={"eager": _drop("cast_before_weight")(eager.diffusers_rms_norm),
                   "F.rms_norm": _drop("cast_before_weight")(eager.torch_rms_norm)},
        aliases=("rmsnorm", "rms", "rmsnorm_noweight"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES, **LLM_SHAPES},
        inject_targets=("diffusers RMSNorm", "torch.nn.RMSNorm", "LlamaRMSNorm", "Qwen3 q_norm/k_norm"),
    ),
    KernelSpec(
        name="fused_add_rms_norm", summary="h = residual + x; (rms_norm(h) * weight, h)",
        make_inputs=inputs_fused_add, variants=("torch-order", "llama-cast"), n_outputs=2,
        baselines={"eager": _drop("cast_before_weight")(eager.llama_add_rms_norm),
                   "F.rms_norm": _drop("cast_before_weight")(eager.torch_add_rms_norm)},
        aliases=("rmsnorm_residual", "add_rmsnorm", "fused_add_rmsnorm"),
        bench_shapes={**LLM_SHAPES, **SEED_SHAPES},
        inject_targets=("LlamaDecoderLayer post_attention_layernorm",),
    ),
    KernelSpec(
        name="rms_norm_modulate", summary="rms_norm(x) [* weight] * (1 + scale) + shift",
        make_inputs=inputs_rms_mod, variants=("per-batch", "per-token", "ltx-unbind"), n_outputs=1,
        baselines={"eager": _drop("weight")(eager.ltx_rms_norm_modulate)},
        aliases=("adaln_rmsnorm", "rmsnorm_modulate"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES},
        inject_targets=("LTXVideoTransformerBlock norm1 + modulation",),
    ),
    KernelSpec(
        name="layer_norm_modulate", summary="layer_norm(x, no affine) * (1 + scale) + shift",
        make_inputs=inputs_layer_mod, variants=("per-batch", "per-token", "ltx-unbind"), n_outputs=1,
        baselines={"eager": eager.ltx_layer_norm_modulate},
        aliases=("adaln_layernorm", "layernorm_modulate"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES},
        inject_targets=("LTXVideoTransformer3DModel norm_out + modulation",),
    ),
    KernelSpec(
        name="gated_residual", summary="h + a * gate",
        make_inputs=inputs_gated_residual, variants=("per-batch", "per-token"), n_outputs=1,
        baselines={"eager": eager.ltx_gated_residual}, kind="elementwise",
        aliases=("adaln_zero", "gated_add"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES},
        inject_targets=("LTXVideoTransformerBlock attn1 residual",),
    ),
    KernelSpec(
        name="add_rms_norm_modulate", summary="h' = h + a [* gate]; (rms_norm(h') * (1 + scale) + shift, h')",
        make_inputs=inputs_add_rms_mod, variants=("gate", "no-gate"), n_outputs=2,
        baselines={"eager": eager.ltx_add_rms_norm_modulate},
        aliases=("add_adaln_rmsnorm",),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES},
        inject_targets=("LTXVideoTransformerBlock attn2 residual + norm2", "ff residual + next norm1"),
    ),
)}

ALIASES = {alias: spec.name for spec in SPECS.values() for alias in spec.aliases}


def get_spec(name: str) -> KernelSpec:
    """Look a kernel up by its name or one of the seed's names (`rmsnorm`, `rmsnorm_residual`, ...)."""
    key = ALIASES.get(name, name)
    if key not in SPECS:
        known = ", ".join(sorted([*SPECS, *ALIASES]))
        raise KeyError(f"unknown kernel {name!r}; known: {known}")
    return SPECS[key]
