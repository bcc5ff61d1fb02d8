"""Which exchange each family's attention asks ltxbench.parallel.attend for, on the CPU without a process group (the
exchanges record their calls): LTX-Video's self-attention takes our Ulysses exchange and our ring attention, each fed
by its q/k kernel; LTX-2's takes the Ulysses exchange (split and interleaved RoPE) and leaves ring to diffusers; with
no parallel config neither sends anything. tests/parallel runs the exchanges themselves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ltxbench.inject.ltx.attention import FusedLTXAttnProcessor
from ltxbench.inject.ltx2 import attention as ltx2_attention
from ltxbench.ops import reference
from ltxbench.parallel import ring, ulysses
from tests.helpers import parallel_config

HEADS, DIM, TOKENS = 4, 8, 4
ULYSSES, RING = parallel_config(ulysses_degree=2), parallel_config(ring_degree=2)


@pytest.fixture
def sent(monkeypatch):
    """[(exchange, its arguments)] of the calls that reached our exchanges."""
    calls = []
    for module, name in ((ulysses, "rope_attention"), (ulysses, "attention"), (ring, "attention")):
        monkeypatch.setattr(module, name, lambda *args, name=f"{module.__name__}.{name}": calls.append((name, args))
                            or torch.zeros(1, TOKENS, HEADS, DIM))
    return calls


def _attn(rope_type="interleaved", parallel=None):
    norm = SimpleNamespace(weight=torch.ones(HEADS * DIM), eps=1e-5)
    return SimpleNamespace(heads=HEADS, norm_q=norm, norm_k=norm, rope_type=rope_type,
                           processor=SimpleNamespace(_attention_backend=None, _parallel_config=parallel))


def _qkv_and_tables():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, TOKENS, HEADS * DIM, generator=generator) for _ in range(3))
    angles = torch.rand(1, TOKENS, HEADS * DIM, generator=generator)
    return (q, k, v), (angles.cos(), angles.sin())


@pytest.mark.parametrize(("parallel", "expected"), [(None, None), (ULYSSES, "ltxbench.parallel.ulysses.rope_attention"),
                                                    (RING, "ltxbench.parallel.ring.attention")])
def test_ltx_self_attention_exchange(sent, parallel, expected):
    attn = _attn()
    processor = FusedLTXAttnProcessor(reference, attn.processor)
    processor._parallel_config = parallel
    qkv, tables = _qkv_and_tables()
    out = processor._exchanged_attention(attn, *qkv, None, tables)
    assert [name for name, _ in sent] == ([expected] if expected else []) and (out is None) == (expected is None)
    assert processor._exchanged_attention(attn, *qkv, None, None) is None  # no RoPE: not a video self-attention


@pytest.mark.parametrize("rope_type", ["split", "interleaved"])
@pytest.mark.parametrize("parallel", [None, ULYSSES, RING])
def test_ltx2_self_attention_exchange(sent, rope_type, parallel):
    attn = _attn(rope_type, parallel)
    qkv, tables = _qkv_and_tables()
    out = ltx2_attention._exchanged_attention(reference, attn, *qkv, tables)
    if parallel is ULYSSES:
        (name, args), = sent
        assert name == "ltxbench.parallel.ulysses.rope_attention" and args[8] == (rope_type == "split")
    else:  # ring: diffusers' ring attention, through the plain path
        assert out is None and sent == []
