"""The block streamer (ltxbench.memory.stream) on the CPU, where its loads run synchronously: streamed blocks give the
resident model's output bit for bit (LTX-2 and LTX-Video, with and without our injection, eager and with the blocks
compiled), each loaded once per call ahead of its use, fused projections stay fused, revert gives back the same
tensors with their values, and a skipped load or a wrong slot is seen by these comparisons."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import fuse, streamer_of
from ltxbench.inject import ltx as inject_ltx
from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.inject.ltx.cross_kv import CACHE_ATTR
from ltxbench.memory.stream import BlockStreamer
from tests.helpers import ltx2_call, ltx2_inputs, ltx2_transformer, ltx_inputs, ltx_transformer

# (streamed blocks of 6, slots): all of them; every other one, unevenly over the slots (slot 1 holds one block); 3 slots
PLANS = [((0, 1, 2, 3, 4, 5), 2), ((1, 3, 5), 2), ((0, 2, 3, 5), 3)]


def _equal(got, expected) -> bool:
    return all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def _named(model) -> dict:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _per_call(streamed, slots) -> int:
    """Loads per call: every block of a slot that more than one block shares (a lone block stays loaded)."""
    counts = [sum(1 for j in range(len(streamed)) if j % slots == s) for s in range(slots)]
    return sum(c for c in counts if c > 1)


def _firsts(streamed, slots) -> tuple:
    return tuple(streamed[s] if s < len(streamed) else None for s in range(slots))


@pytest.mark.parametrize(("streamed", "slots"), PLANS)
def test_streamed_ltx2_blocks_give_the_resident_output_bit_for_bit(streamed, slots):
    model = ltx2_transformer()
    expected = ltx2_call(model)
    streamer = BlockStreamer(model.transformer_blocks, streamed, slots, "cpu")
    try:
        assert streamer_of(model.transformer_blocks) is streamer
        assert streamer.loads == min(slots, len(streamed)) and streamer.loaded == _firsts(streamed, slots)
        for _ in range(3):  # the last blocks of a call load the first ones of the next
            loads = streamer.loads
            assert _equal(ltx2_call(model), expected)
            assert streamer.loads - loads == _per_call(streamed, slots)  # none twice, none on demand
            assert streamer.loaded == _firsts(streamed, slots)
    finally:
        streamer.revert()
    assert streamer_of(model.transformer_blocks) is None
    assert _equal(ltx2_call(model), expected)


def test_a_call_that_stopped_midway_leaves_the_next_one_exact():
    """Block 2 raises: the slots then hold blocks the next call does not start with, which it loads on demand."""
    model = ltx2_transformer()
    expected = ltx2_call(model)
    streamer = BlockStreamer(model.transformer_blocks, range(6), 2, "cpu")
    block = model.transformer_blocks[2]

    def fail(*_args, **_kwargs):
        raise RuntimeError("stopped")

    vars(block)["forward"] = fail
    with pytest.raises(RuntimeError, match="stopped"):
        ltx2_call(model)
    del vars(block)["forward"]
    assert streamer.loaded == (4, 3)  # block 2's hook ran all the same: its slot took block 4
    assert _equal(ltx2_call(model), expected)
    streamer.revert()


def _fused_sets(model) -> list:
    return [getattr(attn, fuse.FUSED_ATTR)[1] for block in model.transformer_blocks
            for attn in (block.attn1, block.audio_attn1)]


def _fused_and_shared(fused) -> bool:
    """Intact, the weights' views in the weight concatenation's storage and the biases' in the bias one's, where the
    views were recorded."""
    def one_storage(*tensors):
        return len({t.untyped_storage().data_ptr() for t in tensors}) == 1

    return (fused.intact and one_storage(fused.weight, *fused.params[0::2])
            and one_storage(fused.bias, *fused.params[1::2])
            and tuple(p.data_ptr() for p in fused.params) == fused.ptrs)


def test_with_our_injection_the_streamed_ltx2_keeps_its_fusions_and_its_output():
    """The fused blocks, the fused q/k/v views and the text keys/values kept over a generation (entries per module,
    though blocks 0, 2 and 4 share slot 0's addresses)."""
    model = ltx2_transformer()
    inputs = ltx2_inputs(model)  # one prompt tensor for the calls of a generation, as the pipeline passes it
    report = inject_ltx2.apply_kernels(model, "reference")
    try:
        with torch.no_grad(), inject_ltx2.generation(model):
            expected = [model(**inputs) for _ in range(2)]
        cache = vars(model)[inject_ltx2.CACHE_ATTR]
        resident = (cache.builds, cache.hits)
        assert resident == (14, 14)  # attn2 and audio_attn2 of 6 blocks and the 2 prompt projections
        sets = _fused_sets(model)
        assert len(sets) == 12 and all(map(_fused_and_shared, sets))
        streamer = BlockStreamer(model.transformer_blocks, range(6), 2, "cpu")
        assert all(map(_fused_and_shared, sets))
        # blocks 0 and 2 live in slot 0: the same addresses, one copy of the fused weights each time
        assert sets[0].weight.data_ptr() == sets[4].weight.data_ptr() != sets[2].weight.data_ptr()
        with torch.no_grad(), inject_ltx2.generation(model):
            got = [model(**inputs) for _ in range(2)]
        assert (cache.builds, cache.hits) == (2 * resident[0], 2 * resident[1])  # the same entries, streamed
        streamer.revert()
        assert all(map(_fused_and_shared, sets))
        assert len({s.weight.untyped_storage().data_ptr() for s in sets}) == 12  # a storage each again
        for got_call, expected_call in zip(got, expected, strict=True):
            assert _equal(got_call, expected_call)
    finally:
        report.revert()


def test_fp8_weights_stream_with_their_scales_and_the_placeholders_stay_empty():
    """precision fp8 (reference provider): the FP8 weights, scales and concatenated biases are buffers of the
    blocks, streamed like the rest; the emptied bf16 placeholders have nothing to stream."""
    from ltxbench.inject.fp8 import DATA
    from ltxbench.inject.fp8_held import Fp8Placeholder

    model = ltx2_transformer()
    report = inject_ltx2.apply_kernels(model, "reference", precision="fp8")
    expected = ltx2_call(model)
    streamer = BlockStreamer(model.transformer_blocks, (0, 2, 3, 5), 2, "cpu")
    placeholders = [p for p in model.parameters() if isinstance(p, Fp8Placeholder)]
    assert placeholders and all(p.numel() == 0 for p in placeholders)
    blocks = model.transformer_blocks  # blocks 0 and 3 live in slot 0: their FP8 weights at one address
    assert getattr(blocks[0].attn1, DATA).data_ptr() == getattr(blocks[3].attn1, DATA).data_ptr()
    got = [ltx2_call(model) for _ in range(2)]
    streamer.revert()
    report.revert()
    assert all(_equal(g, expected) for g in got)


def test_revert_gives_back_the_same_tensors_where_they_were_with_their_values():
    model = ltx2_transformer()
    inject = inject_ltx2.apply_kernels(model, "reference")  # the fused views too
    before = {name: (t, t.device, t.detach().clone()) for name, t in _named(model).items()}
    streamer = BlockStreamer(model.transformer_blocks, (0, 2, 3, 5), 2, "cpu")
    ltx2_call(model)
    streamer.revert()
    after = _named(model)
    assert after.keys() == before.keys()
    for name, (tensor, device, values) in before.items():
        assert after[name] is tensor and tensor.device == device and torch.equal(tensor, values), name
    inject.revert()


def test_revert_frees_each_blocks_slab_before_copying_the_next(monkeypatch):
    """The host check allows one block beyond the plan: revert copies a block's weights out of its slab and drops
    that slab before the next block's copies are made (it held every slab to the end: the streamed blocks twice)."""
    from ltxbench.memory import stream

    model = ltx2_transformer()
    streamer = BlockStreamer(model.transformer_blocks, (0, 2, 3, 5), 2, "cpu")
    held, point = [], stream._point

    def pointing(span, storage):
        held.append(sorted(streamer._slabs))
        point(span, storage)

    monkeypatch.setattr(stream, "_point", pointing)
    streamer.revert()
    firsts = list(dict.fromkeys(map(tuple, held)))
    # each block's copies made beside its own slab (taken out of the streamer's) and the later blocks' only
    assert firsts == [(2, 3, 5), (3, 5), (5,), ()]


def test_a_skipped_load_or_a_wrong_slot_changes_the_output(monkeypatch):
    """The checks above can fail: block 2 computed on the weights another block left in its slot."""
    model = ltx2_transformer()
    expected = ltx2_call(model)
    streamer = BlockStreamer(model.transformer_blocks, range(6), 2, "cpu")
    streamer._slot[2] = 1  # its tensors live in slot 0, its loads go to slot 1
    assert not _equal(ltx2_call(model), expected)
    streamer.revert()
    assert _equal(ltx2_call(model), expected)
    load = BlockStreamer._load
    monkeypatch.setattr(BlockStreamer, "_load", lambda self, index: None if index == 2 else load(self, index))
    streamer = BlockStreamer(model.transformer_blocks, range(6), 2, "cpu")
    assert not _equal(ltx2_call(model), expected)
    streamer.revert()


def test_a_text_kv_entry_is_never_another_blocks_at_the_same_address(monkeypatch):
    """Blocks 0 and 2 share slot 0: their attn2 weights have one address and version, in turn. Each gets the keys
    of its own weights; keyed on addresses alone (the mutation below) block 2 would get block 0's."""
    from ltxbench.inject.ltx2 import text_kv

    def keys(cache):
        model = ltx2_transformer(4)
        blocks = model.transformer_blocks
        text = torch.randn(2, 16, blocks[0].attn2.to_k.in_features, generator=torch.Generator().manual_seed(0))
        streamer = BlockStreamer(blocks, range(4), 2, "cpu")
        assert blocks[0].attn2.to_k.weight.data_ptr() == blocks[2].attn2.to_k.weight.data_ptr()
        cache.generations = 1
        got = []
        with torch.no_grad():
            for index in (0, 2, 0):
                streamer.enter(index)
                got.append(cache.key_value(blocks[index].attn2, text)[0])
                streamer.leave(index)
            streamer.revert()
            own = [text_kv.text_key_value(blocks[index].attn2, text)[0] for index in (0, 2)]
        return got, own

    got, own = keys(text_kv.TextKVCache())
    assert torch.equal(got[0], own[0]) and torch.equal(got[1], own[1]) and torch.equal(got[2], own[0])
    assert not torch.equal(own[0], own[1])

    class OneList(dict):  # every module's entries in one list, and stamps without the parameters' identity
        def setdefault(self, key, default=None):
            return super().setdefault(0, default)

    def by_address(source, layers):
        params = [p for layer in layers for p in layer._parameters.values() if p is not None]
        return (source.data_ptr(), source._version, *((p.data_ptr(), p._version) for p in params))

    mutated = text_kv.TextKVCache()
    mutated.entries = OneList()
    monkeypatch.setattr(text_kv, "_stamp", by_address)
    got, own = keys(mutated)
    assert not torch.equal(got[1], own[1])


@pytest.mark.parametrize("injected", [False, True])
def test_streamed_ltx_video_blocks_give_the_resident_output_bit_for_bit(injected):
    """LTX-Video: diffusers' forward calls each block (its hooks); our chained forward uses a block's layers without
    calling it and asks the streamer itself; the cross-attention cache, which reads every block's weights up front,
    stands aside while blocks stream."""
    model = ltx_transformer(num_layers=5)
    inputs = ltx_inputs(model)
    report = inject_ltx.apply_kernels(model, "reference") if injected else None
    scope = inject_ltx.generation(model) if injected else torch.no_grad()
    with torch.no_grad(), scope:
        expected = [model(**inputs)[0] for _ in range(2)]
        streamer = BlockStreamer(model.transformer_blocks, (0, 1, 3, 4), 2, "cpu")
        loads = streamer.loads
        got = [model(**inputs)[0] for _ in range(2)]
        assert streamer.loads - loads == 2 * 4
        if injected:
            assert vars(model)[CACHE_ATTR].builds == 1  # the resident calls' entry only
        streamer.revert()
        assert _equal(got, expected)
        assert torch.equal(model(**inputs)[0], expected[0])
    if report is not None:
        report.revert()


def test_hooks_stay_outside_the_compiled_blocks():
    """Regional compile (each block compiled, its hooks traced with it): the loads run eagerly, the output holds."""
    torch._dynamo.reset()
    model = ltx2_transformer(4)
    expected = ltx2_call(model)
    streamer = BlockStreamer(model.transformer_blocks, range(4), 2, "cpu")
    for block in model.transformer_blocks:
        block.compile(backend="eager")
    loads = streamer.loads
    assert _equal(ltx2_call(model), expected) and streamer.loads - loads == 4
    streamer.revert()
    torch._dynamo.reset()


def test_refusals():
    model = ltx2_transformer(4)
    blocks = model.transformer_blocks
    with pytest.raises(ValueError, match="at least 2"):
        BlockStreamer(blocks, (0, 1), 1, "cpu")
    with pytest.raises(ValueError, match="outside 0..3"):
        BlockStreamer(blocks, (2, 4), 2, "cpu")
    blocks[3].attn2.to_k.weight = blocks[1].attn2.to_k.weight  # tied across blocks
    with pytest.raises(ValueError, match="blocks 1 and 3 share a storage"):
        BlockStreamer(blocks, (1, 2), 2, "cpu")
    assert streamer_of(blocks) is None


def test_a_pin_the_host_refuses_is_an_environment_problem(monkeypatch):
    """cudaHostRegister failing (locked-memory limit, host memory short) exits 4 with a hint, not a traceback."""
    from types import SimpleNamespace

    from ltxbench.errors import EnvironmentProblem
    from ltxbench.memory import stream

    monkeypatch.setattr(torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostRegister=lambda *_: 2))
    with pytest.raises(EnvironmentProblem, match="could not pin 0.00 GiB of host memory") as refused:
        stream._host_slab(4096, pin=True)
    assert refused.value.exit_code == 4 and "ulimit -l" in refused.value.hint
