"""attn2's keys/values computed once per generation (ltx/cross_kv.py): kept only inside a generation, reused there while
nothing they depend on changed, rebuilt or skipped when it did, and exactly what every step would compute (CPU,
reference provider)."""

import pytest
import torch

from ltxbench.inject.ltx import CROSS_KV_RULE, GENERATION_RULE, apply_kernels, generation
from ltxbench.inject.ltx.cross_kv import CACHE_ATTR
from tests.helpers import ltx_inputs, ltx_transformer


def _cache(model):
    return vars(model)[CACHE_ATTR]


def _run(model, inputs, **changes):
    return model(**{**inputs, **changes})[0]


def test_steps_with_one_prompt_compute_its_keys_values_once_and_match_every_step_computing_them():
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    projections = []
    model.caption_projection.register_forward_hook(lambda *_: projections.append(1))
    with torch.no_grad():
        expected = _run(model, inputs)
        with apply_kernels(model, "reference", cross_kv_cache=False) as report:
            assert CROSS_KV_RULE not in report.rules and CACHE_ATTR not in vars(model)
            uncached = [_run(model, inputs, timestep=torch.tensor([t, 20.0])) for t in (500.0, 400.0)]
        projections.clear()
        with apply_kernels(model, "reference") as report, generation(model):
            assert report.rules[CROSS_KV_RULE] == 1
            assert GENERATION_RULE in dict(report.skipped)  # given the transformer: the scope is the caller's
            first = _run(model, inputs)
            cached = [_run(model, inputs, timestep=torch.tensor([t, 20.0])) for t in (500.0, 400.0)]
            cache = _cache(model)
            assert (cache.builds, cache.hits) == (1, 2)
        assert CACHE_ATTR not in vars(model)
    assert projections == [1]  # the caption projection ran once for three steps
    torch.testing.assert_close(first, expected, atol=1e-6, rtol=0)
    for got, want in zip(cached, uncached, strict=True):
        assert torch.equal(got, want)  # the same ops on the same inputs, only fewer times
    assert not torch.equal(cached[0], cached[1])  # the steps differ (timestep): the comparison can fail


@pytest.mark.parametrize("change", ["new prompt tensor", "prompt in place", "to_k in place", "norm_k in place",
                                    "caption projection in place", "caption linear_1 in place", "to_v replaced",
                                    "norm_k .data replaced"])
def test_a_changed_prompt_or_weight_rebuilds_the_entry(change):
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    attn2 = model.transformer_blocks[1].attn2
    with torch.no_grad():
        with apply_kernels(model, "reference"), generation(model):
            before = _run(model, inputs)
            if change == "new prompt tensor":
                inputs["encoder_hidden_states"] = inputs["encoder_hidden_states"] * 2
            elif change == "prompt in place":
                inputs["encoder_hidden_states"].mul_(2)
            elif change == "to_k in place":
                attn2.to_k.weight.add_(0.5)  # a view of the fused k/v weight
            elif change == "norm_k in place":
                attn2.norm_k.weight.mul_(3)
            elif change == "caption projection in place":
                model.caption_projection.linear_2.bias.add_(1)
            elif change == "caption linear_1 in place":
                model.caption_projection.linear_1.weight.mul_(1.5)
            elif change == "norm_k .data replaced":  # what Module.to() / load_state_dict(assign=...) can do
                attn2.norm_k.weight.data = attn2.norm_k.weight.data * 3
            else:
                attn2.to_v.weight = torch.nn.Parameter(attn2.to_v.weight + 0.5)
            after = _run(model, inputs)
            assert _cache(model).builds == 2
        expected = _run(model, inputs)
    assert not torch.equal(after, before)  # the change matters, so a stale entry would be seen
    torch.testing.assert_close(after, expected, atol=1e-6, rtol=0)


def test_outside_a_generation_every_step_computes_its_keys_values():
    """The transformer called on its own, with no generation scope: nothing is kept from one call to the next, so a
    weight written through `.data` (what PEFT's fuse_lora does; no version bump) is seen by the next call."""
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    to_k = model.transformer_blocks[0].attn2.to_k
    with torch.no_grad(), apply_kernels(model, "reference"):
        first = _run(model, inputs)
        to_k.weight.data += 0.5
        second = _run(model, inputs)
        assert (_cache(model).builds, _cache(model).entry) == (0, None)
    with torch.no_grad():
        expected = _run(model, inputs)
    assert not torch.equal(first, second)
    torch.testing.assert_close(second, expected, atol=1e-6, rtol=0)


def test_a_generation_forgets_its_entry_on_exit_and_on_an_error():
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    to_k = model.transformer_blocks[0].attn2.to_k
    with torch.no_grad(), apply_kernels(model, "reference"):
        cache = _cache(model)
        with generation(model):
            _run(model, inputs)
            assert cache.entry is not None
        assert (cache.entry, cache.generations) == (None, 0)
        with pytest.raises(KeyboardInterrupt), generation(model):
            _run(model, inputs)
            raise KeyboardInterrupt  # a generation interrupted between steps
        assert (cache.entry, cache.generations) == (None, 0)
        to_k.weight.data.mul_(1.01)  # invisible to the identity/version check
        with generation(model):
            got = _run(model, inputs)
        assert cache.builds == 3
    with torch.no_grad():
        expected = _run(model, inputs)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_no_entry_where_a_change_could_go_unseen():
    """A module wrapper (LoRA), a forward pre-hook, an offload hook's forward, inference tensors and autograd all
    compute every step; the results stay the unpatched model's."""
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = _run(model, inputs)
        with apply_kernels(model, "reference"), generation(model):
            cache = _cache(model)

            def check(run):
                got = run()
                assert cache.entry is None and cache.builds == 0
                torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)

            handle = model.register_forward_pre_hook(lambda module, args: None)
            check(lambda: _run(model, inputs))
            handle.remove()
            handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
            try:  # a global pre-hook may rewrite any module's inputs: nothing may be cached past it
                check(lambda: _run(model, inputs))
            finally:
                handle.remove()
            model.forward = model.forward  # what accelerate's add_hook_to_module leaves
            check(lambda: _run(model, inputs))
            del model.forward
            with torch.inference_mode():
                check(lambda: _run(model, {**inputs, "encoder_hidden_states": inputs["encoder_hidden_states"].clone()}))
            with torch.enable_grad():
                check(lambda: _run(model, inputs).detach())
            attn2 = model.transformer_blocks[0].attn2
            linear = attn2.to_k
            attn2.to_k = torch.nn.Sequential(linear)  # a wrapper around the same weights
            check(lambda: _run(model, inputs))
            attn2.to_k = linear
            from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor

            ours = attn2.processor
            attn2.set_processor(LTXVideoAttnProcessor())  # the user's processor computes its own keys: no cross_kv
            check(lambda: _run(model, inputs))
            attn2.set_processor(ours)
            assert _run(model, inputs) is not None and cache.builds == 1  # back to plain layers: cached again


def test_compiled_forward_takes_the_entry_as_an_input_without_recompiling():
    """nn.Module.compile(): the lookup runs in __call__, before the compiled forward, which gets the entry as an
    argument: one graph, no graph break, no recompile as steps reuse it. Traced from __call__ (torch.compile(model),
    dynamo.explain) there is no cache and still no graph break."""
    from torch._dynamo.testing import CompileCounter

    model = ltx_transformer()
    inputs = ltx_inputs(model)
    counter = CompileCounter()
    with torch.no_grad():
        expected = [_run(model, inputs, timestep=torch.tensor([t, 20.0])) for t in (500.0, 400.0)]
        with apply_kernels(model, "reference"):
            torch._dynamo.reset()
            model.compile(backend=counter)
            try:
                with generation(model):
                    got = [_run(model, inputs, timestep=torch.tensor([t, 20.0])) for t in (500.0, 400.0)]
            finally:
                model._compiled_call_impl = None
            assert (counter.frame_count, _cache(model).builds, _cache(model).hits) == (1, 1, 1)
            torch._dynamo.reset()
            explained = torch._dynamo.explain(model)(**inputs)
            assert explained.graph_break_count == 0 and _cache(model).builds == 1
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.gpu
def test_cuda_kernels_with_the_cache_under_module_compile_match_the_unpatched_model():
    """The optimized+compile configuration of `bench e2e`: cuda provider, nn.Module.compile() (inductor), two steps
    with one prompt on a two-layer 2B-width model in bf16, against the unpatched eager model."""
    model = ltx_transformer("ltx-2b", num_layers=2, device="cuda", dtype=torch.bfloat16)
    inputs = ltx_inputs(model, "cuda", torch.bfloat16, frames=3, height=8, width=12)
    steps = [torch.tensor([t, 20.0], device="cuda") for t in (500.0, 400.0)]
    with torch.no_grad():
        expected = [_run(model, inputs, timestep=t).float() for t in steps]
        with apply_kernels(model, "cuda"):
            torch._dynamo.reset()
            model.compile()
            try:
                with generation(model):
                    got = [_run(model, inputs, timestep=t).float() for t in steps]
            finally:
                model._compiled_call_impl = None
                torch._dynamo.reset()
            assert (_cache(model).builds, _cache(model).hits) == (1, 1)
    for a, b in zip(got, expected, strict=True):
        assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item() >= 0.999


@pytest.mark.parametrize("kept", ["the prompt alone", "no version"])
def test_the_change_test_fails_when_the_key_forgets_what_an_entry_came_from(kept, monkeypatch):
    """The mutations the rebuild test must catch: an entry keyed on the prompt alone (a weight changed in place is
    not seen), or on identity without the version counter (an in-place write is not seen)."""
    from ltxbench.inject import ltx as ltx_inject

    if kept == "the prompt alone":
        monkeypatch.setattr(ltx_inject, "cache_sources", lambda model, states, processor_type: [states])
    else:
        monkeypatch.setattr(torch.Tensor, "_version", property(lambda self: 0))
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        with apply_kernels(model, "reference"), generation(model):
            _run(model, inputs)
            model.transformer_blocks[1].attn2.to_k.weight.add_(0.5)
            stale = _run(model, inputs)
        expected = _run(model, inputs)
    assert (stale - expected).abs().max() > 1e-3
