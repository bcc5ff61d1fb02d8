"""The ltx-core peer of LTX-2 (ltxbench.models.ltx2_core) on the CPU, ltx2-tiny in fp32: Lightricks' LTXModel on the
diffusers model's own parameters (no copy) answers the pipeline's calls (the guidance pair with its text mask, the
modality-isolated pass) with diffusers' outputs, the pipeline with it gives the stg-off latents, a mutated weight
moves both (the weights are shared, not copied), revert restores the model; refusals in one line."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from tests.helpers import build_ltx2_tiny, ltx2_call, ltx2_generate, ltx2_inputs, ltx2_transformer

pytest.importorskip("ltx_core", reason="the ltx-core peer needs the ltx-core package (pip install ltx-core einops)")
from ltxbench.models import ltx2_core  # noqa: E402

runner = CliRunner()
LTX2_TINY = ["bench", "e2e", "--model", "ltx2-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9",
             "--height", "64", "--width", "64", "--steps", "2", "--warmup-iterations", "1", "--repeats", "1"]


@pytest.fixture(scope="module")
def transformer():
    return ltx2_transformer(3)


def test_the_core_model_holds_the_diffusers_parameters_themselves(transformer):
    model = ltx2_core.core_model(transformer)
    theirs = {p.data_ptr() for p in model.parameters()}
    assert theirs == {p.data_ptr() for p in transformer.parameters()}
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in transformer.parameters())


@pytest.mark.parametrize("call", ["pair", "masked", "isolated"])
def test_each_pipeline_call_gets_the_diffusers_output(transformer, call):
    """The guidance pair (two samples at two timesteps), with the prompt's padding masked, and the modality-isolated
    pass: ltx-core's outputs equal diffusers' (fp32: both compute the same operations; a formula off by 1% would
    show at 1e-2)."""
    inputs = ltx2_inputs(transformer)
    if call == "masked":
        inputs["encoder_attention_mask"][1, 10:] = 0
        inputs["audio_encoder_attention_mask"][1, 10:] = 0
    if call == "isolated":
        inputs["isolate_modalities"] = True
    expected = ltx2_call(transformer, **inputs)
    with torch.no_grad():
        got = ltx2_core._call(ltx2_core.core_model(transformer), transformer, **inputs)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        assert (e.abs().max() > 0.1).item()
    if call == "isolated":  # the isolation matters at these magnitudes
        plain = ltx2_call(transformer, **{**inputs, "isolate_modalities": False})
        assert not torch.allclose(plain[0], expected[0], atol=1e-3)


def test_per_token_timesteps_and_the_stg_pass_are_refused_at_the_call(transformer):
    model = ltx2_core.core_model(transformer)
    with pytest.raises(RuntimeError, match="per-token timesteps"), torch.no_grad():
        ltx2_core._call(model, transformer, **ltx2_inputs(transformer, per_token=True))
    with pytest.raises(RuntimeError, match="STG pass reached the peer"), torch.no_grad():
        ltx2_core._call(model, transformer, **ltx2_inputs(transformer), spatio_temporal_guidance_blocks=[1])
    with pytest.raises(RuntimeError, match="passes attention_kwargs, which the peer does not feed"), torch.no_grad():
        ltx2_core._call(model, transformer, **ltx2_inputs(transformer), attention_kwargs={"scale": 0.5})


def test_the_pipeline_with_the_peer_gives_the_stg_off_latents_and_reverts():
    """The pipeline without its STG pass (the peer's run settings): the same latents through ltx-core as through
    diffusers; a weight edited in place moves ltx-core's output (shared, not copied); revert restores the forward."""
    pipe = build_ltx2_tiny()
    off = {"stg_scale": 0.0, "audio_stg_scale": 0.0}
    expected = ltx2_generate(pipe, **off)
    report = ltx2_core.apply_ltx_core(pipe)
    try:
        got = ltx2_generate(pipe, **off)
        assert report.calls > 0
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        weight = pipe.transformer.transformer_blocks[0].ff.net[2].weight
        kept = weight.detach().clone()
        with torch.no_grad():
            weight.mul_(1.01)
            moved = ltx2_generate(pipe, **off)
            weight.copy_(kept)
        assert not torch.allclose(moved[0], got[0], atol=1e-6)
    finally:
        report.revert()
    assert "forward" not in vars(pipe.transformer)
    assert all(torch.equal(a, b) for a, b in zip(ltx2_generate(pipe, **off), expected, strict=True))


def test_bench_e2e_times_the_peer_beside_stg_off(tmp_path):
    out = tmp_path / "core.json"
    result = runner.invoke(app, [*LTX2_TINY, "--configs", "stg-off,ltx-core", "--phase", "transformer",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    injection = doc["run"]["config"]["injection"]["ltx-core"]
    assert injection["provider"] == "ltx-core" and injection["library"].startswith("ltx-core ")
    assert {r["provider"] for r in doc["records"] if r["name"] == "denoise_step"} == {"stg-off", "ltx-core"}


@pytest.mark.parametrize(("extra", "needle"), [
    (["--configs", "ltx-core+compile"], "--configs ltx-core+compile: +compile: ltx-core's pipelines do not compile"),
    (["--configs", "ltx-core", "--image", "first.png"], "--configs ltx-core: --image: the peer is fed text-to-video"),
])
def test_what_the_peer_does_not_run_is_refused_in_one_line(extra, needle, tmp_path):
    from PIL import Image

    Image.new("RGB", (64, 64), "red").save(tmp_path / "first.png")
    result = runner.invoke(app, [*LTX2_TINY, *[str(tmp_path / a) if a == "first.png" else a for a in extra],
                                 "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and needle in " ".join(result.output.split()), result.output


def test_without_the_package_the_peer_is_an_environment_problem(monkeypatch, tmp_path):
    monkeypatch.setattr(ltx2_core, "available", lambda: False)
    result = runner.invoke(app, [*LTX2_TINY, "--configs", "ltx-core", "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 4 and "needs Lightricks' ltx-core package" in result.output, result.output
    assert not (tmp_path / "r.json").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["pair", "isolated"])
def test_on_the_gpu_in_bf16_the_19b_blocks_agree_with_diffusers(case):
    """Two of LTX-2 19B's blocks in bf16 at 121 x 512 x 768 latent sizes: ltx-core's output against diffusers' on the
    same weights, within bf16 rounding (ltx-core applies RoPE in bf16, diffusers in fp32)."""
    from tests.helpers import cast_floats, ltx2_cuda_inputs, ltx2_cuda_transformer

    model = ltx2_cuda_transformer("ltx2-19b", torch.bfloat16)
    inputs = cast_floats(ltx2_cuda_inputs(model, case), torch.bfloat16)
    with torch.no_grad():
        expected = model(**inputs)
        got = ltx2_core._call(ltx2_core.core_model(model), model, **inputs)
    for g, e in zip(got, expected, strict=True):
        cos = torch.nn.functional.cosine_similarity(g.double().flatten(), e.double().flatten(), dim=0)
        assert cos.item() > 0.999, cos.item()
