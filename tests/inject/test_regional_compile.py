"""Regional compile of an injected transformer, as `--compile-scope regional` and LTX-2's default run it: diffusers'
compile_repeated_blocks compiles the block class once and every block reuses that code. Anything in the patched
forwards that dynamo must treat as a per-block constant (a module passed to assume_constant_result, an id) traces a
graph per block instead; past torch's recompile limit the remaining blocks then run eagerly, silently slow."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from tests.helpers import ltx2_inputs, ltx2_transformer, wan_inputs, wan_transformer


def _ltx2(blocks: int):
    from ltxbench.inject.ltx2 import apply_kernels

    model = ltx2_transformer(num_layers=blocks)
    return model, ltx2_inputs(model), apply_kernels


def _wan(blocks: int):
    from ltxbench.inject.wan import apply_kernels

    model = wan_transformer(dtype="fp32")
    model.blocks = torch.nn.ModuleList(list(model.blocks)[:blocks])
    return model, wan_inputs(model), apply_kernels


def _compiled_graphs(build, blocks: int) -> tuple[int, dict]:
    """Graphs dynamo traced (and its recompiles) for two calls of the injected model under regional compile; the
    compiled output checked against the eager injected model's."""
    model, inputs, apply_kernels = build(blocks)
    with torch.no_grad(), apply_kernels(model, "reference"):
        expected = model(**inputs)[0]
        torch._dynamo.reset()
        counters.clear()
        model.compile_repeated_blocks(dynamic=False)
        try:
            for _ in range(2):
                got = model(**inputs)[0]
            graphs, recompiles = counters["stats"]["unique_graphs"], dict(counters["recompiles"])
        finally:
            torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=2e-4, atol=2e-4)
    return graphs, recompiles


@pytest.mark.parametrize("build", [_ltx2, _wan], ids=["ltx2", "wan"])
def test_the_blocks_of_an_injected_transformer_share_their_compiled_graphs(build):
    one, recompiles = _compiled_graphs(build, 1)
    assert one >= 1 and recompiles == {}
    assert _compiled_graphs(build, 2) == (one, {})  # LTX-2: 2 (the eager lookup of the text cache breaks the graph)
