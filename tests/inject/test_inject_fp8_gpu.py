"""--precision fp8 with the cuda provider (GPU only, Hopper or newer): our FP8 kernels and torch._scaled_mm inside
the patched models compute what the reference provider's FP8 path computes (the same roundings: cosine ≥ 0.9999),
and stay within the FP8 gate of the bf16 output (cosine ≥ 0.995); LTX-Video's tiny pipeline and LTX-2's released
config cut to 2 blocks at 121 frames 512x768, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import (
    cast_floats,
    ltx2_cuda_inputs,
    ltx2_cuda_transformer,
    ltx_2b_two_blocks,
    ltx_embeddings,
    ltx_generate,
    ltx_pipeline,
    without_flash_attention_3,
)

pytestmark = pytest.mark.gpu


def _hopper() -> None:
    if torch.cuda.get_device_capability() < (9, 0):  # the gpu marker skips where no GPU is visible
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability 9.0+)")


def _cosine(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


@pytest.mark.parametrize("compiled", [False, True])
def test_ltx_2b_block_fp8_kernels_equal_the_reference_fp8_path(compiled):
    _hopper()
    from ltxbench.inject.ltx import apply_kernels, generation

    model, inputs = ltx_2b_two_blocks()

    def run(provider, precision):
        with apply_kernels(model, provider, precision=precision), generation(model), torch.no_grad():
            forward = torch.compile(model, fullgraph=False) if compiled and provider == "cuda" else model
            return forward(**inputs)[0].float()

    bf16, fp8, reference = run("cuda", "bf16"), run("cuda", "fp8"), run("reference", "fp8")
    assert _cosine(fp8, reference) >= 0.9999, _cosine(fp8, reference)
    assert _cosine(fp8, bf16) >= 0.995, _cosine(fp8, bf16)


def test_ltx2_19b_blocks_fp8_within_the_gate_of_bf16():
    _hopper()
    from ltxbench.inject import ltx2 as inject_ltx2

    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16)
    inputs = cast_floats(ltx2_cuda_inputs(model, "guidance"), torch.bfloat16)

    def run(precision):
        with inject_ltx2.apply_kernels(model, "cuda", precision=precision), torch.no_grad():
            video, audio = model(**inputs)
        return torch.cat([video.flatten().float(), audio.flatten().float()])

    bf16, fp8 = run("bf16"), run("fp8")
    assert _cosine(fp8, bf16) >= 0.995, _cosine(fp8, bf16)
    assert 1e-4 < (fp8 - bf16).norm().item() / bf16.norm().item() < 0.1


def test_ltx2_19b_blocks_fp8_attention_through_cudnn_against_its_emulation_and_bf16(monkeypatch):
    """The video self-attention in FP8 through cuDNN (19B blocks, 128-wide heads): equal to the reference provider's
    path up to bf16 rounding (there the op's fp32 emulation), and within FP8's gate of bf16."""

    _hopper()
    pytest.importorskip("cudnn", reason="cuDNN's frontend (nvidia-cudnn-frontend) not installed")
    without_flash_attention_3(monkeypatch)
    from ltxbench.inject import ltx2 as inject_ltx2

    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16)
    inputs = cast_floats(ltx2_cuda_inputs(model, "guidance"), torch.bfloat16)

    def run(provider, precision):
        with inject_ltx2.apply_kernels(model, provider, precision=precision) as report, torch.no_grad():
            video, audio = model(**inputs)
            assert precision == "bf16" or report.rules.get(inject_ltx2.ATTN1_FP8_RULE.format("cuDNN"))
        return torch.cat([video.flatten().float(), audio.flatten().float()])

    bf16, attention, emulated = run("cuda", "bf16"), run("cuda", "fp8-attention"), run("reference", "fp8-attention")
    assert _cosine(attention, emulated) >= 0.999, _cosine(attention, emulated)
    assert (attention - emulated).norm().item() / emulated.norm().item() <= 0.05  # a wrong scale shows here
    assert _cosine(attention, bf16) >= 0.995, _cosine(attention, bf16)


def test_fp8_under_model_cpu_offload_equals_fp8_on_the_gpu_and_leaves_with_the_model():
    """enable_model_cpu_offload after the injection (as `generate --cpu-offload` does): the FP8 weights are buffers,
    so the offload hooks bring them to the GPU with the transformer and take them back to the host after the
    generation, and the latents are those of the resident FP8 pipeline."""
    _hopper()
    from ltxbench.inject import fp8
    from ltxbench.inject.ltx import apply_kernels

    pipe = ltx_pipeline().to("cuda", torch.bfloat16)
    embeddings = tuple(t.to("cuda", torch.bfloat16) if t.is_floating_point() else t.to("cuda")
                       for t in ltx_embeddings(pipe))
    with apply_kernels(pipe, "cuda", precision="fp8"):
        resident = ltx_generate(pipe, embeddings, 3.0).float()
    with apply_kernels(pipe, "cuda", precision="fp8"):
        pipe.enable_model_cpu_offload(device="cuda")
        offloaded = ltx_generate(pipe, embeddings, 3.0).float()
        stored = [t for m in pipe.transformer.modules() for name, t in m._buffers.items() if name == fp8.DATA]
        assert stored and {t.device.type for t in stored} == {"cpu"}  # the transformer's offload took them along
    pipe.remove_all_hooks()
    assert (offloaded.cuda() - resident).abs().max().item() <= 1e-3 * resident.abs().max().item()
