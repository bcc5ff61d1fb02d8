"""--attention-backend auto (ltxbench.inject.attention_auto): the shapes it captures per attention module, that a
candidate which refuses a shape or is 1% wrong is never chosen, that the fastest passing one is set on exactly the
modules of its shape and given back, and the command line's refusals. On the CPU FlashAttention-3 is the fp32
stand-in of test_attention_backend and torch's GPU kernels refuse every shape; the GPU test runs the real ones."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.bench.micro_attention import AttentionShape
from ltxbench.cli import app
from ltxbench.inject import attention_auto as auto
from tests.helpers import (
    ATTENTION_CASES,
    LTX_TINY_CUDA,
    attention_backends,
    ltx2_transformer,
    ltx_call,
    ltx_inputs,
    ltx_transformer,
    wan_transformer,
    without_flash_attention_3,
)

runner = CliRunner()


# ---- capture -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(ATTENTION_CASES))
def test_every_attention_module_is_captured_with_its_largest_call_and_its_backend_given_back(family):
    build, call, _ = ATTENTION_CASES[family]
    model = build()
    first = next(m for _, m in auto.attention_modules([model]))
    first.set_attention_backend("_native_math")
    before = attention_backends(model)
    calls = auto.capture([model], lambda: call(model))
    assert set(calls) == {name for name, _ in auto.attention_modules([model])}
    assert attention_backends(model) == before  # every module on `native` during the run only
    for name, (module, shape, mask) in calls.items():
        assert shape.head_dim * shape.heads == module.to_q.out_features
        if name.endswith(".attn1"):
            assert shape.queries == shape.keys and mask is None
    if family == "ltx":  # LTX-Video's text cross-attention gets the padded prompt's additive mask
        shape, mask = calls["0.transformer_blocks.0.attn2"][1:]
        assert shape.masked and shape.keys == 7 and mask == ((2, shape.heads, 1, 7), False)  # per head, as LTX makes it


def test_the_largest_call_of_a_module_is_kept_and_the_run_stops_once_every_denoiser_has_called():
    model, other = ltx_transformer(), ltx_transformer()
    seen = []

    def run():
        for module, batch in ((model, 1), (model, 2), (other, 2), (other, 2)):
            seen.append(module)
            with torch.no_grad():
                module(**ltx_inputs(module, batch=batch) | {"timestep": torch.full((batch,), 500.0)})

    calls = auto.capture([model, other], run)
    assert seen == [model, model, other]  # stopped after `other` returned from its first call
    assert calls["0.transformer_blocks.0.attn1"][1].batch == 2 and calls["1.transformer_blocks.0.attn1"][1].batch == 2


def test_a_denoiser_the_run_did_not_reach_takes_its_twins_shapes_and_choice(fa3_fwd):
    """Two experts of one architecture (Wan 2.2 A14B), the run reaching the first only: the second's modules get the
    same-named modules' shapes, so nothing stays unchosen."""
    first, second = ltx_transformer(), ltx_transformer()
    choice = auto.choose([first, second], lambda: ltx_call(first), log=lambda _: None, time_fn=_times(_flash_3=1.0),
                         device="cpu", names=["native", "_flash_3"])
    assert choice.info["uncaptured_modules"] == 0
    for model in (first, second):
        backends = {n: str(getattr(b, "value", b)) for n, b in attention_backends(model).items()}
        assert {b for n, b in backends.items() if n.endswith("attn1")} == {"_flash_3"}
    assert sum(s["modules"] for s in choice.info["shapes"]) == 2 * len(auto.attention_modules([first]))


def test_a_call_is_read_in_diffusers_layout_with_its_mask_as_passed():
    q, k = torch.zeros(2, 5, 3, 8), torch.zeros(2, 11, 3, 8)  # (B, S, H, D)
    assert auto.dispatched_call(q, k) == (AttentionShape(2, 3, 5, 11, 8), None)
    bool_mask = torch.ones(2, 1, 1, 11, dtype=torch.bool)
    assert auto.dispatched_call(q, k, bool_mask) == (AttentionShape(2, 3, 5, 11, 8, True), ((2, 1, 1, 11), True))
    assert auto.dispatched_call(q, k, torch.zeros(2, 11))[1] == ((2, 11), False)


# ---- measure and choose ------------------------------------------------------------------------------------------

def _times(**ms):
    """A time_fn returning the given median per backend (the partial's `backend` keyword), 5.0 ms for the others."""
    return lambda fn: {"median": ms.get(str(fn.keywords["backend"].value), 5.0)}


@pytest.mark.parametrize("shape", [AttentionShape(1, 2, 7, 7, 64), AttentionShape(2, 2, 83, 769, 128),
                                   AttentionShape(1, 1, 5, 2049, 64)])
def test_a_one_percent_wrong_kernel_fails_at_every_shape_and_the_exact_one_passes(shape, fa3_fwd):
    exact = auto.measure(shape, None, ["_flash_3", "native", "_native_cudnn"], _times(_flash_3=1.0), "cpu")
    assert exact["_flash_3"]["passed"] and exact["_flash_3"]["ms"] == 1.0 and exact["native"]["passed"]
    assert "not_applicable" in exact["_native_cudnn"]  # torch's cuDNN kernel on the CPU: refused, not failed
    assert exact["_flash_3"]["relative_error"] <= exact["torch"]["bound"]
    fa3_fwd.scale_error = 1.01
    wrong = auto.measure(shape, None, ["_flash_3"], _times(), "cpu")["_flash_3"]
    assert not wrong["passed"]
    if shape.keys > 7:  # outputs averaged over many keys are small: the absolute tolerance alone would pass it
        assert wrong["max_abs_err"] < 2e-2
    assert auto.fastest({"torch": {}, "_flash_3": wrong, "_native_cudnn": exact["_native_cudnn"]}) is None


@pytest.mark.parametrize("boolean", [False, True])
def test_a_masked_shape_is_measured_with_the_models_mask_and_backends_without_masks_are_out(boolean, fa3_fwd):
    shape, mask = AttentionShape(2, 2, 83, 128, 64, masked=True), ((2, 2, 1, 128), boolean)
    x = auto.inputs(shape, mask, "cpu")
    for got, size, is_bool in ((x["model"]["mask"], (2, 2, 1, 128), boolean), (x["mask"], (2, 1, 1, 128), False)):
        assert got.shape == size and (got.dtype == torch.bool) == is_bool  # the model's; the reference's, additive
        kept = got if is_bool else got == 0
        assert kept[..., :96].all() and not kept[..., 96:].any()
    measured = auto.measure(shape, mask, ["_flash_3", "_native_flash", "native"], _times(_flash_3=0.1), "cpu")
    assert all("attn_mask" in measured[name]["not_applicable"] for name in ("_flash_3", "_native_flash"))
    assert measured["native"]["passed"] and auto.fastest(measured) == "native"


def test_the_fastest_passing_candidate_wins():
    measured = {"torch": {"bound": 1.0}, "native": {"ms": 2.0, "passed": True},
                "_native_flash": {"ms": 1.0, "passed": False}, "_native_efficient": {"not_applicable": "no"},
                "_flash_3": {"ms": 1.5, "passed": True}}
    assert auto.fastest(measured) == "_flash_3"


def test_choose_sets_each_shapes_winner_on_its_modules_runs_it_and_gives_the_backends_back(fa3_fwd):
    model = ltx_transformer()
    expected = ltx_call(model)
    choice = auto.choose([model], lambda: ltx_call(model), log=lambda _: None, time_fn=_times(_flash_3=1.0),
                         device="cpu", names=["native", "_native_cudnn", "_flash_3"])
    backends = {name: str(getattr(b, "value", b)) for name, b in attention_backends(model).items()}
    assert {b for n, b in backends.items() if n.endswith("attn1")} == {"_flash_3"}
    assert {b for n, b in backends.items() if n.endswith("attn2")} == {"native"}  # masked: FA3 cannot, cuDNN no CPU
    info = choice.info
    assert info["name"] == "auto" and info["uncaptured_modules"] == 0 and len(info["shapes"]) == 2
    by_backend = {s["chosen"]: s for s in info["shapes"]}
    assert by_backend["_flash_3"]["candidates"]["_flash_3"]["passed"]
    assert by_backend["_flash_3"]["candidates"]["native"]["ms"] == 5.0  # the slower exact one, measured beside it
    assert by_backend["native"]["mask"] == {"shape": [2, model.config.num_attention_heads, 1, 7], "boolean": False}
    fa3_fwd.calls.clear()
    torch.testing.assert_close(ltx_call(model), expected, atol=2e-5, rtol=2e-5)
    assert len(fa3_fwd.calls) == by_backend["_flash_3"]["modules"]  # each self-attention once, through diffusers
    choice.revert()
    assert set(attention_backends(model).values()) == {None}


def test_a_wrong_kernel_is_not_chosen_however_fast_and_the_model_keeps_torchs_pick(fa3_fwd):
    model = ltx_transformer()
    fa3_fwd.scale_error = 1.01
    choice = auto.choose([model], lambda: ltx_call(model), log=lambda _: None, time_fn=_times(_flash_3=0.1),
                         device="cpu", names=["native", "_flash_3"])
    assert {str(getattr(b, "value", b)) for b in attention_backends(model).values()} == {"native"}
    assert all(s["chosen"] == "native" for s in choice.info["shapes"])


@pytest.mark.parametrize("build", [lambda: ltx2_transformer(2), lambda: wan_transformer(dtype="fp32")])
def test_the_other_families_self_attentions_get_the_winner_too(build, fa3_fwd):
    model = build()
    call = ATTENTION_CASES["ltx2" if hasattr(model.config, "audio_in_channels") else "wan"][1]
    auto.choose([model], lambda: call(model), log=lambda _: None, time_fn=_times(_flash_3=1.0), device="cpu",
                names=["native", "_flash_3"])
    backends = {name: str(getattr(b, "value", b)) for name, b in attention_backends(model).items()}
    assert {b for n, b in backends.items() if n.rpartition(".")[2] in ("attn1", "audio_attn1")} == {"_flash_3"}


def test_the_candidates_are_torchs_pick_its_forced_kernels_and_fa3_where_it_imports(fa3_fwd, monkeypatch):
    assert auto.candidates() == ["native", "_native_cudnn", "_native_flash", "_native_efficient", "_flash_3"]
    without_flash_attention_3(monkeypatch)
    assert auto.candidates()[-1] == "_native_efficient"
    measured = auto.measure(AttentionShape(1, 2, 7, 7, 64), None, ["_flash_3"], _times(), "cpu")
    assert "no FlashAttention-3 package imports" in measured["_flash_3"]["not_applicable"]


# ---- a configuration's own choice (<config>@auto) -----------------------------------------------------------------

def test_at_auto_configurations_exist_for_video_families_and_all_leaves_them_out():
    from ltxbench.configurations import Configuration
    from ltxbench.models import family_of
    from ltxbench.models.family import parse_configs

    assert Configuration("optimized+compile@auto").attention == "auto"
    names = family_of("ltx-tiny").config_names()
    assert {"compile@auto", "optimized+compile@auto"} <= set(names)
    assert not any(c.attention for c in parse_configs("all", names))
    assert "compile@auto" not in family_of("llama-tiny").config_names()


def test_at_auto_measures_on_the_unpatched_model_in_a_short_run_sets_it_and_gives_it_back(fa3_fwd, monkeypatch):
    """compile@auto and optimized@auto: the choice measured at the configuration's start from a two-step run of the
    unpatched pipeline (before our injection, whose processors copy it), in the report, reverted after it."""
    from ltxbench.models import family_of
    from ltxbench.models.ltx import LTXSettings
    from tests.helpers import ltx_pipeline

    family, pipe = family_of("ltx-tiny"), ltx_pipeline()
    model = pipe.transformer
    settings = LTXSettings(model="ltx-tiny", weights="random", device="cpu", dtype="bf16", kernel_provider="reference",
                           steps=7, num_frames=9, height=64, width=64)
    runs = []
    iteration = family.iteration

    def counted(target, run_settings, *args, **kwargs):
        runs.append((run_settings.steps, type(model.transformer_blocks[0].attn1.processor).__module__))
        return iteration(target, run_settings, *args, **kwargs)

    monkeypatch.setattr(family, "iteration", counted)
    monkeypatch.setattr("ltxbench.inject.attention_auto.candidates", lambda: ["native", "_flash_3"])
    monkeypatch.setattr("ltxbench.bench.timing.time_cuda",
                        lambda fn: {"median": 1.0 if fn.keywords["backend"].value == "_flash_3" else 2.0})
    for name in ("optimized@auto", "compile@auto"):
        runs.clear()
        report = family.apply_config(pipe, settings, name)
        assert runs == [(2, "diffusers.models.transformers.transformer_ltx")]  # two steps, diffusers' processors
        backends = {n: str(getattr(b, "value", b)) for n, b in attention_backends(model).items()}
        assert {b for n, b in backends.items() if n.endswith("attn1")} == {"_flash_3"}, name
        injection = report.as_dict()
        assert injection["attention"]["name"] == "auto" and injection["applied"] == name.startswith("optimized")
        report.revert()
        assert set(attention_backends(model).values()) == {None}, name


# ---- the command line -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, says", [
    (["--device", "cpu"], "--attention-backend auto runs on a GPU, not --device cpu"),
    (["--dtype", "fp16"], "--attention-backend auto takes bf16, not --dtype fp16"),
    (["--precision", "fp8-attention"], "--attention-backend auto with fp8-attention"),
])
def test_auto_where_it_cannot_run_is_refused_before_the_build(extra, says, tmp_path):
    result = runner.invoke(app, [*LTX_TINY_CUDA, "--attention-backend", "auto", *extra, "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "r.json").exists()


@pytest.mark.gpu
def test_auto_on_the_gpu_picks_a_kernel_that_runs_every_shape_as_exactly_as_sdpa():
    """ltx-tiny's transformer in bf16 on the GPU: every candidate measured for real, the chosen backends run the model,
    and its output is as close to the fp32 model's as torch's own SDPA pick is."""
    model = ltx_transformer().cuda()
    reference = _ltx_call_on(model, torch.float32)
    model = model.to(torch.bfloat16)
    default = _ltx_call_on(model, torch.bfloat16)
    choice = auto.choose([model], lambda: _ltx_call_on(model, torch.bfloat16), log=lambda _: None)
    try:
        got = _ltx_call_on(model, torch.bfloat16)
    finally:
        choice.revert()
    masked = [s for s in choice.info["shapes"] if s["mask"]]
    assert masked and all(s["chosen"] not in ("_native_flash", "_flash_3") for s in masked)
    scale = reference.norm()
    assert (got.float() - reference).norm() / scale <= 2 * (default.float() - reference).norm() / scale + 1e-3


def _ltx_call_on(model, dtype):
    inputs = {k: v.to(device="cuda", dtype=dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in ltx_inputs(model, frames=3, height=8, width=8, text=32).items()}
    with torch.no_grad():
        return model(**inputs)[0]
