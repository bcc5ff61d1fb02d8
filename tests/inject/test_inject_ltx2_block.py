"""LTX-2's fused block (ltxbench.inject.ltx2, block rule) on the CPU with the reference provider, ltx2-tiny in fp32:
one patched transformer call gives the model's output to 1e-6 of its largest value and the pipeline's latents to
1e-5 (text-to-video with its three guidance passes, image-to-video's per-token timesteps, the modality-isolated
pass); a 1% error in any fused formula fails that; calls the fused path does not reproduce take the original forward;
the text keys/values are kept under regional compile; revert restores the model."""

from __future__ import annotations

import pytest
import torch

from ltxbench.bench import e2e
from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.inject.fuse import FUSED_ATTR
from ltxbench.models.video_image import to_image_to_video
from ltxbench.ops import reference
from tests.helpers import (
    ltx2_call,
    ltx2_generate,
    ltx2_inputs,
    max_rel_error,
    realistic_modulation,
    with_shifted_output,
)

# max |patched - unpatched| / max |unpatched|, fp32 (the fused formulas round once where the model rounds per op):
CALL_ATOL = 1e-6  # one transformer call
ATOL = 1e-5  # the pipeline's latents after two steps, the guidance scales (3, 7) multiplying the differences


@pytest.fixture
def pipe(ltx2_tiny):
    return ltx2_tiny


def test_the_fused_pipeline_gives_the_models_latents(pipe):
    """Default guidance: per step the CFG pair (batch 2), the STG pass and the modality-isolated pass (no a2v/v2a)."""
    expected = ltx2_generate(pipe)
    with inject_ltx2.apply_kernels(pipe, "reference") as report:
        assert report.rules[inject_ltx2.BLOCK_RULE] == 2 and report.rules[inject_ltx2.PROJECTIONS_RULE] == 8
        assert not [s for s in report.skipped if s[0].startswith("transformer_blocks")]
        got = ltx2_generate(pipe)
    assert 0 < max_rel_error(got, expected) < ATOL or max_rel_error(got, expected) == 0


def test_image_to_video_per_token_timesteps(pipe):
    """Per-token modulation (B, Sv, D) through the kernels' broadcast strides, as the image-to-video pipeline runs."""
    transformer = pipe.transformer
    inputs = ltx2_inputs(transformer, per_token=True)
    with torch.no_grad():
        expected = transformer(**inputs)
        with inject_ltx2.apply_kernels(transformer, "reference"):
            got = transformer(**inputs)
    assert max_rel_error(got, expected) < CALL_ATOL
    assert to_image_to_video(pipe, "LTX2ImageToVideoPipeline").transformer is transformer


@pytest.mark.parametrize("isolate", [False, True])
def test_one_call_batch_1_and_2(pipe, isolate):
    transformer = pipe.transformer
    for batch in (1, 2):
        inputs = {**ltx2_inputs(transformer, batch=batch), "isolate_modalities": isolate}
        with torch.no_grad():
            expected = transformer(**inputs)
            with inject_ltx2.apply_kernels(transformer, "reference"):
                got = transformer(**inputs)
        assert max_rel_error(got, expected) < CALL_ATOL, (batch, isolate)


def _perturbed(name, index=0):
    """reference.<name> with its output `index` scaled by 1.01 (a 1% error in that fused formula)."""
    original = getattr(reference, name)

    def wrong(*args, **kwargs):
        out = original(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(o * 1.01 if i == index else o for i, o in enumerate(out))
        return out * 1.01

    return wrong


MUTATIONS = {
    "rms_norm_modulate": ("rms_norm_modulate", 0),
    "add_rms_norm_modulate norm": ("add_rms_norm_modulate", 0),
    "add_rms_norm_modulate residual": ("add_rms_norm_modulate", 1),
    "gated_residual": ("gated_residual", 0),
    "qk_rms_norm_rope_split q": ("qk_rms_norm_rope_split", 0),
    "qk_rms_norm_rope_split k": ("qk_rms_norm_rope_split", 1),
    "rms_norm_rope_split": ("rms_norm_rope_split", 0),
    "linear (GEMM epilogues)": ("linear", 0),
    "rms_norm (text queries)": ("rms_norm", 0),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_one_percent_error_in_any_fused_formula_fails_parity(pipe, monkeypatch, mutation):
    transformer = pipe.transformer
    expected = ltx2_call(transformer)
    name, index = MUTATIONS[mutation]
    monkeypatch.setattr(reference, name, _perturbed(name, index))
    with inject_ltx2.apply_kernels(transformer, "reference"):
        got = ltx2_call(transformer)
    assert max_rel_error(got, expected) > 10 * ATOL, mutation  # the parity bound, with a margin of 10


def test_calls_the_fused_path_does_not_reproduce_run_the_original(pipe, fused_calls):
    transformer = pipe.transformer
    with inject_ltx2.apply_kernels(transformer, "reference"):
        with torch.enable_grad():  # the kernels have no backward: the block's own forward
            transformer(**ltx2_inputs(transformer))
        assert not fused_calls
        ltx2_call(transformer)
        assert "qk_rms_norm_rope_split" in fused_calls and "rms_norm_rope_split" in fused_calls


def test_a_processor_replaced_after_injection_runs(pipe):
    transformer = pipe.transformer
    expected = ltx2_call(transformer)
    seen = []
    with inject_ltx2.apply_kernels(transformer, "reference"):
        attn = transformer.transformer_blocks[1].audio_to_video_attn
        original = attn.processor

        def recording(*args, **kwargs):
            seen.append(args[1].shape)
            return original(*args, **kwargs)

        attn.processor = recording
        got = ltx2_call(transformer)
        attn.processor = original
    assert len(seen) == 1 and max_rel_error(got, expected) < CALL_ATOL


def test_ltx2_3_blocks_and_unknown_sources_are_refused(pipe, monkeypatch):
    transformer = pipe.transformer
    transformer.transformer_blocks[0].perturbed_attn = True
    with inject_ltx2.apply_kernels(transformer, "reference") as report:
        assert report.rules[inject_ltx2.BLOCK_RULE] == 1
        assert ("transformer_blocks.0", "perturbed_attn on (LTX-2.3 block math): not reproduced") in report.skipped
    transformer.transformer_blocks[0].perturbed_attn = False
    monkeypatch.setattr(inject_ltx2, "BLOCK_SOURCES", ("0" * 16, "0" * 16))
    with inject_ltx2.apply_kernels(transformer, "reference") as report:
        assert inject_ltx2.BLOCK_RULE not in report.rules
        assert "is not the code this rule reproduces" in dict(report.skipped)["transformer_blocks.1"]


def test_revert_restores_the_blocks(pipe):
    transformer = pipe.transformer
    blocks = transformer.transformer_blocks
    classes = [type(b) for b in blocks]
    state = {k: v.clone() for k, v in transformer.state_dict().items()}
    report = inject_ltx2.apply_kernels(pipe, "reference")
    assert all(type(b) is not c for b, c in zip(blocks, classes, strict=True))
    report.revert()
    assert [type(b) for b in blocks] == classes
    assert not any(FUSED_ATTR in vars(attn) for b in blocks for attn in (b.attn1, b.audio_attn1))
    assert all(torch.equal(v, state[k]) for k, v in transformer.state_dict().items())


def test_text_keys_values_are_kept_under_regional_compile(pipe):
    """Regional compile traces the block forward: the cache lookup runs outside its graph, so the keys/values are
    still built once per input in a generation (dynamo with the eager backend: the mechanics, not inductor)."""
    transformer = pipe.transformer
    inputs = ltx2_inputs(transformer)  # one prompt for both calls, as a generation's steps
    expected = ltx2_call(transformer, **inputs)
    with inject_ltx2.apply_kernels(transformer, "reference"):
        cache = vars(transformer)[inject_ltx2.CACHE_ATTR]
        transformer.compile_repeated_blocks(backend="eager", dynamic=False)
        try:
            with inject_ltx2.generation(transformer):
                first = ltx2_call(transformer, **inputs)
                second = ltx2_call(transformer, **inputs)
        finally:
            e2e.uncompile_module(transformer)
            torch._dynamo.reset()
    assert cache.builds == 2 * 2 + 2 and cache.hits == cache.builds  # 2 blocks x 2 text attentions + 2 projections
    assert max_rel_error(first, expected) < CALL_ATOL and torch.equal(first[0], second[0])


def test_no_tensor_the_compiled_block_keeps_is_made_in_its_graph(pipe, monkeypatch):
    """The zero modulation a block keeps across calls is made outside the compiled graph: under CUDA graphs a tensor
    made in the graph lives in the graph's pool, where the next replay overwrites it (torch then refuses to read it)."""
    from ltxbench.inject.ltx2 import block as block_module

    made_while_compiling = []
    real = block_module._zeros
    monkeypatch.setattr(block_module, "_zeros", lambda like: made_while_compiling.append(
        torch.compiler.is_compiling()) or real(like, {}))
    transformer = pipe.transformer
    inputs = ltx2_inputs(transformer)
    with inject_ltx2.apply_kernels(transformer, "reference"):
        transformer.compile_repeated_blocks(backend="eager", dynamic=False)
        try:
            with inject_ltx2.generation(transformer):
                ltx2_call(transformer, **inputs)
        finally:
            e2e.uncompile_module(transformer)
            torch._dynamo.reset()
    assert made_while_compiling and not any(made_while_compiling)


def test_interleaved_rope_the_class_default(pipe, fused_calls):
    """rope_type "interleaved" (LTX2VideoTransformer3DModel's default, not the release's): self-attention through
    LTX-Video's q/k norm + RoPE kernel, the audio<->video attentions' own tables through diffusers' rotation."""
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel.from_config({**pipe.transformer.config, "rope_type": "interleaved"})
    transformer = transformer.eval().requires_grad_(False)
    realistic_modulation(transformer)
    expected = ltx2_call(transformer)
    with inject_ltx2.apply_kernels(transformer, "reference") as report:
        assert report.rules[inject_ltx2.BLOCK_RULE] == 2
        got = ltx2_call(transformer)
    assert "qk_rms_norm_rope" in fused_calls and "qk_rms_norm_rope_split" not in fused_calls
    assert max_rel_error(got, expected) < CALL_ATOL


@pytest.mark.parametrize("layer", ["attn1.to_q", "attn1.to_out.0", "ff.net.0.proj", "audio_attn2.to_k"])
def test_a_hook_put_on_a_projection_after_the_injection_runs(pipe, layer):
    """The fused GEMMs (q/k/v, the out-projection with its residual, the up-projection with its GELU) read the layers'
    weights: a forward hook put on one after the injection (a probe, an adapter's hook) must still run."""
    transformer = pipe.transformer
    inputs = ltx2_inputs(transformer)
    proj = transformer.transformer_blocks[0].get_submodule(layer)

    def hooked():
        with torch.no_grad():
            return with_shifted_output(proj, lambda: transformer(**inputs))

    expected = hooked()
    with inject_ltx2.apply_kernels(transformer, "reference"):
        got = hooked()
    with torch.no_grad():
        assert max_rel_error(transformer(**inputs), expected) > 1e-3  # the hook matters
    assert max_rel_error(got, expected) < CALL_ATOL
