"""The LTX step's inputs (ltx/step.py): built before nn.Module.compile()'s compiled forward and handed to it, so the
graph holds the block loop only; traced from __call__ the forward builds them itself (CPU, reference provider)."""

import torch
from torch._dynamo.testing import EagerAndRecordGraphs

from ltxbench.inject.ltx import apply_kernels, generation
from tests.helpers import ltx_inputs, ltx_transformer


def _graph_names(graphs) -> set[str]:
    return {node.name for graph in graphs for node in graph.graph.nodes}


def test_module_compile_graph_takes_the_step_inputs_and_traced_calls_build_them():
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
        with apply_kernels(model, "reference"):
            torch._dynamo.reset()
            recorded = EagerAndRecordGraphs()
            model.compile(backend=recorded)
            try:
                got = model(**inputs)[0]
            finally:
                model._compiled_call_impl = None
            torch._dynamo.reset()
            traced = EagerAndRecordGraphs()
            torch.compile(model, backend=traced)(**inputs)
            torch._dynamo.reset()
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert len(recorded.graphs) == 1 and len(traced.graphs) == 1
    in_compiled, in_traced = _graph_names(recorded.graphs), _graph_names(traced.graphs)
    # the timestep embedding and proj_in ran before the compiled forward; traced, they are in its graph
    assert not any("time_embed" in name or "proj_in" in name for name in in_compiled)
    assert any("time_embed" in name for name in in_traced) and any("proj_in" in name for name in in_traced)
    assert any("transformer_blocks" in name for name in in_compiled)  # the blocks are compiled


def test_positional_and_keyword_calls_build_the_same_step():
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    positional = [inputs.pop(name) for name in ("hidden_states", "encoder_hidden_states", "timestep",
                                                 "encoder_attention_mask")]
    with torch.no_grad():
        expected = model(*positional, **inputs)[0]
        with apply_kernels(model, "reference"):
            got = model(*positional, **inputs)[0]
            mixed = model(*positional[:2], timestep=positional[2], encoder_attention_mask=positional[3], **inputs)[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert torch.equal(mixed, got)


def test_a_lora_scale_leaves_the_step_inputs_to_the_forward():
    """attention_kwargs["scale"] is applied to LoRA layers by the forward's decorator, around the forward only:
    a step built before it would run proj_in, time_embed and the caption projection unscaled."""
    from ltxbench.inject.ltx.cross_kv import CACHE_ATTR

    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = model(**inputs, attention_kwargs={"scale": 0.5})[0]
        with apply_kernels(model, "reference"), generation(model):
            cache = vars(model)[CACHE_ATTR]
            scaled = model(**inputs, attention_kwargs={"scale": 0.5})[0]
            assert cache.builds == 0  # the forward built the step: no cache entry came from __call__
            model(**inputs, attention_kwargs={})
            assert cache.builds == 1
    torch.testing.assert_close(scaled, expected, atol=1e-6, rtol=0)  # the unpatched model's answer
