"""--attention-backend (ltxbench.inject.attention_backend): which FlashAttention-3 package is found, which modules run
it, that the unpatched model and ours both reach it through diffusers' `_flash_3` backend (and nothing else does),
and the command line's refusals. On the CPU FlashAttention-3 is stood in for by attention in fp32; the kernels
themselves are held against torch's SDPA on the GPU at the end."""

from __future__ import annotations

import sys

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.inject import attention_backend as ab
from tests.helpers import (
    ATTENTION_CASES,
    BENCH_E2E_LTX_TINY,
    LTX_TINY_CUDA,
    StandIn,
    attention_backends,
    ltx2_first,
    ltx2_transformer,
    ltx_call,
    ltx_inputs,
    ltx_transformer,
    stand_in_module,
    wan_transformer,
    without_flash_attention_3,
)

runner = CliRunner()


# ---- finding FlashAttention-3 -----------------------------------------------------------------------------------

def test_the_source_build_is_preferred_then_pip_fa3_fwd_then_neither_with_both_reasons(monkeypatch):
    source, pip = StandIn(), StandIn()
    monkeypatch.setitem(sys.modules, "flash_attn_interface", stand_in_module("flash_attn_interface", source))
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", stand_in_module("fa3_fwd_interface", pip))
    found, _ = ab.find_flash_attention_3()
    assert found.module == "flash_attn_interface" and found.flash_attn_func is source and "fp16" in found.dtypes
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    found, reasons = ab.find_flash_attention_3()
    assert found.module == "fa3_fwd_interface" and found.flash_attn_func is pip and found.dtypes == ("bf16",)
    assert len(reasons) == 1 and reasons[0].startswith("flash_attn_interface")
    without_flash_attention_3(monkeypatch)
    found, reasons = ab.find_flash_attention_3()
    assert found is None and [r.split(":")[0] for r in reasons] == list(ab.FA3_MODULES)
    with pytest.raises(ab.EnvironmentProblem, match="needs FlashAttention-3") as raised:
        ab.require_flash_attention_3("--attention-backend fa3")
    assert "pip install fa3-fwd" in raised.value.hint


def test_fp16_through_fa3_fwd_is_refused_by_name(fa3_fwd, tmp_path):
    with pytest.raises(ab.UsageError, match="through fa3_fwd_interface takes bf16, not --dtype fp16"):
        ab.use_flash_attention_3([ltx_transformer()], "fp16")
    result = runner.invoke(app, [*LTX_TINY_CUDA, "--dtype", "fp16", "--attention-backend", "fa3", "-o",
                                 str(tmp_path / "r.json")])  # before the build
    assert result.exit_code == 2 and "fa3 through fa3_fwd_interface takes bf16, not --dtype fp16" in result.output


# ---- which modules, and that both the unpatched model and ours reach it -------------------------------------------

@pytest.mark.parametrize("family", ["ltx", "ltx2", "wan"])
def test_fa3_is_set_on_the_self_attentions_only(family, fa3_fwd):
    model = {"ltx": ltx_transformer, "ltx2": lambda: ltx2_transformer(2), "wan": lambda: wan_transformer(dtype="fp32")}
    model = model[family]()
    info = ab.use_flash_attention_3([model], "bf16")
    chosen = {name for name, backend in attention_backends(model).items() if backend is not None}
    expected = {name for name in attention_backends(model) if name.rpartition(".")[2] in ("attn1", "audio_attn1")}
    assert chosen == expected and len(expected) == info["self_attentions"] > 0
    assert {str(b.value) for b in map(attention_backends(model).get, chosen)} == {"_flash_3"}
    assert any(name.endswith("attn2") for name in attention_backends(model))  # cross-attentions exist, left alone
    assert info["package"] == "fa3_fwd_interface"
    from diffusers.models import attention_dispatch as dispatch

    assert dispatch.flash_attn_3_func is fa3_fwd  # handed to diffusers, which found no source build


def test_fa3_fwd_is_handed_only_to_the_diffusers_code_it_was_checked_against(monkeypatch):
    from diffusers.models import attention_dispatch as dispatch

    monkeypatch.setattr(dispatch, "flash_attn_3_func", None)
    monkeypatch.setattr(ab, "DIFFUSERS_FA3_SOURCES", ("0" * 16, "0" * 16))
    with pytest.raises(ab.EnvironmentProblem, match="not the code fa3-fwd was checked against"):
        ab.hand_to_diffusers(ab.FlashAttention3("fa3_fwd_interface", StandIn()))
    assert dispatch.flash_attn_3_func is None


def test_a_source_build_diffusers_found_is_not_replaced(monkeypatch):
    from diffusers.models import attention_dispatch as dispatch

    theirs = StandIn()
    monkeypatch.setattr(dispatch, "flash_attn_3_func", theirs)
    ab.hand_to_diffusers(ab.FlashAttention3("fa3_fwd_interface", StandIn()))
    assert dispatch.flash_attn_3_func is theirs


@pytest.mark.parametrize("family", list(ATTENTION_CASES))
def test_the_unpatched_model_and_ours_run_the_self_attentions_on_it_and_match_sdpa(family, fa3_fwd):
    """fp32 on the CPU: with the stand-in (exact attention) the outputs equal torch's SDPA path; every self-attention
    call reaches it, for the unpatched model and with our kernels (reference provider) alike."""
    import importlib

    build, call, inject = ATTENTION_CASES[family]
    model = build()
    expected = call(model)
    info = ab.use_flash_attention_3([model], "bf16")
    got = call(model)
    calls = len(fa3_fwd.calls)
    assert calls >= info["self_attentions"]  # each self-attention at least once a call
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)
    report = importlib.import_module(inject).apply_kernels(model, "reference")
    try:
        ours = call(model)
    finally:
        report.revert()
    assert len(fa3_fwd.calls) == 2 * calls  # ours attends through the same backend, as often
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", list(ATTENTION_CASES))
def test_a_one_percent_wrong_attention_kernel_fails_the_comparison(family, fa3_fwd):
    build, call, _ = ATTENTION_CASES[family]
    model = build()
    expected = call(model)
    fa3_fwd.scale_error = 1.01
    ab.use_flash_attention_3([model], "bf16")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(call(model), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("patched", [False, True])
def test_the_backend_stays_in_a_fullgraph_compile(fa3_fwd, patched):
    from ltxbench.inject.ltx import apply_kernels

    model = ltx_transformer()
    expected = ltx_call(model)
    ab.use_flash_attention_3([model], "bf16")
    report = apply_kernels(model, "reference") if patched else None
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            got = compiled(**ltx_inputs(model))[0]
    finally:
        torch._dynamo.reset()
        if report is not None:
            report.revert()
    assert fa3_fwd.calls
    torch.testing.assert_close(got, expected, atol=1e-4 if patched else 2e-5, rtol=1e-4 if patched else 2e-5)


# ---- the command line -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, says", [
    (["--device", "cpu"], "--attention-backend fa3 runs on a GPU, not --device cpu"),
    (["--dtype", "fp32"], "--attention-backend fa3 takes bf16 or fp16, not --dtype fp32"),
    (["--gpus", "2"], "--attention-backend fa3 runs on one GPU, not --gpus 2"),
    (["--precision", "fp8-attention"], "--attention-backend fa3 with fp8-attention: FP8 attention runs its own"),
    (["--configs", "compile,optimized-fp8-attention"], "with fp8-attention"),
])
def test_fa3_where_it_cannot_run_is_refused_before_the_build(extra, says, tmp_path):
    result = runner.invoke(app, [*LTX_TINY_CUDA, "--attention-backend", "fa3", *extra, "-o",
                                 str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()) and "built" not in result.output


def test_fa3_not_installed_exits_4_before_the_build_saying_how_to_install_it(tmp_path, monkeypatch):
    without_flash_attention_3(monkeypatch)
    result = runner.invoke(app, [*LTX_TINY_CUDA, "--attention-backend", "fa3", "-o", str(tmp_path / "r.json")])
    text = " ".join(result.output.split())
    assert result.exit_code == 4, result.output
    assert "fa3 needs FlashAttention-3" in text and "pip install fa3-fwd" in text
    assert "built" not in text and not (tmp_path / "r.json").exists()


def test_an_llm_refuses_the_option():
    result = runner.invoke(app, ["bench", "e2e", "--model", "llama-tiny", "--weights", "random", "--device", "cpu",
                                 "--attention-backend", "fa3"])
    assert result.exit_code == 2 and "--attention-backend does not apply to" in " ".join(result.output.split())


@pytest.mark.slow
def test_a_diffusers_backend_is_recorded_for_every_configuration(tmp_path):
    """The backend is set once, before the configurations: recorded in the run's config and in each record's
    params (so a run with it is a different measurement from one without)."""
    import json

    out = tmp_path / "r.json"
    result = runner.invoke(app, [*BENCH_E2E_LTX_TINY, "--configs", "baseline,optimized", "--phase", "transformer",
                                 "--attention-backend", "native", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["run"]["config"]["attention"] == {"name": "native", "attentions": "all"}
    assert {r["params"]["attention_backend"] for r in doc["records"]} == {"native"}


# ---- on the GPU: the real kernels against torch's SDPA ------------------------------------------------------------

def _relative_l2(got, expected) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.gpu
def test_flash_attention_3_on_ltx_2b_blocks_is_as_exact_as_sdpa_unpatched_and_with_our_kernels(monkeypatch):
    """LTX-2B's width and heads (head dim 64), 2 blocks, 49 frames, bf16: FlashAttention-3 on the self-attentions
    is as far from the fp32 model as torch's SDPA is (within 1.5x + 1e-3 of its relative error), with and without our
    kernels."""
    import copy

    from ltxbench.inject.ltx import apply_kernels
    from tests.helpers import ltx_2b_two_blocks

    fa3, _ = ab.find_flash_attention_3()
    if fa3 is None:
        pytest.skip("FlashAttention-3 not installed (pip install fa3-fwd)")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("FlashAttention-3 runs on Hopper")
    from diffusers.models import attention_dispatch as dispatch

    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return fa3.flash_attn_func(*args, **kwargs)

    monkeypatch.setattr(dispatch, "flash_attn_3_func", None)  # ours is handed over, counting the real kernel's calls
    fa3 = ab.FlashAttention3(fa3.module, fa3.flash_attn_func)
    counting = ab.FlashAttention3(fa3.module, counted)
    model, inputs = ltx_2b_two_blocks()
    with torch.no_grad():
        reference = copy.deepcopy(model).float()(**{k: v.float() if torch.is_tensor(v) and v.is_floating_point()
                                                     else v for k, v in inputs.items()})[0]
        sdpa = model(**inputs)[0]
        report = apply_kernels(model, "cuda")
        ours_sdpa = model(**inputs)[0]
        report.revert()
        ab.use_flash_attention_3([model], "bf16", counting)
        flash = model(**inputs)[0]
        assert len(calls) == 2  # each block's attn1
        report = apply_kernels(model, "cuda")
        ours_flash = model(**inputs)[0]
        report.revert()
    assert len(calls) >= 3  # ours too (LTX's CFG-halves check may answer block 0's second half from its first)
    for name, got, bar in (("unpatched", flash, sdpa), ("ours", ours_flash, ours_sdpa)):
        err, bar_err = _relative_l2(got, reference), _relative_l2(bar, reference)
        print(f"{name}: FlashAttention-3 ({fa3.module}) rel L2 {err:.2e}, SDPA {bar_err:.2e}")
        assert err <= 1.5 * bar_err + 1e-3, name


def test_an_unknown_backend_name_is_refused_before_the_build(tmp_path):
    result = runner.invoke(app, [*BENCH_E2E_LTX_TINY, "--attention-backend", "fast", "-o", str(tmp_path / "r.json")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "--attention-backend 'fast' is neither fa3, auto nor a diffusers backend" in text and "built" not in text


# ---- a configuration's own attention (<config>@fa3) ----------------------------------------------------------------

def _attention_module_backends(model) -> list:
    return [getattr(m.processor, "_attention_backend", None) for m in ab.self_attentions(model)]


def test_a_configurations_own_attention_is_set_for_it_and_given_back_after(fa3_fwd):
    """optimized@fa3: set before our injection (whose processors copy it), reverted after it; compile@fa3: on the
    unpatched model. Each configuration after it finds the model's own backend again."""
    from ltxbench.models import family_of
    from ltxbench.models.ltx import LTXSettings
    from tests.helpers import ltx_pipeline

    family, pipe = family_of("ltx-tiny"), ltx_pipeline()
    model = pipe.transformer
    settings = LTXSettings(model="ltx-tiny", weights="random", device="cpu", dtype="bf16", kernel_provider="reference")
    processors = [m.processor for m in model.modules() if hasattr(m, "processor")]
    for name in ("optimized@fa3", "compile@fa3"):
        report = family.apply_config(pipe, settings, name)
        assert {str(b.value) for b in _attention_module_backends(model)} == {"_flash_3"}, name
        injection = report.as_dict()
        assert injection["attention"]["name"] == "fa3" and injection["applied"] == name.startswith("optimized")
        before = len(fa3_fwd.calls)
        ltx_call(model)
        assert len(fa3_fwd.calls) > before, name  # the self-attentions ran on it
        report.revert()
        assert _attention_module_backends(model) == [None] * len(_attention_module_backends(model)), name
        assert [m.processor for m in model.modules() if hasattr(m, "processor")] == processors, name
    assert family.apply_config(pipe, settings, "optimized") is not None  # and a plain one sets nothing
    assert _attention_module_backends(model) == [None] * len(_attention_module_backends(model))


def test_ltx2s_pipeline_without_its_stg_pass_takes_an_attention_of_its_own(fa3_fwd, ltx2_tiny):
    """stg-off@fa3 (LTX-2's fair baseline on FlashAttention-3): the STG pass dropped from the settings, the
    self-attentions of both streams on FlashAttention-3, both given back after."""
    from ltxbench.models import family_of
    from ltxbench.models.ltx2 import LTX2Settings

    family, model = family_of("ltx2-tiny"), ltx2_tiny.transformer
    settings = LTX2Settings(model="ltx2-tiny", weights="random", device="cpu", dtype="bf16",
                            kernel_provider="reference")
    assert family.settings_for(settings, "stg-off+compile@fa3").stg_scale == 0.0
    report = family.apply_config(ltx2_tiny, settings, "stg-off@fa3")
    assert {str(b.value) for b in _attention_module_backends(model)} == {"_flash_3"}
    assert report.as_dict()["attention"]["name"] == "fa3"
    before = len(fa3_fwd.calls)
    ltx2_first(model)
    assert len(fa3_fwd.calls) > before
    report.revert()
    assert _attention_module_backends(model) == [None] * len(_attention_module_backends(model))


@pytest.mark.parametrize("configs, extra, says, code", [
    ("compile,compile@fa3", ["--device", "cpu"], "--configs compile@fa3 runs on a GPU, not --device cpu", 2),
    ("compile,compile@fa3", ["--attention-backend", "native"], "and --configs names compile@fa3", 2),
    ("compile,optimized-fp8-attention@fa3", [], "unknown configuration 'optimized-fp8-attention@fa3'", 2),
])
def test_configurations_with_fa3_refused_where_they_cannot_run(configs, extra, says, code, tmp_path):
    result = runner.invoke(app, [*LTX_TINY_CUDA, "--configs", configs, *extra, "-o", str(tmp_path / "r.json")])
    assert result.exit_code == code, result.output
    assert says in " ".join(result.output.split())


def test_configurations_with_fa3_without_it_installed_exit_4_before_the_build(tmp_path, monkeypatch):
    without_flash_attention_3(monkeypatch)
    result = runner.invoke(app, [*LTX_TINY_CUDA, "--configs", "compile,compile@fa3", "-o",
                                 str(tmp_path / "r.json")])
    assert result.exit_code == 4 and "pip install fa3-fwd" in " ".join(result.output.split()), result.output
    llm = runner.invoke(app, ["bench", "e2e", "--model", "llama-tiny", "--weights", "random", "--device", "cpu",
                              "--configs", "compile@fa3"])
    assert llm.exit_code == 2 and "unknown configuration 'compile@fa3'" in " ".join(llm.output.split())
