"""`bench micro attention`: its shapes' FLOP arithmetic, the records (n/a backends included) on small CPU shapes with
a stand-in timer, and the clean refusal without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.bench import micro_attention as ma
from ltxbench.cli import app
from tests.helpers import without_flash_attention_3

runner = CliRunner()


def test_flops_are_four_b_h_sq_sk_d():
    shape = ma.SHAPES["ltx"]["ltx2b-49f-self"]
    assert shape.as_list() == [2, 32, 2688, 2688, 64]
    assert shape.flops == 4 * 2 * 32 * 2688 * 2688 * 64
    text = ma.SHAPES["ltx2"]["ltx2-19b-video-text"]
    assert text.masked and text.flops == 4 * 2 * 32 * 6144 * 1024 * 128


def test_rates_and_peak_share():
    shape = ma.AttentionShape(1, 1, 1000, 1000, 250)  # 1e9 FLOPs
    got = ma.derived_rates(shape, 0.001, "NVIDIA H200")  # in 1 µs: 1000 TFLOP/s
    assert got["tflop"] == pytest.approx(1e-3) and got["tflops"] == pytest.approx(1000.0)
    assert got["pct_of_peak"] == pytest.approx(100 * 1000 / 989.4)
    assert "pct_of_peak" not in ma.derived_rates(shape, 0.001, None)


def test_shape_groups_and_backends_are_checked():
    assert set(ma.SHAPES["all"]) == set(ma.SHAPES["ltx"]) | set(ma.SHAPES["ltx2"]) | set(ma.SHAPES["wan"])
    assert ma.parse_backends("all") == list(ma.BACKENDS)
    assert ma.parse_backends("cudnn,flash") == ["cudnn", "flash"]
    with pytest.raises(Exception, match="--providers"):
        ma.parse_backends("flash,triton")
    with pytest.raises(Exception, match="--shapes"):
        ma.parse_shapes("odd")


def test_measure_checks_each_backend_and_reports_refusals_as_not_applicable():
    shapes = {"small": ma.AttentionShape(1, 2, 16, 16, 8), "text": ma.AttentionShape(1, 2, 16, 8, 8, masked=True)}
    timed = []

    def fake_time(fn):
        timed.append(fn())
        return {"median": 0.01, "p20": 0.01, "p80": 0.01, "min": 0.01, "max": 0.01, "n": 1}

    records = ma.measure(shapes, ["flash", "cudnn", "flash_attn"], fake_time, device="cpu", log=lambda s: None)
    by = {(r["params"]["shape_name"], r["provider"]): r for r in records}
    assert len(records) == 6 and len(timed) == len([r for r in records if r["stats"]["median"] is not None])
    ok = by[("small", "flash")]  # the CPU has a flash kernel of its own
    assert ok["check"]["passed"] and ok["check"]["max_abs_err"] < 1e-2
    assert ok["derived"]["tflops"] == pytest.approx(4 * 2 * 16 * 16 * 8 / 1e-5 / 1e12)
    assert by[("text", "flash_attn")]["derived"]["not_applicable"] == "flash_attn takes no additive mask"
    assert by[("small", "cudnn")]["stats"]["median"] is None  # no cuDNN attention on the CPU: n/a, not an error
    assert ma.failed(records) == []


def test_the_mask_hides_the_padded_keys():
    x = ma.inputs(ma.AttentionShape(1, 1, 4, 8, 4, masked=True), "cpu", 0)
    x["v"][..., 6:, :] = 1e4  # values of masked keys must not reach the output
    assert ma.reference(x).abs().max() < 100


def test_a_wrong_output_fails_the_check():
    rec = ma.record("s", ma.AttentionShape(1, 1, 2, 2, 2), "flash", {"median": 1.0, "p20": 1.0, "p80": 1.0,
                                                                     "min": 1.0, "max": 1.0, "n": 1}, None,
                    error=2 * ma.ATOL)
    assert rec["check"]["passed"] is False and ma.failed([rec])


def test_without_a_gpu_it_exits_4(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["bench", "micro", "attention", "--output", str(tmp_path / "a.json")])
    assert result.exit_code == 4, result.output
    assert "needs an NVIDIA GPU" in result.output and not (tmp_path / "a.json").exists()


@pytest.mark.parametrize("extra", [["rmsnorm"], ["--dtype", "fp16"], ["--shapes", "odd"], ["--providers", "x"]])
def test_bad_arguments_exit_2(extra, tmp_path):
    args = ["bench", "micro", "attention", *[a for a in extra if a == "rmsnorm"]]
    args += [a for a in extra if a != "rmsnorm"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output


def test_the_report_table_shows_rates_and_not_applicable_rows():
    from ltxbench.results.report_tables import table_for

    shape = ma.AttentionShape(1, 1, 1000, 1000, 250)
    stats = {"median": 0.001, "p20": 0.001, "p80": 0.001, "min": 0.001, "max": 0.001, "n": 1}
    records = [ma.record("s", shape, "flash", stats, "NVIDIA H200", error=0.0),
               ma.record("s", shape, "cudnn", None, "NVIDIA H200", reason="refused")]
    frame = table_for({"kind": "micro-attention", "records": records})
    assert frame["TFLOP/s"].tolist() == ["1000.0", "–"] and frame["µs"].tolist() == ["1.00", "n/a"]
    assert frame["check"].tolist() == ["ok", "–"]


@pytest.mark.parametrize("masked", [False, True])
def test_the_reference_in_chunks_is_the_whole_computation(monkeypatch, masked):
    """The fp32 reference, a head and a block of queries at a time (so that Wan 14B's 32760-token scores never exist
    whole), equals the math backend on the whole batch."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    x = ma.inputs(ma.AttentionShape(2, 3, 37, 29, 16, masked=masked), "cpu", 0)
    monkeypatch.setattr(ma, "REFERENCE_SCORES", 5 * 29)  # blocks of 5 queries (the last one of 2)
    with sdpa_kernel(SDPBackend.MATH):
        whole = torch.nn.functional.scaled_dot_product_attention(
            *(x[n].float() for n in "qkv"), attn_mask=None if x["mask"] is None else x["mask"].float())
    torch.testing.assert_close(ma.reference(x), whole, rtol=1e-6, atol=1e-6)


def test_the_fp8_backend_is_rated_against_the_fp8_peak_with_its_own_gate(monkeypatch):
    """cudnn_fp8's records say fp8, hold its TFLOP/s against the FP8 peak and its error to the FP8 gate; without
    cuDNN's frontend, where a mask is given or on a cross-attention shape, the backend is n/a with the reason."""
    import sys

    shape = ma.AttentionShape(1, 1, 1000, 1000, 250)
    stats = {"median": 0.001, "p20": 0.001, "p80": 0.001, "min": 0.001, "max": 0.001, "n": 1}
    rec = ma.record("s", shape, "cudnn_fp8", stats, "NVIDIA H200", error=0.05)
    assert rec["dtype"] == "fp8" and rec["derived"]["pct_of_peak"] == pytest.approx(100 * 1000 / 1978.9)
    assert rec["check"] == {"max_abs_err": 0.05, "atol": ma.FP8_ATOL, "passed": True}
    assert not ma.record("s", shape, "cudnn_fp8", stats, None, error=0.07)["check"]["passed"]
    assert ma.record("s", shape, "cudnn", stats, None, error=0.05)["check"]["atol"] == ma.ATOL
    x = ma.inputs(ma.AttentionShape(1, 2, 16, 16, 64), "cpu", 0)
    monkeypatch.setitem(sys.modules, "cudnn", None)
    without_flash_attention_3(monkeypatch)
    for backend in ma.FP8_BACKENDS:
        with pytest.raises(ma.NotApplicable, match="cudnn does not import|FlashAttention-3 does not import"):
            ma.call(backend, x)
        assert ma.record("s", shape, backend, stats, None, error=0.05)["dtype"] == "fp8"
    assert ma._ordered([1, 2, 3, 4, 5, 6]) == (1, 3, 5, 2, 4, 6)
    with pytest.raises(ma.NotApplicable, match="takes no additive mask"):
        ma.call("cudnn_fp8", ma.inputs(ma.AttentionShape(1, 2, 16, 8, 64, masked=True), "cpu", 0))
    for backend in ma.FP8_BACKENDS:
        with pytest.raises(ma.NotApplicable, match="self-attention only"):
            ma.call(backend, ma.inputs(ma.AttentionShape(1, 2, 16, 8, 64), "cpu", 0))


def test_flash_attention_3_from_pip_fa3_fwd_in_bf16_and_fp8(monkeypatch):
    """flash_attn_3 and flash_attn_3_fp8 run whichever FlashAttention-3 package imports (here a stand-in for pip's
    fa3-fwd: attention over the dequantized inputs), the FP8 one on q, k, v quantized per (batch, head) as
    --precision fp8-attention quantizes them; both within their gates of the fp32 reference, and a 1% error fails."""
    import importlib.machinery
    import sys
    import types

    from ltxbench import ops
    from ltxbench.ops import reference

    def flash_attn_func(q, k, v, q_descale=None, k_descale=None, v_descale=None, scale_error=1.0, **_):
        def widen(t, descale):  # (B, S, H, D), descale (B, H)
            return t.float() if descale is None else t.float() * descale[:, None, :, None]
        q, k, v = widen(q, q_descale), widen(k, k_descale), widen(v, v_descale)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
        return (torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v) * module.scale_error).to(torch.bfloat16)

    module = types.ModuleType("fa3_fwd_interface")
    module.__spec__ = importlib.machinery.ModuleSpec("fa3_fwd_interface", None)
    module.flash_attn_func, module.scale_error = flash_attn_func, 1.0
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", module)
    monkeypatch.setattr(ops, "quantize_fp8_heads", reference.quantize_fp8_heads)  # the CPU's
    shapes = {"self": ma.AttentionShape(2, 4, 512, 512, 64)}  # enough keys to average as the models do

    def stats(fn):
        return {"median": 0.01, "p20": 0.01, "p80": 0.01, "min": 0.01, "max": 0.01, "n": 1}

    records = ma.measure(shapes, ["flash_attn_3", "flash_attn_3_fp8"], stats, device="cpu", log=lambda s: None)
    assert [r["dtype"] for r in records] == ["bf16", "fp8"] and ma.failed(records) == []
    assert records[1]["check"]["max_abs_err"] > 1e-3  # FP8's rounding is there: the inputs were quantized
    module.scale_error = 1.1
    assert len(ma.failed(ma.measure(shapes, ["flash_attn_3", "flash_attn_3_fp8"], stats, device="cpu",
                                    log=lambda s: None))) == 2


def test_measure_interrupted_keeps_whole_shapes():
    shapes = {"a": ma.AttentionShape(1, 2, 16, 16, 8), "b": ma.AttentionShape(1, 2, 16, 16, 8)}
    calls = []

    def timer(fn):
        if len(calls) == 1:  # shape b's flash, after its cudnn row (n/a on the CPU) was made
            raise KeyboardInterrupt
        calls.append(fn())
        return {"median": 0.01, "p20": 0.01, "p80": 0.01, "min": 0.01, "max": 0.01, "n": 1}

    with pytest.raises(ma.Interrupted) as stop:
        ma.measure(shapes, ["cudnn", "flash"], timer, device="cpu", log=lambda s: None)
    assert [(r["params"]["shape_name"], r["provider"]) for r in stop.value.records] == [("a", "cudnn"), ("a", "flash")]


@pytest.mark.parametrize("kept", [True, False])
def test_cli_interrupted_writes_the_shapes_measured_marked_incomplete(tmp_path, monkeypatch, kept):
    from ltxbench.results.io import load_result
    from ltxbench.results.schema import incomplete

    shape = ma.SHAPES["ltx"]["ltx2b-49f-self"]
    done = [ma.record("ltx2b-49f-self", shape, "flash", {"median": 1.0, "p20": 1.0, "p80": 1.0, "min": 1.0,
                                                         "max": 1.0, "n": 1}, None, error=0.0)]

    def interrupted(*args, **kwargs):
        raise ma.Interrupted(done if kept else [])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ma, "measure", interrupted)
    out = tmp_path / "a.json"
    result = runner.invoke(app, ["bench", "micro", "attention", "--shapes", "ltx", "--providers", "flash",
                                 "--output", str(out)])
    assert result.exit_code == 130, result.output
    if not kept:
        assert "nothing measured yet, nothing written" in result.output and not out.exists()
        return
    cut = incomplete(load_result(out))
    assert cut["reason"] == "interrupted (Ctrl-C)" and cut["measured"] == ["ltx2b-49f-self"]
    assert cut["not_measured"] == [name for name in ma.SHAPES["ltx"] if name != "ltx2b-49f-self"]
    assert "kept 1 of" in result.output
