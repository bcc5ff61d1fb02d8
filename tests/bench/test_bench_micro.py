"""`bench micro`: the plan, the byte formulas, the derived numbers, the rendering and the CLI's exit codes.

Everything but the last test runs on the CPU: timings are synthetic or come from a fake timer.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.bench import micro, micro_report
from ltxbench.bench.micro import Case, Measurement
from ltxbench.cli import app
from ltxbench.errors import UsageError
from ltxbench.ops.registry import SPECS, get_spec
from ltxbench.ops.shapes import LLM_SHAPES, LTX_SHAPES, SEED_SHAPES
from ltxbench.results.io import load_result, write_result
from ltxbench.results.schema import make_result, stats_from_samples, utc_now

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
ALL_PROVIDERS = micro.known_providers()
FAKE_ENV = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}], "versions": {}}
FAKE_BUILD = {"built": True, "arch": "9.0"}


def _has_cuda() -> bool:
    return torch.cuda.is_available()


# --- plan: kernels, shape groups, providers ---------------------------------------------------------

def test_known_providers_order():
    assert ALL_PROVIDERS[:2] == ("cuda", "eager")
    assert ALL_PROVIDERS[-3:] == ("compile", "liger", "fa3")
    assert "F.rms_norm" in ALL_PROVIDERS


def test_aliases_resolve_and_dedupe():
    specs = micro.resolve_kernels(["rmsnorm", "rms_norm", "rmsnorm_residual", "adaln_rmsnorm"])
    assert [s.name for s in specs] == ["rms_norm", "fused_add_rms_norm", "rms_norm_modulate"]
    assert [s.name for s in micro.resolve_kernels([])] == list(SPECS)
    assert [s.name for s in micro.resolve_kernels(["all"])] == list(SPECS)


def test_unknown_kernel_is_usage_error_listing_known():
    with pytest.raises(UsageError) as err:
        micro.resolve_kernels(["rmsnorm", "rmsnrom"])
    assert "rmsnrom" in err.value.message and "rmsnorm_residual" in err.value.message


def test_plan_rmsnorm_ltx_matrix():
    cases, notes = micro.plan(micro.resolve_kernels(["rmsnorm"]), ["bf16", "fp32"], "ltx", ALL_PROVIDERS)
    assert notes == []
    # kernel -> dtype -> shape; every provider of the spec on each case; the spec's first variant.
    assert [(c.dtype, c.shape_name) for c in cases] == [(d, n) for d in ("bf16", "fp32") for n in LTX_SHAPES]
    assert {c.shape for c in cases} == set(LTX_SHAPES.values())
    assert all(c.providers == ("cuda", "eager", "F.rms_norm", "compile", "liger") for c in cases)
    assert all(c.variant == "no-weight" for c in cases)


def test_plan_filters_groups_and_skips_with_note():
    specs = micro.resolve_kernels(["rmsnorm_residual", "adaln_rmsnorm"])
    cases, notes = micro.plan(specs, ["bf16"], "ltx", ALL_PROVIDERS)
    # fused_add_rms_norm has no LTX shape: skipped with a note; the AdaLN kernel has no F.rms_norm baseline.
    assert {c.kernel for c in cases} == {"rms_norm_modulate"}
    assert len(notes) == 1 and "fused_add_rms_norm" in notes[0] and "ltx" in notes[0]
    assert cases[0].providers == ("cuda", "eager", "compile", "liger")
    assert cases[0].variant == "per-batch"

    cases, notes = micro.plan(specs, ["bf16"], "llm", ALL_PROVIDERS)
    assert {c.shape_name for c in cases} == set(LLM_SHAPES) and {c.kernel for c in cases} == {"fused_add_rms_norm"}
    assert "rms_norm_modulate" in notes[0]

    cases, _ = micro.plan(specs, ["bf16"], "seed", ["cuda", "F.rms_norm"])
    assert [c.providers for c in cases] == [("cuda", "F.rms_norm")] * 5 + [("cuda",)] * 5
    assert {c.shape_name for c in cases} == set(SEED_SHAPES)


def test_plan_all_and_odd_groups():
    spec = get_spec("rms_norm")
    cases, _ = micro.plan([spec], ["fp16"], "all", ["cuda"])
    assert [c.shape_name for c in cases] == list(spec.bench_shapes)
    cases, _ = micro.plan(list(SPECS.values()), ["fp16"], "odd", ["cuda"])
    assert len(cases) == len(SPECS) * len(micro.ODD_SHAPES)
    assert all(c.shape[-1] % 8 != 0 for c in cases)  # widths that defeat 16-byte vectors


def test_plan_variant():
    cases, notes = micro.plan(list(SPECS.values()), ["bf16"], "seed", ["cuda"], variant="weight")
    assert {c.kernel for c in cases} == {"rms_norm", "rms_norm_modulate"} and all(c.variant == "weight" for c in cases)
    assert len(notes) == len(SPECS) - 2
    with pytest.raises(UsageError, match="bogus"):
        micro.plan(list(SPECS.values()), ["bf16"], "seed", ["cuda"], variant="bogus")


def test_parse_choices():
    assert micro.parse_choices("fp32, bf16,fp32", micro.DTYPE_NAMES, "--dtype") == ["fp32", "bf16"]
    assert micro.parse_choices("all", micro.DTYPE_NAMES, "--dtype") == list(micro.DTYPE_NAMES)
    with pytest.raises(UsageError, match="'bf8'"):
        micro.parse_choices("bf16,bf8", micro.DTYPE_NAMES, "--dtype")
    with pytest.raises(UsageError):
        micro.parse_choices(" , ", micro.DTYPE_NAMES, "--dtype")


# --- bytes, GB/s, % of peak, speedups ---------------------------------------------------------------

def _bytes(name, shape, dtype, variant):
    spec = get_spec(name)
    gen = torch.Generator().manual_seed(0)
    return spec.bytes_moved(spec.make_inputs(shape, dtype, "cpu", gen, variant))


def test_byte_formulas():
    b, s, d = 2, 8064, 2048
    n = b * s * d
    # read x once, write y once, 2 bytes each
    assert _bytes("rmsnorm", (b, s, d), torch.bfloat16, "no-weight") == 2 * n * 2 == 2 * 2 * 8064 * 2048 * 2
    assert _bytes("rms_norm", (b, s, d), torch.bfloat16, "weight") == 2 * n * 2 + d * 2
    # fused add: read x, residual, weight; write normed and h
    assert _bytes("rmsnorm_residual", (1, 8192, 4096), torch.bfloat16, "torch-order") == 4 * 8192 * 4096 * 2 + 4096 * 2
    assert _bytes("rms_norm", (1, 4, 769), torch.float32, "no-weight") == 2 * 4 * 769 * 4


def _stats(median):
    return stats_from_samples([median * 0.95, median, median * 1.05])


CASE = Case("rms_norm", "ltx2b-161f-cfg", (2, 8064, 2048), "bf16", "no-weight",
            ("cuda", "eager", "F.rms_norm", "compile", "liger"))
NBYTES = 2 * 2 * 8064 * 2048 * 2  # x read + y written, B=2, bf16


def _results(cuda_check=True):
    ok = {"max_abs_err": 0.0078, "atol": 2e-2, "rtol": 1.6e-2, "passed": True}
    bad = {**ok, "max_abs_err": 0.5, "passed": False}
    return {
        (CASE, "cuda"): Measurement(_stats(0.05), ok if cuda_check else bad),
        (CASE, "eager"): Measurement(_stats(0.20), ok),
        (CASE, "F.rms_norm"): Measurement(_stats(0.10), ok),
        (CASE, "compile"): Measurement(_stats(0.08), ok),
        (CASE, "liger"): Measurement(reason="liger_kernel is not importable"),
        (CASE, micro.SAME_SIZE_COPY): Measurement(_stats(0.045)),
    }


def _records(cuda_check=True, peak=2000.0):
    copy = {"bytes": 2 << 30, "ms": _stats(1.0), "gbps": peak}
    records = micro_report.build_records([CASE], _results(cuda_check), {CASE: NBYTES}, peak)
    return [micro_report.copy_record(copy), *records]


def test_gbps_pct_and_speedup_arithmetic():
    assert micro_report.gbps(10**9, 1.0) == pytest.approx(1000.0)
    records = _records()
    by = {r["provider"]: r for r in records if r["name"] == "rms_norm"}
    assert list(by) == list(CASE.providers)
    cuda = by["cuda"]
    assert cuda["metric"] == "time" and cuda["unit"] == "ms" and cuda["better"] == "lower"
    assert cuda["params"] == {"shape": [2, 8064, 2048], "shape_name": "ltx2b-161f-cfg", "variant": "no-weight",
                              "bytes": NBYTES}
    assert cuda["derived"]["gbps"] == pytest.approx(NBYTES / 0.05e-3 / 1e9)
    assert cuda["derived"]["pct_of_copy_peak"] == pytest.approx(100 * NBYTES / 0.05e-3 / 1e9 / 2000)
    assert cuda["derived"]["same_size_copy_ms"] == pytest.approx(0.045)
    assert cuda["derived"]["pct_of_same_size_copy"] == pytest.approx(90.0)
    assert by["eager"]["derived"]["pct_of_same_size_copy"] == pytest.approx(22.5)
    assert cuda["derived"]["speedup_vs_eager"] == pytest.approx(4.0)
    assert cuda["derived"]["speedup_vs_F.rms_norm"] == pytest.approx(2.0)
    assert cuda["derived"]["speedup_vs_compile"] == pytest.approx(1.6)
    assert cuda["derived"]["best_baseline"] == "compile"
    assert cuda["derived"]["speedup_vs_best"] == pytest.approx(1.6)
    assert "speedup_vs_liger" not in cuda["derived"]
    assert by["eager"]["derived"]["gbps"] == pytest.approx(NBYTES / 0.2e-3 / 1e9)
    assert "speedup_vs_best" not in by["eager"]["derived"]
    na = by["liger"]
    assert na["derived"] == {"status": "n/a", "reason": "liger_kernel is not importable"}
    assert math.isnan(na["stats"]["median"]) and na["stats"]["n"] == 0 and na["check"] is None
    assert micro_report.speedups({"cuda": 1.0}) == {} and micro_report.speedups({"eager": 1.0}) == {}


def test_a_baseline_with_unsteady_samples_is_compared_at_its_p20_and_marked():
    """Bimodal samples (a slow mode from outside the kernel) would make a baseline look slow at its median: the
    speed-up over it takes its p20; our own unsteady samples keep their median (no credit to us), and both are
    marked in the records and the table."""
    results = _results()
    fast_slow = stats_from_samples([0.06] * 6 + [0.20] * 6)  # p20 0.06, median 0.13, p80 0.20
    results[(CASE, "compile")] = Measurement(fast_slow, results[(CASE, "compile")].check)
    by = {r["provider"]: r for r in micro_report.build_records([CASE], results, {CASE: NBYTES}, 2000.0)}
    assert micro_report.unsteady(fast_slow) and not micro_report.unsteady(_stats(0.05))
    assert by["compile"]["derived"]["unsteady"] is True and "unsteady" not in by["cuda"]["derived"]
    assert by["cuda"]["derived"]["speedup_vs_compile"] == pytest.approx(0.06 / 0.05)
    assert by["cuda"]["derived"]["best_baseline"] == "compile"
    assert by["cuda"]["derived"]["speedup_vs_best"] == pytest.approx(1.2)
    assert micro_report.cell(by["compile"]).startswith("130.0 µs†")
    results[(CASE, "cuda")] = Measurement(fast_slow, results[(CASE, "cuda")].check)
    by = {r["provider"]: r for r in micro_report.build_records([CASE], results, {CASE: NBYTES}, 2000.0)}
    assert by["cuda"]["derived"]["unsteady"] is True
    assert by["cuda"]["derived"]["speedup_vs_eager"] == pytest.approx(0.20 / fast_slow["median"])


def test_failed_checks_only_cuda():
    assert micro_report.failed_checks(_records()) == []
    results = _results(cuda_check=False)
    results[(CASE, "eager")].check = {"max_abs_err": 1.0, "atol": 0.0, "rtol": 0.0, "passed": False}
    records = micro_report.build_records([CASE], results, {CASE: NBYTES}, 2000.0)
    failures = micro_report.failed_checks(records)
    assert len(failures) == 1 and "rms_norm" in failures[0] and "0.5" in failures[0]


def test_check_outputs():
    ref = torch.linspace(-2, 2, 64)
    assert micro.check_outputs(ref.clone(), ref, 1e-4, 1e-4) == {"max_abs_err": 0.0, "atol": 1e-4, "rtol": 1e-4,
                                                                    "passed": True}
    off = ref.clone()
    off[3] += 0.01
    res = micro.check_outputs(off, ref, 1e-4, 1e-4)
    assert not res["passed"] and res["max_abs_err"] == pytest.approx(0.01, rel=1e-3)
    # rtol scales with |ref|: an error of 1e-3 at |ref| = 2 passes with rtol 1e-3
    near = ref.clone()
    near[-1] += 1e-3
    assert micro.check_outputs(near, ref, 1e-4, 1e-3)["passed"]
    nan = ref.clone()
    nan[0] = float("nan")
    assert not micro.check_outputs(nan, ref, 1.0, 1.0)["passed"]
    two = micro.check_outputs((ref, off), (ref, ref), 1e-4, 1e-4)
    assert not two["passed"] and two["max_abs_err"] == pytest.approx(0.01, rel=1e-3)
    assert not micro.check_outputs(ref[:8], ref, 1.0, 1.0)["passed"]
    assert not micro.check_outputs((ref,), (ref, ref), 1.0, 1.0)["passed"]


# --- run_cases on the CPU with a fake timer ---------------------------------------------------------

def _counting_timer():
    calls = []

    def time_fn(fn):
        fn()
        calls.append(len(calls) + 1)
        return stats_from_samples([0.001 * len(calls)])

    return time_fn, calls


def test_run_cases_interleaves_checks_and_marks_na(monkeypatch):
    spec = get_spec("rms_norm")

    def broken(**kw):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(spec.baselines, "F.rms_norm", broken)
    cases = [Case("rms_norm", f"tiny{i}", (2, 3, 83 + i), "fp32", "weight", ("eager", "F.rms_norm", "liger"))
             for i in range(2)]
    time_fn, calls = _counting_timer()
    log = []
    results, nbytes = micro.run_cases(cases, device="cpu", time_fn=time_fn, log=log.append)
    assert log == ["rms_norm tiny0 fp32", "rms_norm tiny1 fp32"]
    assert nbytes == {cases[0]: 2 * 2 * 3 * 83 * 4 + 83 * 4, cases[1]: 2 * 2 * 3 * 84 * 4 + 84 * 4}
    # providers of one shape, then the copy of its bytes, are all measured before the next shape
    assert [results[(c, "eager")].stats["median"] for c in cases] == pytest.approx([0.001, 0.003])
    assert [results[(c, micro.SAME_SIZE_COPY)].stats["median"] for c in cases] == pytest.approx([0.002, 0.004])
    assert len(calls) == 4
    for case in cases:
        eager = results[(case, "eager")]
        assert eager.check["passed"] and eager.check["max_abs_err"] < 1e-5 and eager.reason is None
        assert results[(case, "F.rms_norm")].reason == "RuntimeError: boom"
        assert results[(case, "F.rms_norm")].stats is None
        liger = results[(case, "liger")]
        assert liger.stats is None and liger.reason  # not installed here, or cannot run on CPU tensors
    records = micro_report.build_records(cases, results, nbytes, None)
    assert [r["derived"]["status"] for r in records] == ["ok", "n/a", "n/a"] * 2
    assert "pct_of_copy_peak" not in records[0]["derived"]


def test_run_cases_flags_a_wrong_provider(monkeypatch):
    spec = get_spec("gated_residual")
    monkeypatch.setitem(spec.baselines, "eager", lambda h, a, gate: h + a)  # forgets the gate
    case = Case("gated_residual", "tiny", (2, 5, 64), "fp32", "per-token", ("eager",))
    time_fn, _ = _counting_timer()
    results, _ = micro.run_cases([case], device="cpu", time_fn=time_fn)
    m = results[(case, "eager")]
    assert m.stats is not None and m.check["passed"] is False and m.check["max_abs_err"] > 0.1


@pytest.mark.parametrize("fault", [None, "rows", "one-off", "none"])
def test_run_cases_checks_the_cache_rows_each_provider_writes(fault, monkeypatch):
    """rope_1d_cache writes k and v into the caches in place: each provider's check compares the caches too, each
    provider starting from the caches as made (a provider that writes nothing does not pass on another's rows)."""
    from ltxbench.ops import eager

    def baseline(q, k, v, cos, sin, k_cache, v_cache, offset, interleaved=False):
        if fault == "none":  # returns q rotated, writes no cache row
            return eager.hf_rope_1d(q, k, cos, sin, None, interleaved)[0]
        shift = 1 if fault == "one-off" else 0
        out = eager.hf_rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset + shift, interleaved)
        if fault == "rows":
            v_cache.mul_(1.01)
        return out

    spec = get_spec("rope_1d_cache")
    monkeypatch.setitem(spec.baselines, "ltxbench-unfused", baseline)  # a second provider, after eager
    case = Case("rope_1d_cache", "tiny", (2, 3, 256), "fp32", "neox", ("eager", "ltxbench-unfused"))
    time_fn, _ = _counting_timer()
    results, nbytes = micro.run_cases([case], device="cpu", time_fn=time_fn)
    assert results[(case, "eager")].check["passed"]
    assert results[(case, "ltxbench-unfused")].check["passed"] is (fault is None)
    # q, k, v (2 x 3 tokens of 2 + 1 + 1 heads of 128) read and written back (q rotated, k and v as the caches' rows),
    # the two tables (6 rows of 64) and the offset read; the caches' other rows neither read nor written
    qkv = 2 * 3 * (2 + 1 + 1) * 128
    assert nbytes[case] == 4 * (2 * qkv + 2 * 6 * 64) + 8


def test_liger_unavailable_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    spec = get_spec("rms_norm")
    with pytest.raises(micro.Unavailable, match="not importable"):
        micro.make_provider("liger", spec, {"x": torch.ones(1, 1, 8), "weight": None, "eps": 1e-6})
    with pytest.raises(micro.Unavailable, match="no nope provider"):
        micro.make_provider("nope", spec, {})


# --- rendering and files ----------------------------------------------------------------------------

def _table_text(records) -> str:
    from rich.console import Console

    console = Console(record=True, width=240, color_system=None)
    console.print(micro_report.render_table(records))
    return console.export_text()


def test_kernel_and_shape_names_stay_whole_in_a_narrow_console():
    from rich.console import Console

    console = Console(record=True, width=80, color_system=None)
    console.print(micro_report.render_table(_records()))
    lines = console.export_text().splitlines()
    assert any("rms_norm" in ln and "ltx2b-161f-cfg" in ln for ln in lines), "\n".join(lines)


def test_table_rendering():
    text = _table_text(_records())
    for fragment in ("rms_norm", "ltx2b-161f-cfg", "bf16", "cuda", "F.rms_norm", "compile", "liger",
                     "50.0 µs", "200.0 µs", "1.60× vs compile", "pass", "copy peak 2000 GB/s"):
        assert fragment in text, fragment
    gbps = NBYTES / 0.05e-3 / 1e9
    assert f"{gbps:.0f} GB/s" in text and f"50.0 µs · {100 * gbps / 2000:.0f}%" in text
    liger_row = [ln for ln in text.splitlines() if "ltx2b-161f-cfg" in ln][0]
    assert "n/a" in liger_row
    assert micro_report.na_notes(_records()) == ["n/a: liger for rms_norm: liger_kernel is not importable"]
    assert "FAIL cuda 0.5" in _table_text(_records(cuda_check=False))


def test_cell_and_check_helpers():
    assert micro_report.cell(None) == ""
    rec = _records()[1]
    assert micro_report.cell(rec).splitlines()[0].startswith("50.0 µs · ")
    row = {"liger": {"check": None, "derived": {"status": "n/a"}}}
    assert micro_report.check_cell(row) == "n/a" and micro_report.speedup_cell(row) == "—"


def test_json_and_csv_round_trip(tmp_path):
    records = _records()
    doc = make_result("micro", ["ltxbench", "bench", "micro", "rmsnorm"], {"copy_peak_gbps": 2000.0}, 0,
                      utc_now(), utc_now(), records, env=FAKE_ENV, build=FAKE_BUILD)
    json_path, csv_path = write_result(doc, tmp_path / "micro", force=False)
    assert json_path.name == "micro.json" and csv_path.name == "micro.csv"
    back = load_result(json_path)
    assert back["kind"] == "micro" and len(back["records"]) == 1 + len(CASE.providers)
    copy = [r for r in back["records"] if r["name"] == "copy"]
    assert len(copy) == 1 and copy[0]["derived"]["gbps"] == 2000.0
    liger = [r for r in back["records"] if r["provider"] == "liger"][0]
    assert liger["stats"]["median"] is None and liger["derived"]["status"] == "n/a"  # NaN → null
    cuda = [r for r in back["records"] if r["provider"] == "cuda"][0]
    assert cuda["check"]["passed"] is True and cuda["derived"]["speedup_vs_eager"] == pytest.approx(4.0)
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(back["records"])
    assert {"derived.gbps", "derived.pct_of_copy_peak", "check.passed", "params.shape_name", "stats.p20"} <= set(
        rows[0])
    assert [r["provider"] for r in rows] == [r["provider"] for r in back["records"]]


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "micro.png"
    micro_report.plot(_records(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- CLI ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "fragment"), [
    (["nope"], "'nope'"),
    (["rmsnorm", "--dtype", "bf16,bf8"], "'bf8'"),
    (["rmsnorm", "--shapes", "huge"], "'huge'"),
    (["rmsnorm", "--providers", "cuda,tensorrt"], "'tensorrt'"),
    (["rmsnorm", "--timer", "wallclock"], "'wallclock'"),
    (["rmsnorm", "--variant", "bogus"], "'bogus'"),
    (["rmsnorm_residual", "--shapes", "ltx"], "nothing to measure"),
])
def test_cli_usage_errors(args, fragment, monkeypatch):
    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    result = runner.invoke(app, ["bench", "micro", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


def test_cli_existing_output_refused_before_running(tmp_path, monkeypatch):
    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    (tmp_path / "r.csv").write_text("old")
    result = runner.invoke(app, ["bench", "micro", "rmsnorm", "--output", str(tmp_path / "r")])
    assert result.exit_code == 2 and "already exists" in result.output


def test_cli_plot_without_matplotlib_exits_4(monkeypatch):
    import importlib.util

    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    result = runner.invoke(app, ["bench", "micro", "rmsnorm", "--plot", "x.png"])
    assert result.exit_code == 4 and "matplotlib" in result.output


@pytest.mark.skipif(_has_cuda(), reason="checks the no-GPU path")
def test_cli_without_cuda_exits_4(monkeypatch):
    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    result = runner.invoke(app, ["bench", "micro", "rmsnorm"])
    assert result.exit_code == 4, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[0].startswith("error: ") and "NVIDIA GPU" in lines[0]
    assert len(lines) == 2 and "Traceback" not in result.output


def test_micro_help_is_light():
    result = runner.invoke(app, ["bench", "micro", "--help"])
    assert result.exit_code == 0
    assert "ltxbench bench micro rmsnorm --dtype bf16 --shapes ltx" in result.output and "--timer" in result.output
    code = ("import sys\nfrom ltxbench.cli import app\ntry:\n    app(['bench', 'micro', '--help'])\n"
            "except SystemExit as e:\n    assert e.code in (0, None)\n"
            "assert 'torch' not in sys.modules and 'rich' not in sys.modules\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_bench_help_lists_micro_and_e2e_as_commands():
    result = runner.invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    commands = result.output.split("Commands:", 1)[1]
    assert "\n  micro " in commands and "\n  e2e " in commands, result.output
    assert "Examples:" in result.output


@pytest.mark.gpu
def test_gpu_smoke_rmsnorm_seed(tmp_path):
    out = tmp_path / "micro.json"
    result = runner.invoke(app, ["bench", "micro", "rmsnorm", "--shapes", "seed", "--dtype", "bf16",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = load_result(out)
    assert doc["kind"] == "micro" and doc["run"]["config"]["copy_peak_gbps"] > 0
    records = doc["records"]
    assert sum(r["name"] == "copy" for r in records) == 1
    cuda = [r for r in records if r["provider"] == "cuda"]
    assert len(cuda) == len(SEED_SHAPES)
    for rec in cuda:
        assert rec["check"]["passed"] is True
        assert rec["stats"]["median"] > 0 and rec["derived"]["gbps"] > 0 and "speedup_vs_best" in rec["derived"]
    providers = {r["provider"] for r in records if r["name"] == "rms_norm"}
    assert providers == {"cuda", "eager", "F.rms_norm", "compile", "liger"}
    assert (tmp_path / "micro.csv").exists()
    assert json.loads(out.read_text())["schema"] == "ltxbench.result"


@pytest.mark.gpu
def test_gpu_timer_gives_no_provider_the_l2_lines_an_evict_last_kernel_left():
    """Our RMSNorm loads x with the L2 evict_last policy; a memset does not evict such lines, so without the
    timer's reset F.rms_norm timed next on the same x ran 6.9 us against 9.0 on an input ours never read (H100
    1x1024x2048 bf16, docs/tuning.md#measuring-method)."""
    import torch.nn.functional as F

    from ltxbench import ops
    from ltxbench.bench.timing import time_cuda

    x, fresh = (torch.randn(1, 1024, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    on_fresh = time_cuda(lambda: F.rms_norm(fresh, (2048,), None, 1e-6))["median"]
    time_cuda(lambda: ops.rms_norm(x, None, 1e-6))
    after_ours = time_cuda(lambda: F.rms_norm(x, (2048,), None, 1e-6))["median"]
    assert after_ours > 0.92 * on_fresh, (after_ours, on_fresh)


def _cpu_pipeline(monkeypatch, cuda_output):
    """Run the whole command on the CPU: fake GPU presence, copy peak and timer; `cuda` = `cuda_output`."""
    from ltxbench.bench import timing

    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(timing, "copy_bandwidth_gbps",
                        lambda timer="do_bench": {"bytes": 2 << 30, "ms": _stats(1.0), "gbps": 2000.0})
    real_run, real_make = micro.run_cases, micro.make_provider
    time_fn, _ = _counting_timer()
    monkeypatch.setattr(micro, "run_cases", lambda cases, **kw: real_run(
        cases, **{**kw, "device": "cpu", "time_fn": time_fn}))

    def make_provider(name, spec, inputs):
        if name == "cuda":
            return lambda: cuda_output(spec, inputs)
        return real_make(name, spec, inputs)

    monkeypatch.setattr(micro, "make_provider", make_provider)
    from ltxbench.ops import build

    monkeypatch.setattr(build, "load", lambda *a, **k: {})


@pytest.mark.parametrize("correct", [True, False])
def test_cli_end_to_end_on_cpu(tmp_path, monkeypatch, correct):
    def cuda_output(spec, inputs):
        out = spec.reference(**inputs)
        return out if correct else out + 1.0

    _cpu_pipeline(monkeypatch, cuda_output)
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    args = ["bench", "micro", "rms", "--shapes", "odd", "--dtype", "fp32", "--providers", "cuda,eager,liger",
            "--output", str(out)]
    has_mpl = True
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        has_mpl = False
    result = runner.invoke(app, args + (["--plot", str(png)] if has_mpl else []), env={"COLUMNS": "200"})
    assert result.exit_code == (0 if correct else 1), result.output
    doc = load_result(out)
    assert doc["run"]["config"]["copy_peak_gbps"] == 2000.0 and doc["run"]["argv"][3] == "rms"
    assert doc["run"]["config"]["timer"] == "do_bench" and doc["run"]["config"]["host_headroom_cycles"] > 0
    assert doc["run"]["config"]["l2_persisting_reset"] is True
    assert doc["run"]["seed"] == 0 and "--seed" in doc["run"]["argv"]
    # 1 copy record + 2 odd shapes x 3 providers, files written even when the check fails
    assert len(doc["records"]) == 1 + 2 * 3
    with open(tmp_path / "m.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(doc["records"])
    cuda = [r for r in doc["records"] if r["provider"] == "cuda"]
    assert all(r["check"]["passed"] is correct for r in cuda)
    assert all(r["derived"]["pct_of_copy_peak"] > 0 and r["derived"]["pct_of_same_size_copy"] > 0 for r in cuda)
    assert "odd-2x1024x5125" in result.output and "n/a" in result.output
    assert "% of a copy of the same bytes" in result.output
    if has_mpl:
        assert png.read_bytes()[:4] == b"\x89PNG"
    if not correct:
        assert "outside tolerance: rms_norm odd-2x1024x5125 fp32 (max abs err 1," in result.output
        assert "FAIL cuda 1" in result.output


def test_host_headroom_resets_persisting_l2_before_each_flush_sleeps_after_and_restores_the_driver(monkeypatch):
    import types

    import torch
    import triton.runtime

    from ltxbench.bench import timing

    calls = []

    class FakeDriver:
        def clear_cache(self, cache):
            calls.append(("flush", cache))

    driver = FakeDriver()
    monkeypatch.setattr(triton.runtime, "driver", types.SimpleNamespace(active=driver))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(("sleep", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(("sync",)))
    monkeypatch.setattr(timing, "reset_persisting_l2", lambda: calls.append(("reset",)))
    with timing.host_headroom(1234):
        triton.runtime.driver.active.clear_cache("buf")
    # the reset only once the previous call has finished (it takes effect at once, not in stream order)
    assert calls == [("sync",), ("reset",), ("flush", "buf"), ("sleep", 1234)]
    assert "clear_cache" not in vars(driver)
    driver.clear_cache("again")
    assert calls[-1] == ("flush", "again")


def test_time_cuda_takes_every_sample_under_host_headroom_and_reports_the_median(monkeypatch):
    """do_bench averages unless asked for all samples; the medians and percentiles must come from all of them,
    and every timed call must run inside host_headroom (L2 reset + flush + GPU sleep)."""
    import contextlib

    import triton.testing

    from ltxbench.bench import timing

    seen = {}

    @contextlib.contextmanager
    def headroom():
        seen["inside"] = True
        yield
        seen["inside"] = False

    def fake_do_bench(fn, warmup, rep, return_mode):
        assert seen.get("inside") is True
        seen.update(warmup=warmup, rep=rep, return_mode=return_mode)
        return [1.0, 2.0, 100.0, 3.0, 2.5]

    monkeypatch.setattr(timing, "host_headroom", headroom)
    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    stats = timing.time_cuda(lambda: None, warmup_ms=7, rep_ms=11)
    assert seen == {"inside": False, "warmup": 7, "rep": 11, "return_mode": "all"}
    assert stats["median"] == 2.5 and stats["n"] == 5 and stats["max"] == 100.0 and stats["min"] == 1.0
    with pytest.raises(ValueError, match="unknown timer"):
        timing.time_cuda(lambda: None, timer="wallclock")


# --- Ctrl-C / SIGTERM: what was measured is kept, marked incomplete ----------------------------------------

def _interrupting_timer(after: int):
    """A stand-in timer that raises KeyboardInterrupt at its call number `after` + 1 (as Ctrl-C would)."""
    time_fn, calls = _counting_timer()

    def timer(fn):
        if len(calls) == after:
            raise KeyboardInterrupt
        return time_fn(fn)

    return timer


def test_run_cases_interrupted_keeps_the_whole_cases_measured_before():
    cases = [Case("rms_norm", f"tiny{i}", (2, 3, 83 + i), "fp32", "weight", ("eager", "F.rms_norm")) for i in range(3)]
    # each case: 2 providers + the copy of its bytes = 3 timings; the 5th timing is case 1's second provider
    with pytest.raises(micro.Interrupted) as stop:
        micro.run_cases(cases, device="cpu", time_fn=_interrupting_timer(4))
    assert list(stop.value.nbytes) == [cases[0]]
    assert {case for case, _ in stop.value.results} == {cases[0]}  # case 1's first provider is not kept alone
    assert isinstance(stop.value, KeyboardInterrupt)


@pytest.mark.parametrize("after", [4, 0])
def test_cli_interrupted_writes_the_cases_measured_marked_incomplete(tmp_path, monkeypatch, after):
    from ltxbench.results.schema import incomplete

    real_run = micro.run_cases
    _cpu_pipeline(monkeypatch, lambda spec, inputs: spec.reference(**inputs))
    monkeypatch.setattr(micro, "run_cases", lambda cases, **kw: real_run(  # the timer stops after `after` timings
        cases, **{**kw, "device": "cpu", "time_fn": _interrupting_timer(after)}))
    out = tmp_path / "m.json"
    args = ["bench", "micro", "rms", "--shapes", "odd", "--dtype", "fp32", "--providers", "cuda,eager",
            "--output", str(out), "--plot", str(tmp_path / "m.png")]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 130, result.output
    assert not (tmp_path / "m.png").exists()  # no figure of part of a run
    if after == 0:
        assert "interrupted: nothing measured yet, nothing written" in result.output
        assert not out.exists() and not (tmp_path / "m.csv").exists()
        return
    doc = load_result(out)
    cut = incomplete(doc)
    assert cut == {"reason": "interrupted (Ctrl-C)", "measured": ["rms_norm odd-2x1024x5125 fp32"],
                   "not_measured": ["rms_norm odd-4x997x769 fp32"]}
    assert len(doc["records"]) == 1 + 2  # the copy peak and the first shape's two providers
    assert {r["params"]["shape_name"] for r in doc["records"] if r["name"] != "copy"} == {"odd-2x1024x5125"}
    assert "interrupted: kept 1 of 2 cases" in result.output and "marked incomplete" in result.output


def test_cli_sigterm_ends_the_run_as_ctrl_c_does(tmp_path, monkeypatch):
    """A job's time limit (SIGTERM) keeps the cases measured too, and says which signal ended the run."""
    import signal

    from ltxbench.results.schema import incomplete

    real_run = micro.run_cases
    _cpu_pipeline(monkeypatch, lambda spec, inputs: spec.reference(**inputs))
    time_fn, calls = _counting_timer()

    def terminated_at_the_fourth(fn):
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return time_fn(fn)

    monkeypatch.setattr(micro, "run_cases", lambda cases, **kw: real_run(
        cases, **{**kw, "device": "cpu", "time_fn": terminated_at_the_fourth}))
    out, before = tmp_path / "m.json", signal.getsignal(signal.SIGTERM)
    result = runner.invoke(app, ["bench", "micro", "rms", "--shapes", "odd", "--dtype", "fp32", "--providers",
                                 "cuda,eager", "--output", str(out)])
    assert result.exit_code == 130, result.output
    assert incomplete(load_result(out))["reason"] == "interrupted (SIGTERM)"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the run's alone
