"""LTX-2's fused blocks with the cuda provider (GPU only): in fp32 the kernels compute the model's math to rounding;
on the released 19B config cut to 2 blocks, in bf16 at the pipeline's default size (121 frames 512x768: 6144 video
tokens, 126 audio tokens, 1024 text tokens), the patched output's error against the fp32 model is at most 1.1x the
unpatched bf16 output's, and its cosine to the unpatched output at least 0.9999: text-to-video with a guidance batch,
image-to-video's per-token timesteps, the modality-isolated pass; and under regional compile."""

from __future__ import annotations

import pytest
import torch

from ltxbench.bench import e2e
from ltxbench.inject import ltx2 as inject_ltx2
from tests.helpers import cast_floats, ltx2_cuda_inputs, ltx2_cuda_transformer

pytestmark = pytest.mark.gpu


def _rel(got, reference) -> float:
    return max(((g.double() - r.double()).norm() / r.double().norm()).item() for g, r in zip(got, reference,
                                                                                              strict=True))


def _cos(a, b) -> float:
    return min(torch.nn.functional.cosine_similarity(x.double().flatten(), y.double().flatten(), dim=0).item()
               for x, y in zip(a, b, strict=True))


def test_fp32_kernels_compute_the_models_math():
    """fp32, TF32 off: the fused path differs from the unpatched model by rounding only, so a wrong eps, gate or
    shift (which a bf16 cosine could miss) fails here."""
    model = ltx2_cuda_transformer("ltx2-19b", torch.float32)
    inputs = ltx2_cuda_inputs(model, "t2v", frames=2, height=4, width=6, text=64, audio=9)
    assert not torch.backends.cuda.matmul.allow_tf32
    with torch.no_grad():
        expected = model(**inputs)
        with inject_ltx2.apply_kernels(model, "cuda") as report:
            assert report.rules[inject_ltx2.BLOCK_RULE] == 2
            got = model(**inputs)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=5e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def models():
    """The 19B config cut to 2 blocks, in fp32 (the reference) and bf16 (the same weights)."""
    fp32 = ltx2_cuda_transformer("ltx2-19b", torch.float32)
    bf16 = ltx2_cuda_transformer("ltx2-19b", torch.float32).to(torch.bfloat16)
    yield fp32, bf16
    del fp32, bf16
    torch.cuda.empty_cache()


@pytest.mark.parametrize("case", ["t2v", "i2v", "isolated"])
def test_19b_two_blocks_bf16_error_against_fp32_at_most_the_models(models, case):
    fp32, bf16 = models
    inputs = ltx2_cuda_inputs(fp32, case)
    with torch.no_grad():
        reference = fp32(**inputs)
        low = cast_floats(inputs, torch.bfloat16)
        unpatched = bf16(**low)
        with inject_ltx2.apply_kernels(bf16, "cuda"):
            patched = bf16(**low)
    ours, theirs, cos = _rel(patched, reference), _rel(unpatched, reference), _cos(patched, unpatched)
    print(f"{case}: relative L2 error vs fp32: patched {ours:.4g}, unpatched {theirs:.4g}; cosine {cos:.6f}")
    assert ours <= 1.1 * theirs, (ours, theirs)
    assert cos >= 0.9999, cos


def test_19b_two_blocks_regional_compile_of_the_patched_model(models):
    _, bf16 = models
    inputs = cast_floats(ltx2_cuda_inputs(bf16, "t2v"), torch.bfloat16)
    with torch.no_grad(), inject_ltx2.apply_kernels(bf16, "cuda"):
        eager = bf16(**inputs)
        bf16.compile_repeated_blocks(dynamic=False)
        try:
            compiled = bf16(**inputs)
        finally:
            e2e.uncompile_module(bf16)
            torch._dynamo.reset()
    assert _cos(compiled, eager) >= 0.9999


def test_tiny_pipeline_under_cuda_graphs_gives_its_eager_latents():
    """Regional compile with CUDA graphs (mode reduce-overhead) over the patched blocks, as `bench e2e` compiles it
    (bench.e2e.compile_module), as users run generations: each step's three transformer calls (the guidance pair, the
    STG pass, the modality-isolated pass), two generations. No tensor a graph made may be read after a later replay
    overwrote it (torch raises then), and the latents are the eager patched pipeline's."""
    from ltxbench.models import ltx2_build

    pipe = ltx2_build.build_pipeline("ltx2-tiny", "random", "cuda", torch.bfloat16, seed=0)
    pipe.set_progress_bar_config(disable=True)
    call = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=9, height=64, width=64,
                num_inference_steps=3, output_type="latent", return_dict=False)

    def generate():
        with torch.no_grad():
            return [t.clone() for t in pipe(**call, generator=torch.Generator("cpu").manual_seed(3))]

    with inject_ltx2.apply_kernels(pipe, "cuda"):
        eager = generate()
        e2e.compile_module(pipe.transformer, "reduce-overhead", "regional")
        try:
            graphed = [generate(), generate()]
        finally:
            e2e.uncompile_module(pipe.transformer)
            torch._dynamo.reset()
    for latents in graphed:
        assert _cos(latents, eager) >= 0.9999
