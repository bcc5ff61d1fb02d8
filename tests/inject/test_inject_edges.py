"""Injections at their edges (CPU, reference provider): an apply_kernels that fails part way leaves nothing patched
(every family); one module in both of Wan 2.2's expert slots is patched once; Wan's fused q/k norm + RoPE steps aside
for norms offloaded or hooked after the injection and refuses norms of two eps; revert gives back a user's own
encode_prompt; LTX-2's text encoder kept on the host is left as it is rather than failing the injection."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ORIGINAL_CLASS
from ltxbench.inject import wan as inject_wan
from ltxbench.inject.wan import QK_ROPE_RULE, apply_kernels
from ltxbench.inject.wan.pair import PAIR_RULE
from ltxbench.models import wan_build
from tests.helpers import wan_inputs, wan_transformer

GENERATE = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=5, height=32, width=32,
                num_inference_steps=2, output_type="latent", return_dict=False)


def _pipe(preset="wan-tiny"):
    pipe = wan_build.build_pipeline(preset, "random", "cpu", "fp32")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _latents(pipe):
    with torch.no_grad():
        return pipe(**GENERATE, generator=torch.Generator("cpu").manual_seed(3))[0]


def _patched_anywhere(*modules) -> bool:
    return any(ORIGINAL_CLASS in vars(type(m)) for root in modules for m in root.modules()) or any(
        ORIGINAL_CLASS in vars(type(getattr(m, "processor", None))) for root in modules for m in root.modules())


def test_a_wan_injection_that_fails_part_way_leaves_nothing_patched(monkeypatch):
    pipe = _pipe("wan-tiny-a14b")

    def fails(*_args, **_kwargs):
        raise RuntimeError("late refusal")

    monkeypatch.setattr(inject_wan, "_pair_guidance", fails)  # after both experts are patched
    with pytest.raises(RuntimeError, match="late refusal"):
        apply_kernels(pipe, "reference")
    assert not _patched_anywhere(pipe.transformer, pipe.transformer_2)
    monkeypatch.undo()
    with apply_kernels(pipe, "reference") as report:  # patches again: nothing was left behind
        assert not report.skipped


def test_an_ltx2_injection_whose_text_encoder_fails_leaves_the_transformer_unpatched(monkeypatch):
    from ltxbench.inject import llm
    from ltxbench.inject.ltx2 import apply_kernels as apply_ltx2
    from ltxbench.models import ltx2_build

    pipe = ltx2_build.build_pipeline("ltx2-tiny", "random", "cpu", "fp32")
    monkeypatch.setattr(llm, "apply_kernels", lambda *_a, **_k: (_ for _ in ()).throw(RuntimeError("encoder")))
    with pytest.raises(RuntimeError, match="encoder"):
        apply_ltx2(pipe, "reference")
    assert not _patched_anywhere(pipe.transformer)
    assert all(not k.startswith("_ltxbench") for k in vars(pipe.transformer))


def test_ltx2_text_encoder_on_the_host_is_left_as_it_is_with_the_cuda_provider():
    from ltxbench.inject import InjectionReport
    from ltxbench.inject.ltx2 import _patch_text_encoder
    from ltxbench.models import ltx2_build

    pipe = ltx2_build.build_pipeline("ltx2-tiny", "random", "cpu", "fp32")
    report = InjectionReport("cuda")
    _patch_text_encoder(report, pipe, pipe.transformer, "cuda", True)  # nothing built, nothing raised
    assert report.skipped == [("text_encoder", "on cpu: the cuda kernels run on a CUDA device; it runs as it is")]
    assert not report.rules and not _patched_anywhere(pipe.text_encoder)


def test_one_transformer_in_both_expert_slots_is_patched_once():
    pipe = _pipe("wan-tiny-a14b")
    pipe.register_modules(transformer_2=pipe.transformer)
    expected = _latents(pipe)
    with apply_kernels(pipe, "reference") as report:
        assert report.rules[QK_ROPE_RULE] == len(pipe.transformer.blocks) and report.rules[PAIR_RULE] == 1
        assert not any(target.startswith("transformer_2") for target, _ in report.skipped)
        torch.testing.assert_close(_latents(pipe), expected, rtol=1e-4, atol=2e-5)
    assert not _patched_anywhere(pipe.transformer)


@pytest.mark.parametrize("how", ["offloaded", "hooked"])
def test_the_fused_qk_norm_rope_steps_aside_for_norms_offloaded_or_hooked_after_the_injection(how):
    """The fused call reads norm_q/norm_k's weights itself: offloaded since (accelerate's hooks keep them on meta
    until each module runs) or hooked since (a probe must see them run), the processor's own call runs instead."""
    from accelerate import cpu_offload

    model = wan_transformer(dtype="fp32")
    inputs = wan_inputs(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
    seen = []
    with apply_kernels(model, "reference") as report:
        assert report.rules[QK_ROPE_RULE] == len(model.blocks)
        if how == "offloaded":
            cpu_offload(model, execution_device="cpu")
        else:
            model.blocks[0].attn1.norm_k.register_forward_hook(lambda *_: seen.append(1))
        with torch.no_grad():
            got = model(**inputs)[0]
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
    assert how == "offloaded" or seen == [1]


def test_norms_of_two_eps_are_refused_by_the_fused_qk_rope():
    model = wan_transformer(dtype="fp32")
    model.blocks[1].attn1.norm_k.eps = 1e-3
    with apply_kernels(model, "reference") as report:
        assert report.rules[QK_ROPE_RULE] == len(model.blocks) - 1
        assert ("blocks.1.attn1", "norm_q and norm_k differ in eps") in report.skipped


def test_revert_gives_back_a_users_own_encode_prompt():
    pipe = _pipe()
    original = pipe.encode_prompt
    calls = []

    def weighted(*args, **kwargs):  # a user's prompt weighting, set on the instance
        calls.append(1)
        prompt, negative = original(*args, **kwargs)
        return 2 * prompt, None if negative is None else 2 * negative

    pipe.encode_prompt = weighted
    expected = _latents(pipe)
    with apply_kernels(pipe, "reference", blocks=False, qk_norms=False, qk_rope=False, gelu=False):
        torch.testing.assert_close(_latents(pipe), expected, rtol=1e-4, atol=2e-5)  # through the user's, paired
    assert vars(pipe)["encode_prompt"] is weighted and len(calls) == 2
    assert torch.equal(_latents(pipe), expected) and len(calls) == 3


def test_the_guidance_pair_is_only_for_wans_own_transformer_class():
    """VACE's and Animate's transformers take per-sample inputs (control states, poses) the pair would not stack."""
    pipe = _pipe()
    cls = type(pipe.transformer)
    pipe.transformer.__class__ = type("WanVACETransformer3DModel", (cls,), {})
    try:
        with apply_kernels(pipe, "reference") as report:
            assert PAIR_RULE not in report.rules
            assert (PAIR_RULE, "WanVACETransformer3DModel is not WanTransformer3DModel: its other inputs would not "
                               "be stacked with the pair") in report.skipped
    finally:
        pipe.transformer.__class__ = cls


def test_ltx_videos_chained_blocks_step_aside_for_a_hook_put_on_a_block_since(monkeypatch):
    """The chained forward uses each block's layers without calling the block: a hook put on one after the injection
    (a probe; diffusers' First Block Cache, which decides per call) must see it run, so the original forward runs
    the blocks then. ltxbench's own streamer hooks (--memory-budget) keep the chain."""
    from diffusers import LTXVideoTransformer3DModel

    from ltxbench.inject import ltx as inject_ltx
    from ltxbench.memory.stream import BlockStreamer
    from tests.helpers import ltx_inputs, ltx_transformer

    model = ltx_transformer(num_layers=3)
    inputs = ltx_inputs(model)
    original, unchained = LTXVideoTransformer3DModel.forward, []

    def counted(self, *args, **kwargs):
        unchained.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LTXVideoTransformer3DModel, "forward", counted)
    with torch.no_grad():
        expected = model(**inputs)[0]
        seen = []
        with inject_ltx.apply_kernels(model, "reference"):
            unchained.clear()
            torch.testing.assert_close(model(**inputs)[0], expected, rtol=2e-5, atol=2e-5)
            assert not unchained  # the chain
            streamer = BlockStreamer(model.transformer_blocks, (0, 2), 2, "cpu")
            torch.testing.assert_close(model(**inputs)[0], expected, rtol=2e-5, atol=2e-5)
            assert not unchained  # still the chain: the streamer's hooks are ours
            streamer.revert()
            handle = model.transformer_blocks[1].register_forward_hook(lambda *_: seen.append(1))
            torch.testing.assert_close(model(**inputs)[0], expected, rtol=2e-5, atol=2e-5)
            handle.remove()
        assert seen == [1] and unchained == [1]


@pytest.mark.parametrize("family", ["ltx", "ltx2", "wan"])
def test_a_hook_put_on_a_blocks_layer_since_sees_it_run(family):
    """The fused blocks read their norms' and attentions' weights without calling those modules: a hook put on one
    after the injection (a probe, pyramid attention broadcast) must see it run, so that block runs its original
    forward; the output stays the unpatched model's."""
    from tests.helpers import ltx2_call, ltx2_transformer, ltx_inputs, ltx_transformer

    if family == "ltx":
        from ltxbench.inject.ltx import apply_kernels as apply
        model = ltx_transformer(num_layers=3)
        inputs = ltx_inputs(model)
        run = lambda: model(**inputs)[0]  # noqa: E731
        layer = model.transformer_blocks[1].norm1  # folded into the previous block's add + norm
    elif family == "ltx2":
        from ltxbench.inject.ltx2 import apply_kernels as apply
        model = ltx2_transformer(3)
        run = lambda: ltx2_call(model)[0]  # noqa: E731
        layer = model.transformer_blocks[1].audio_attn1
    else:
        apply = apply_kernels
        model = wan_transformer(dtype="fp32")
        inputs = wan_inputs(model)
        run = lambda: model(**inputs)[0]  # noqa: E731
        layer = model.blocks[1].norm1
    layers = [layer]
    if family == "ltx":  # attn1's processor reads its q/k norms' weights itself
        layers.append(model.transformer_blocks[2].attn1.norm_k)
    with torch.no_grad():
        expected = run()
        for layer in layers:
            seen = []
            with apply(model, "reference"):
                handle = layer.register_forward_hook(lambda *_, seen=seen: seen.append(1))
                got = run()
                handle.remove()
            assert seen == [1]
            torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
