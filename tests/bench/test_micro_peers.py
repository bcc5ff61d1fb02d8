"""bench micro's peer providers: FlashAttention-3's decode over the cache (stood in for on the CPU by its documented
math, so that the layout our provider hands it is checked) and the masks it can and cannot take."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from ltxbench.bench import micro, micro_peers
from ltxbench.ops import reference
from ltxbench.ops.registry import get_spec
from tests.helpers import stand_in_module, without_flash_attention_3


def _inputs(variant: str, shape=(2, 83, 1024), dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    return get_spec("decode_attention").make_inputs(shape, dtype, "cpu", gen, variant)


class KVCacheStandIn:
    """flash_attn_with_kvcache as FlashAttention-3 documents it: q (B, 1, Hq, hd) over k_cache, v_cache (B, L, Hk,
    hd), query head i on key/value head i // (Hq / Hk), the first cache_seqlens[b] keys of batch element b.
    `mapping` "modulo" is a wrong grouped-query mapping (i % Hk), to show that the check sees one."""

    def __init__(self, mapping: str = "floor"):
        self.mapping, self.calls, self.metadata = mapping, [], []

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, cache_seqlens=None, softmax_scale=None,
                                scheduler_metadata=None, **_):
        self.calls.append((k_cache, v_cache, scheduler_metadata))
        b, _, hq, hd = q.shape
        hk, length = k_cache.shape[2], k_cache.shape[1]
        heads = torch.arange(hq)
        kv = heads // (hq // hk) if self.mapping == "floor" else heads % hk
        k, v = k_cache[:, :, kv].float(), v_cache[:, :, kv].float()  # (B, L, Hq, hd)
        scale = hd ** -0.5 if softmax_scale is None else softmax_scale
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) * scale
        keep = torch.arange(length)[None, :] < cache_seqlens[:, None].long()
        scores = scores.masked_fill(~keep[:, None, None, :], -math.inf)
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).to(q.dtype)

    def get_scheduler_metadata(self, *args, **kwargs):
        self.metadata.append((args, kwargs))
        return "metadata"


@pytest.fixture
def fa3(monkeypatch):
    def install(mapping="floor"):
        without_flash_attention_3(monkeypatch)
        stand_in = KVCacheStandIn(mapping)
        module = stand_in_module("fa3_fwd_interface", lambda *a, **k: None)
        module.flash_attn_with_kvcache = stand_in.flash_attn_with_kvcache
        module.get_scheduler_metadata = stand_in.get_scheduler_metadata
        monkeypatch.setitem(sys.modules, "fa3_fwd_interface", module)
        return stand_in
    return install


@pytest.mark.parametrize("variant", ["llama", "no-mask", "q-dtype-mask"])
def test_the_cache_reaches_flash_attention_3_as_it_reads_it(fa3, variant):
    stand_in = fa3()
    spec, inputs = get_spec("decode_attention"), _inputs(variant)
    if variant == "q-dtype-mask":  # a prefix in transformers' float form: 0 kept, the dtype's lowest value dropped
        keep = torch.arange(83)[None, None, None, :] < torch.tensor([83, 40])[:, None, None, None]
        lowest = torch.finfo(torch.bfloat16).min
        inputs["mask"] = torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill(~keep, lowest)
    run = micro.make_provider("fa3", spec, inputs)
    got, want = run(), reference.decode_attention(**inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    atol, rtol = spec.tolerance(torch.bfloat16)
    assert micro.check_outputs(got, want, atol, rtol)["passed"]
    k_cache, v_cache, metadata = stand_in.calls[-1]
    assert k_cache.data_ptr() == inputs["k"].data_ptr() and v_cache.data_ptr() == inputs["v"].data_ptr()  # views
    assert metadata == "metadata" and len(stand_in.metadata) == 1  # computed once, before the timed calls
    run()
    assert len(stand_in.metadata) == 1


def test_a_wrong_grouped_query_mapping_fails_the_check(fa3):
    fa3("modulo")
    spec, inputs = get_spec("decode_attention"), _inputs("llama")
    got = micro.make_provider("fa3", spec, inputs)()
    assert not micro.check_outputs(got, reference.decode_attention(**inputs), *spec.tolerance(torch.bfloat16))["passed"]


@pytest.mark.parametrize(("variant", "reason"), [("window", "holes"), ("mha-f32-mask", "bias per key")])
def test_masks_without_a_length_per_sequence_are_na(fa3, variant, reason):
    fa3()
    with pytest.raises(micro_peers.Unavailable, match=reason):
        micro.make_provider("fa3", get_spec("decode_attention"), _inputs(variant))


def test_kept_lengths():
    keep = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    assert micro_peers.kept_lengths(keep, 2, 4).tolist() == [3, 1]
    assert micro_peers.kept_lengths(keep[:1], 3, 4).tolist() == [3, 3, 3]  # one mask for the batch
    assert micro_peers.kept_lengths(None, 2, 5).tolist() == [5, 5]
    additive = torch.zeros(2, 1, 1, 4).masked_fill(~keep, -math.inf)
    assert micro_peers.kept_lengths(additive, 2, 4).tolist() == [3, 1]
    with pytest.raises(micro_peers.Unavailable, match="holes"):
        micro_peers.kept_lengths(torch.tensor([True, False, True])[None, None, None, :], 1, 3)


def test_fa3_is_na_where_it_cannot_run(monkeypatch, fa3):
    with pytest.raises(micro_peers.Unavailable, match="no rms_norm equivalent"):
        micro.make_provider("fa3", get_spec("rms_norm"), {})
    fa3()
    with pytest.raises(micro_peers.Unavailable, match="takes bf16, not --dtype fp16"):  # fa3-fwd: no fp16 kernels
        micro.make_provider("fa3", get_spec("decode_attention"), _inputs("llama", dtype=torch.float16))
    without_flash_attention_3(monkeypatch)
    with pytest.raises(micro_peers.Unavailable, match="not importable"):
        micro.make_provider("fa3", get_spec("decode_attention"), _inputs("llama"))


def test_every_spec_gets_the_peers_it_asks_for():
    assert micro.providers_for(get_spec("rms_norm"), ["cuda", "fa3", "liger", "nope"]) == ("cuda", "liger")
    assert micro.providers_for(get_spec("decode_attention"), ["fa3", "liger"]) == ("fa3", "liger")
    assert micro.known_providers()[-3:] == ("compile", "liger", "fa3")


@pytest.mark.gpu
@pytest.mark.parametrize("length", [7, 769, 5125])
def test_flash_attention_3_decode_matches_the_reference_on_the_gpu(length):
    if torch.cuda.get_device_capability() < (9, 0):  # the gpu marker skips where no GPU is visible
        pytest.skip("FlashAttention-3 runs on Hopper (compute capability 9.0+)")
    from ltxbench.inject.attention_backend import find_flash_attention_3

    if find_flash_attention_3()[0] is None:
        pytest.skip("FlashAttention-3 not installed (pip install fa3-fwd)")
    spec = get_spec("decode_attention")
    gen = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs((2, length, 4096), torch.bfloat16, "cuda", gen, "llama")
    got = micro.make_provider("fa3", spec, inputs)()
    check = micro.check_outputs(got, reference.decode_attention(**inputs), *spec.tolerance(torch.bfloat16))
    assert check["passed"], check
