"""The `_into` variants of the Ulysses packing kernels (ops.qk_rms_norm_rope_pack_into,
ops.qk_rms_norm_rope_split_pack_into): part r written into outs[r] gives, bit for bit, part r of the packing op,
whose own tests check it against the fp32 reference (tests/ops/test_ops_gpu.py). Every test shape, variant and dtype of
the packing op's KernelSpec; the outs placed in one larger buffer at offsets (as a peer's receive buffer is), with
guard values around them that must stay; torch.compile(fullgraph=True) and opcheck. On the CPU: the fakes and the
argument checks."""

from __future__ import annotations

import pytest
import torch

from ltxbench import ops
from ltxbench.ops.registry import SPECS

CASES = {"qk_rms_norm_rope_pack": "qk_rms_norm_rope_pack_into",
         "qk_rms_norm_rope_split_pack": "qk_rms_norm_rope_split_pack_into"}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _spec(name):
    return SPECS[name]


def _params():
    for name in CASES:
        spec = _spec(name)
        for shape in spec.test_shapes:
            for variant in spec.variants:
                for dtype in DTYPES:
                    yield pytest.param(name, tuple(shape), variant, dtype,
                                       id=f"{name}-{'x'.join(map(str, shape))}-{variant}-{str(dtype)[6:]}")


def _inputs(name, shape, variant, dtype):
    gen = torch.Generator().manual_seed(0)  # the input factories draw on the CPU
    return _spec(name).make_inputs(shape, dtype, "cuda", gen, variant)


def _into_args(name, inputs, outs):
    """The `_into` op's arguments from the packing op's inputs (the same keys, `parts` replaced by outs)."""
    args = {k: v for k, v in inputs.items() if k != "parts"}
    if name == "qk_rms_norm_rope_pack":
        args = {**{k: None for k in ("cos", "sin", "grid", "freqs")}, **args}
        return [args[k] for k in ("q", "k", "v", "wq", "wk", "eps", "cos", "sin", "grid", "freqs")] + [outs]
    return [args[k] for k in ("q", "k", "v", "wq", "wk", "eps", "cos", "sin")] + [outs]


GUARD = 7.0  # the value around the outs, which the op must leave
GAP = 24  # elements between the outs: keeps every out 16-byte aligned for 2- and 4-byte dtypes


def _outs_in_one_buffer(expected):
    """One out per part inside a single buffer, each after a gap of GUARD values; and a mask of the gaps."""
    parts, size = expected.shape[0], expected[0].numel()
    buffer = torch.full((parts * (size + GAP) + GAP,), GUARD, dtype=expected.dtype, device=expected.device)
    gaps = torch.ones_like(buffer, dtype=torch.bool)
    outs = []
    for r in range(parts):
        start = GAP + r * (size + GAP)
        outs.append(buffer[start:start + size].view(expected[0].shape))
        gaps[start:start + size] = False
    return buffer, outs, gaps


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "shape", "variant", "dtype"), list(_params()))
def test_into_writes_the_packing_ops_bits(name, shape, variant, dtype):
    inputs = _inputs(name, shape, variant, dtype)
    expected = getattr(ops, name)(**inputs)
    buffer, outs, gaps = _outs_in_one_buffer(expected)
    getattr(ops, CASES[name])(*_into_args(name, inputs, outs))
    for r, out in enumerate(outs):
        assert torch.equal(out, expected[r]), r
    assert bool((buffer[gaps] == GUARD).all())  # nothing outside the outs was written


def _largest_case(name):
    """The packing op's inputs at its largest test shape (bf16, first variant), its output, and empty outs for it."""
    spec = _spec(name)
    inputs = _inputs(name, tuple(spec.test_shapes[-1]), spec.variants[0], torch.bfloat16)
    expected = getattr(ops, name)(**inputs)
    return inputs, expected, [torch.empty_like(part) for part in expected]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_into_compiles_and_passes_opcheck(name):
    inputs, expected, outs = _largest_case(name)
    op = getattr(torch.ops.ltxbench, CASES[name]).default

    def write(*args):
        fresh = [torch.empty_like(part) for part in expected]
        op(*args[:-1], fresh)
        return torch.stack(fresh)

    got = torch.compile(write, fullgraph=True)(*_into_args(name, inputs, None))
    assert torch.equal(got, expected)
    torch.library.opcheck(op, tuple(_into_args(name, inputs, outs)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_into_rejects_wrong_outs_in_one_line(name):
    """Outs of the wrong shape, dtype or count: a RuntimeError naming the out (not a crash of the process)."""
    inputs, _, good = _largest_case(name)
    op = getattr(ops, CASES[name])
    wrong = {"outs\\[0\\] must be contiguous of shape": [good[0].flatten(0, 1)] + good[1:],
             "outs\\[0\\] must be BFloat16 on cuda": [good[0].float()] + good[1:],
             "outs must hold 1 to 8 tensors": good * 9}
    for message, outs in wrong.items():
        with pytest.raises(RuntimeError, match=message):
            op(*_into_args(name, inputs, outs))


def test_into_fakes_and_checks():
    """Under FakeTensorMode the op checks its outs; on the CPU the first check names the device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = torch.randn(1, 7, 64)
    w = torch.ones(64)
    with pytest.raises(RuntimeError, match="CUDA"):
        ops.qk_rms_norm_rope_pack_into(q, q, q, w, w, 1e-5, torch.ones(1, 7, 64), torch.zeros(1, 7, 64), None, None,
                                       [torch.empty(1, 7, 3, 32)] * 2)
    with FakeTensorMode():
        q = torch.empty(1, 7, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(64, device="cuda", dtype=torch.bfloat16)
        cos = torch.empty(1, 7, 64, device="cuda")
        good = [torch.empty(1, 7, 3, 32, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        torch.ops.ltxbench.qk_rms_norm_rope_pack_into(q, q, q, w, w, 1e-5, cos, cos, None, None, good)
        with pytest.raises(RuntimeError, match="outs"):
            torch.ops.ltxbench.qk_rms_norm_rope_pack_into(q, q, q, w, w, 1e-5, cos, cos, None, None,
                                                           [good[0][:, :, :2]] * 2)
