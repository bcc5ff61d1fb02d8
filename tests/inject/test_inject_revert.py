"""revert() restores the model's own forwards through hooks installed after the injection (accelerate's, diffusers'
hook registry), and refuses, undoing nothing, where a wrapper of unknown kind holds a patched forward."""

from __future__ import annotations

import functools

import pytest
import torch

from ltxbench.inject import ORIGINAL_CLASS, RevertRefused, llm
from ltxbench.inject.ltx import apply_kernels
from tests.helpers import llm_build, llm_prompt, ltx_inputs, ltx_transformer


def _unpatched(model) -> bool:
    return not any(ORIGINAL_CLASS in vars(type(m)) for m in model.modules())


def test_revert_through_accelerate_hooks_installed_after_the_injection(fused_calls):
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = apply_kernels(model, "reference")
        for module in (model, *model.transformer_blocks):  # offload hooks the model; device maps hook the blocks
            add_hook_to_module(module, ModelHook())
        model(**inputs)
        assert fused_calls
        report.revert()
        fused_calls.clear()
        hooked = model(**inputs)[0]
        assert not fused_calls and _unpatched(model)
        for module in (model, *model.transformer_blocks):
            remove_hook_from_module(module)
        assert torch.equal(model(**inputs)[0], expected) and not fused_calls
    assert torch.equal(hooked, expected)


def test_revert_through_a_diffusers_hook_registered_after_the_injection(fused_calls):
    from diffusers.hooks import HookRegistry, ModelHook

    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = apply_kernels(model, "reference")
        for module in (model, *model.transformer_blocks):
            HookRegistry.check_if_exists_or_initialize(module).register_hook(ModelHook(), "user hook")
        report.revert()
        fused_calls.clear()
        hooked = model(**inputs)[0]
        assert not fused_calls
        for module in (model, *model.transformer_blocks):
            module._diffusers_hook.remove_hook("user hook")
        assert torch.equal(model(**inputs)[0], expected) and not fused_calls
    assert torch.equal(hooked, expected)


def test_revert_refuses_a_wrapper_it_cannot_see_through_and_undoes_nothing(fused_calls):
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    block = model.transformer_blocks[1]
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = apply_kernels(model, "reference")
        patched_forward = block.forward

        def timed_forward(*args, **kwargs):  # a user's wrapper: a closure over the patched forward
            return patched_forward(*args, **kwargs)

        block.forward = timed_forward
        with pytest.raises(RevertRefused, match="LTXVideoTransformerBlock's forward is wrapped by .*timed_forward"):
            report.revert()
        assert report.active and not _unpatched(model)  # nothing undone: still consistently patched
        block.forward = functools.partial(lambda f, *a, **k: f(*a, **k), patched_forward)  # a partial, too
        with pytest.raises(RevertRefused):
            report.revert()
        del block.forward
        report.revert()
        assert _unpatched(model)
        fused_calls.clear()
        assert torch.equal(model(**inputs)[0], expected) and not fused_calls


def test_llm_revert_through_accelerate_hooks_on_its_layers(fused_calls):
    from accelerate.hooks import ModelHook, add_hook_to_module

    model = llm_build("llama")
    ids = llm_prompt()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        report = llm.apply_kernels(model, "reference")
        for layer in model.model.layers:  # what a device map (dispatch_model) installs
            add_hook_to_module(layer, ModelHook())
            add_hook_to_module(layer.mlp, ModelHook())
        report.revert()
        fused_calls.clear()
        got = model(input_ids=ids).logits
    assert not fused_calls and _unpatched(model)
    assert torch.equal(got, expected)


def test_a_member_patched_twice_is_refused():
    """Each patched member calls `original_class(self).<member>`: a second layer would call the first, and the first
    itself, forever. The second patch of the same member on one object is refused; another member is not."""
    from ltxbench.inject import InjectionReport, patch_call, patch_forward

    module = torch.nn.Linear(2, 2)
    report = InjectionReport("reference")
    patch_call(report, "call", module, lambda self, *a, **k: torch.nn.Linear.__call__(self, *a, **k), {})
    with pytest.raises(ValueError, match="Linear.__call__ is patched by ltxbench already"):
        patch_call(report, "call again", module, lambda self, *a, **k: None, {})
    patch_forward(report, "forward", module, lambda self, x: torch.nn.Linear.forward(self, x), {})
    assert module(torch.ones(1, 2)).shape == (1, 2)
    report.revert()
    assert type(module) is torch.nn.Linear
