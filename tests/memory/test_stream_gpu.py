"""The block streamer on the GPU (GPU only): LTX-2 19B's blocks (the released config cut to 6 blocks, bf16) streamed
from pinned host memory through 2 slots give the resident output bit for bit over several calls, with and without our
kernels (bf16 and FP8) and under regional compile; blocks built on the host stay there but for what the plan puts on
the GPU; enter/leave never synchronise with the host."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.memory.stream import BlockStreamer
from tests.helpers import cast_floats, ltx2_cuda_inputs, ltx2_cuda_transformer

pytestmark = pytest.mark.gpu

STREAMED = (0, 2, 3, 5)  # of 6: two resident, the others through 2 slots


def _inputs(model):
    return cast_floats(ltx2_cuda_inputs(model, "t2v", frames=8, height=16, width=24, text=256), torch.bfloat16)


def _calls(model, inputs, n=3):
    with torch.no_grad():
        return [model(**inputs) for _ in range(n)]


def _equal(got, expected) -> bool:
    return all(torch.equal(g, e) for call, want in zip(got, expected, strict=True)
               for g, e in zip(call, want, strict=True))


@pytest.mark.parametrize("precision", [None, "bf16", "fp8"])
def test_streamed_blocks_give_the_resident_output_bit_for_bit(precision):
    if precision == "fp8" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("FP8 needs compute capability 9.0")
    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16, num_layers=6)
    inputs = _inputs(model)
    report = inject_ltx2.apply_kernels(model, "cuda", precision=precision) if precision else None
    expected = _calls(model, inputs)
    streamer = BlockStreamer(model.transformer_blocks, STREAMED, 2, "cuda")
    try:
        assert all(slab.is_pinned() for slab in streamer._slabs.values())
        got = _calls(model, inputs)
    finally:
        streamer.revert()
    assert _equal(got, expected)
    assert _equal(_calls(model, inputs, 1), expected[:1])
    if report is not None:
        report.revert()


def test_blocks_built_on_the_host_take_only_the_resident_ones_and_the_slots_on_the_gpu():
    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16, num_layers=6)
    inputs = _inputs(model)
    expected = _calls(model, inputs, 2)
    blocks = model.transformer_blocks
    block_bytes = sum(t.numel() * t.element_size() for t in blocks[0].parameters())
    blocks.cpu()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    streamer = BlockStreamer(blocks, STREAMED, 2, "cuda")
    grown = torch.cuda.memory_allocated() - before
    assert 3.9 * block_bytes < grown < 4.1 * block_bytes  # 2 resident blocks + 2 slots
    got = _calls(model, inputs, 2)
    streamer.revert()
    assert all(p.device.type == "cpu" for p in blocks.parameters())
    assert _equal(got, expected)


def test_enter_and_leave_never_wait_for_the_host():
    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16, num_layers=6)
    streamer = BlockStreamer(model.transformer_blocks, STREAMED, 2, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            for index in range(6):
                streamer.enter(index)
                streamer.leave(index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        streamer.revert()


def test_regional_compile_of_streamed_blocks_gives_the_compiled_resident_output():
    torch._dynamo.reset()
    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16, num_layers=6)
    inputs = _inputs(model)
    with inject_ltx2.apply_kernels(model, "cuda"):
        model.compile_repeated_blocks()
        expected = _calls(model, inputs)
        streamer = BlockStreamer(model.transformer_blocks, STREAMED, 2, "cuda")
        got = _calls(model, inputs)
        streamer.revert()
    torch._dynamo.reset()
    assert _equal(got, expected)


def test_fp8_blocks_quantized_on_the_host_give_the_gpu_quantized_output():
    """--memory-budget injects while the blocks are on the host: their FP8 copies are made on the GPU, kept on the
    host, then streamed; the output is the one of the model quantized on the GPU."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("FP8 needs compute capability 9.0")
    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16, num_layers=6)
    inputs = _inputs(model)
    with inject_ltx2.apply_kernels(model, "cuda", precision="fp8"):
        expected = _calls(model, inputs, 2)
    model.transformer_blocks.cpu()
    report = inject_ltx2.apply_kernels(model, "cuda", precision="fp8")
    streamer = BlockStreamer(model.transformer_blocks, STREAMED, 2, "cuda")
    got = _calls(model, inputs, 2)
    streamer.revert()
    report.revert()
    assert _equal(got, expected)
