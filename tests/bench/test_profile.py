"""`ltxbench profile` on the CPU: family rules on real kernel names, ltx-tiny/llama-tiny runs, exits, revert."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from ltxbench.bench import gpu_monitor, profile
from ltxbench.bench.profile_families import FAMILIES, RULES, classify
from ltxbench.cli import app

runner = CliRunner()
TINY = ["profile", "--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--configs", "baseline,optimized",
        "--kernel-provider", "reference", "--steps", "2", "--num-frames", "9", "--height", "64", "--width", "64"]


@pytest.mark.parametrize(("name", "family"), [
    # CUDA kernels as nsys / torch.profiler name them
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "GEMM"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "GEMM"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "GEMM"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)", "GEMM"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_ndhwc_kndhwc_tilesize128x128x64", "GEMM"),
    ("aten::addmm", "GEMM"), ("aten::mm", "GEMM"), ("aten::linear", "GEMM"), ("aten::slow_conv3d_forward", "GEMM"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>"
     ", false, false, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>)",
     "attention"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90"
     "<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<64> >, 64, "
     "cutlass::bfloat16_t, float, cutlass::arch::Sm90, false> > > >(...)", "attention"),  # FlashAttention-3 (fa3)
    ("void ltxbench::(anonymous namespace)::gemv_kernel<__nv_bfloat16, 1>(ltxbench::GemmParams)", "ltxbench"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("fa3_fwd::fwd", "attention"),  # pip's FlashAttention-3 op
    ("aten::_efficient_attention_forward", "attention"),
    ("void ltxbench::(anonymous namespace)::row_op_cached<__nv_bfloat16, 8, 4, 1>(ltxbench::RowArgs)", "ltxbench"),
    ("void ltxbench::(anonymous namespace)::qk_norm_rope_kernel<__nv_bfloat16, 8>(...)", "ltxbench"),
    ("void rope3d_kernel<float>(float const*, float*, int)", "ltxbench"),
    ("ltxbench::rms_norm_modulate", "ltxbench"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "normalization/reduction"),
    ("triton_per_fused__softmax_1", "normalization/reduction"),
    ("triton_poi_fused_add_gelu_mul_2", "elementwise/copy"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, ...)",
     "normalization/reduction"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>(...)",
     "normalization/reduction"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float*, int)",
     "normalization/reduction"),
    ("aten::native_layer_norm", "normalization/reduction"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
     "elementwise/copy"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
     "elementwise/copy"),
    ("Memcpy DtoD (Device -> Device)", "elementwise/copy"), ("Memset (Device)", "elementwise/copy"),
    ("aten::_to_copy", "elementwise/copy"), ("aten::add_", "elementwise/copy"), ("aten::cat", "elementwise/copy"),
    ("aten::tanh", "elementwise/copy"), ("aten::as_strided", "other"), ("aten::normal_", "other"),
    ("aten::convert_element_type", "other"),
])
def test_family_rules_on_real_kernel_names(name, family):
    assert classify(name) == family


def test_rule_table_is_documented_and_ordered():
    families = [f for f, _ in RULES]
    assert set(families) <= set(FAMILIES)
    # collectives first (an NCCL kernel's name can hold "reduce" or "copy"), then ours
    assert families[:2] == ["communication", "ltxbench"] and families.index("attention") < families.index("GEMM")
    for name in ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "c10d::all_to_all_",
                 "_c10d_functional::wait_tensor", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"):
        assert classify(name) == "communication", name
    assert profile.kernel_base("void ltxbench::(anonymous namespace)::row_op_cached<float, 8>(int)") == "row_op_cached"
    assert profile.kernel_base("nvjet_tst_128x256") == "nvjet_tst_128x256"


def test_summarize_shares_and_top():
    table = {"aten::mm": [3, 3000.0], "aten::add": [5, 500.0], "sm90_xmma_gemm_x": [1, 1500.0], "weird": [1, 0.0]}
    res = profile.summarize(table, top=2)
    assert res["total_ms"] == pytest.approx(5.0)
    assert res["families"]["GEMM"] == {"ms": pytest.approx(4.5), "calls": 4, "share": pytest.approx(0.9)}
    assert sum(f["share"] for f in res["families"].values()) == pytest.approx(1.0)
    assert [k["name"] for k in res["kernels"]] == ["aten::mm", "sm90_xmma_gemm_x"]


def test_busy_and_idle_counts_overlaps_once():
    # two streams overlapping (0-10, 5-12), a gap of 3, then a kernel nested in the previous one
    tl = profile.busy_and_idle([(15.0, 20.0), (0.0, 10.0), (5.0, 12.0), (16.0, 18.0)])
    assert tl == {"span_ms": pytest.approx(0.020), "busy_ms": pytest.approx(0.017), "idle_ms": pytest.approx(0.003)}
    assert profile.busy_and_idle([]) is None


def test_idle_row_and_record_only_for_gpu_runs():
    fams = {f: {"ms": 0.0, "calls": 0, "share": 0.0} for f in FAMILIES}
    gpu = {"c": {"families": fams, "total_ms": 1.0, "kernels": [],
                 "timeline": {"span_ms": 2.0, "busy_ms": 1.5, "idle_ms": 0.5}}}
    cpu = {"c": {"families": fams, "total_ms": 1.0, "kernels": [], "timeline": None}}
    idle = [r for r in profile.build_records(gpu, {}, "bf16") if r["name"] == "timeline:idle"]
    assert len(idle) == 1 and idle[0]["stats"]["median"] == 0.5 and idle[0]["derived"]["span_ms"] == 2.0
    assert not [r for r in profile.build_records(cpu, {}, "bf16") if r["name"].startswith("timeline:")]
    def text(table):
        console = Console(record=True, width=200)
        console.print(table)
        return console.export_text()

    last = text(profile.render_families(gpu, "kernel time")).strip().splitlines()[-2]
    assert "idle between kernels" in last and "0.500" in last and "25.0" in last
    assert "idle between kernels" not in text(profile.render_families(cpu, "CPU self time"))


def test_external_commands_only_when_tools_exist(monkeypatch):
    from ltxbench.models import family_of, ltx

    family = family_of("ltx-2b")
    settings = ltx.LTXSettings(model="ltx-2b", weights="random", dtype="bf16", seed=1, batch_size=1, num_frames=49,
                               height=512, width=768, phase="transformer")
    results = {"optimized": {"kernels": [{"name": "void ltxbench::row_op_cached<float>(int)"}]}}
    assert profile.external_commands(family, settings, results, "/t", "p", lambda tool: None) == []
    lines = profile.external_commands(family, settings, results, "/t", "p", lambda tool: f"/usr/bin/{tool}")
    assert lines[0].startswith("nsys profile -t cuda,nvtx") and "--steps 2 --num-frames 49" in lines[0]
    assert "--configs optimized" in lines[0] and "--repeats 1 --warmup-iterations 1" in lines[0]
    assert "--guidance-scale 3.0" in lines[0]
    assert lines[1].startswith("ncu ") and "regex:row_op_cached" in lines[1]
    # the printed command is one `bench e2e` accepts: its checks pass, and it stops at the (hidden) GPU: exit 4
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = shlex.split(lines[0])
    result = runner.invoke(app, argv[argv.index("ltxbench") + 1:])
    assert result.exit_code == 4, result.output


def _check_doc(doc, configs):
    assert doc["kind"] == "profile"
    for config in configs:
        fams = [r for r in doc["records"] if r["provider"] == config and ":" not in r["name"]]
        assert {r["name"] for r in fams} == set(FAMILIES)
        assert all(r["metric"] == "time" and r["unit"] == "ms" and r["stats"]["n"] == 1 for r in fams)
        assert all(r["stats"]["median"] == r["stats"]["min"] == r["stats"]["max"] == r["stats"]["p20"] for r in fams)
        assert sum(r["derived"]["share"] for r in fams) == pytest.approx(1.0, abs=1e-6)
        assert sum(r["stats"]["median"] for r in fams) == pytest.approx(doc["run"]["config"]["totals_ms"][config])
        assert sum(r["stats"]["median"] for r in fams if r["name"] == "GEMM") > 0
        kernels = [r for r in doc["records"] if r["provider"] == config and r["name"].startswith("kernel:")]
        assert kernels and all(r["derived"]["calls"] >= 1 and r["derived"]["family"] in FAMILIES for r in kernels)
        trace = json.loads(open(doc["run"]["config"]["traces"][config]).read())
        assert trace["traceEvents"]


def test_ltx_tiny_baseline_and_optimized(tmp_path, captured):
    from ltxbench.models import ltx_run as ltx

    originals = (ltx.encode, ltx.denoise, ltx.decode)
    out = tmp_path / "prof.json"
    result = runner.invoke(app, [*TINY, "--top", "5", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    _check_doc(doc, ("baseline", "optimized"))
    assert (tmp_path / "prof-baseline.trace.json").is_file() and (tmp_path / "prof-optimized.trace.json").is_file()
    assert doc["run"]["config"]["injection"]["optimized"]["applied"] is True
    assert len([r for r in doc["records"] if r["name"].startswith("kernel:")]) == 2 * 5
    names = {e.get("name") for e in json.loads((tmp_path / "prof-baseline.trace.json").read_text())["traceEvents"]}
    assert {"text_encode", "denoise", "vae_decode"} <= names
    assert "time per kernel family" in result.output and "top 5 kernels: optimized" in result.output
    # injection and the phase wrappers are undone
    transformer = captured["target"].transformer
    assert "forward" not in vars(transformer) and "forward" not in vars(transformer.rope)
    assert all("forward" not in vars(block) for block in transformer.transformer_blocks)
    assert all(type(b.attn1.processor).__name__ != "FusedLTXAttnProcessor" for b in transformer.transformer_blocks)
    assert (ltx.encode, ltx.denoise, ltx.decode) == originals
    # no clobbering without --force: the result, and the traces alone (checked before anything runs)
    again = runner.invoke(app, [*TINY, "--output", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output
    traces = {p: p.read_bytes() for p in tmp_path.glob("prof-*.trace.json")}
    out.unlink()
    out.with_suffix(".csv").unlink()
    captured.clear()
    again = runner.invoke(app, [*TINY, "--output", str(out)])
    assert again.exit_code == 2 and "trace.json already exists" in again.output, again.output
    assert not captured and not out.exists()  # refused before the model was built
    assert all(p.read_bytes() == data for p, data in traces.items())


def test_llama_tiny_baseline(tmp_path, captured):
    out, traces = tmp_path / "llm.json", tmp_path / "traces"
    result = runner.invoke(app, ["profile", "--model", "llama-tiny", "--weights", "random", "--device", "cpu",
                                 "--configs", "baseline", "--prompt-length", "16", "--new-tokens", "3",
                                 "--trace-dir", str(traces), "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    _check_doc(doc, ("baseline",))
    names = {e.get("name") for e in json.loads((traces / "llm-baseline.trace.json").read_text())["traceEvents"]}
    assert {"prefill", "generate"} <= names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's profiler log")
def test_a_cpu_profile_keeps_the_profilers_gpu_probe_off_stderr(tmp_path):
    """Kineto writes "gpuGetDeviceCount failed" (and its start/stop lines) to the process's stderr on a CPU; a fresh
    process, as the profiler reads its log level once. llama-tiny without --weights: random, its only weights."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "ltxbench", "profile", "--model", "llama-tiny", "--device", "cpu",
                           "--configs", "baseline", "--prompt-length", "16", "--new-tokens", "3",
                           "--output", str(tmp_path / "llm.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "gpuGetDeviceCount" not in proc.stderr and "profiler_start" not in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "llm.json").read_text())["run"]["config"]["weights"] == "random"


def test_compile_mode_reaches_the_compile_configs(tmp_path, captured, compile_calls):
    out = tmp_path / "ro.json"
    result = runner.invoke(app, [*TINY, "--configs", "compile", "--compile-mode", "reduce-overhead",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [mode for _, mode in compile_calls] == ["reduce-overhead"] and "--compile-mode" in doc["run"]["argv"]
    assert all(r["params"]["compile_mode"] == "reduce-overhead" for r in doc["records"])
    llm = runner.invoke(app, ["profile", "--model", "llama-tiny", "--weights", "random", "--device", "cpu",
                              "--configs", "baseline", "--prompt-length", "8", "--new-tokens", "2",
                              "--decode-compile-mode", "default", "--output", str(tmp_path / "l.json")])
    assert llm.exit_code == 0, llm.output  # the LLM's decode step: generate()'s own compile, as in bench e2e
    argv = json.loads((tmp_path / "l.json").read_text())["run"]["argv"]
    assert argv[argv.index("--decode-compile-mode") + 1] == "default"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_device_cuda_without_gpu_exits_4(tmp_path):
    args = [a for a in TINY if a not in ("--kernel-provider", "reference")]
    args[args.index("cpu")] = "cuda"
    result = runner.invoke(app, [*args, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 4, result.output
    assert "GPU" in result.output and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("extra", "needle"), [
    (["--top", "0"], "--top 0"), (["--top", "x"], "--top"), (["--phase", "vae"], "--phase"),
    (["--configs", "turbo"], "turbo"), (["--num-frames", "10"], "--num-frames 10"),
    (["--compile-mode", "fastest"], "--compile-mode 'fastest'"),
])
def test_bad_arguments_exit_2(extra, needle, tmp_path):
    result = runner.invoke(app, [*TINY, *extra, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not (tmp_path / "r.json").exists()


def test_the_profiled_run_is_sampled_and_the_gpu_fields_reach_the_idle_record(tmp_path):
    """profile_configs opens the monitor after the warmup, around the profiled run only; on a GPU run the summary
    joins the timeline:idle record."""
    runs, opened = [], []

    def monitor(device):
        assert len(runs) == 1, "opened before the warmup ended"
        opened.append(device)
        return gpu_monitor.GpuMonitor(lambda: (1635.0, 688.0, 62.0, 0x4), interval_s=10.0)

    lines = []
    results = profile.profile_configs(torch.nn.Linear(2, 2), ["baseline"], lambda name: None, lambda: runs.append(1),
                                      torch.device("cpu"), {"baseline": tmp_path / "trace.json"}, 5, lines.append,
                                      monitor=monitor)
    assert len(runs) == 2 and len(opened) == 1
    gpu = results["baseline"]["gpu"]
    assert gpu["gpu_sm_mhz_median"] == 1635.0 and gpu["gpu_power_capped_share"] == 1.0 and gpu["gpu_samples"] == 2
    assert "SM 1635 MHz" in lines[-1]
    fams = {f: {"ms": 0.0, "calls": 0, "share": 0.0} for f in FAMILIES}
    res = {"c": {"families": fams, "total_ms": 1.0, "kernels": [], "gpu": gpu,
                 "timeline": {"span_ms": 2.0, "busy_ms": 1.5, "idle_ms": 0.5}}}
    idle = next(r for r in profile.build_records(res, {}, "bf16") if r["name"] == "timeline:idle")
    assert idle["derived"]["gpu_sm_mhz_median"] == 1635.0 and idle["derived"]["busy_ms"] == 1.5
    console = Console(record=True, width=200)
    console.print(profile.render_families(res, "kernel time"))
    row = console.export_text().strip().splitlines()[-2]
    assert "SM clock MHz" in row and "1635" in row and "100" in row


def test_llm_profile_decodes_as_bench_e2e_times_it(tmp_path, captured, compile_calls, monkeypatch):
    """Each configuration's profiled iteration is what `bench e2e` times: a prefill, then generate() with a static
    cache whose decode step transformers compiles (--decode-compile-mode, CUDA graphs by default) in the compile
    configurations only, the module-level compile set aside for that call."""
    from ltxbench.models import llm_run as llm

    generated = []
    real_generate_kwargs = llm.decode_kwargs

    def decode_kwargs(compiled, mode, fullgraph=True):
        generated.append((compiled, mode, fullgraph))
        return real_generate_kwargs(False, mode)  # the CPU runs the step eager; what was asked is what counts

    monkeypatch.setattr(llm, "decode_kwargs", decode_kwargs)
    result = runner.invoke(app, ["profile", "--model", "llama-tiny", "--weights", "random", "--device", "cpu",
                                 "--configs", "baseline,compile", "--prompt-length", "8", "--new-tokens", "2",
                                 "--output", str(tmp_path / "l.json")])
    assert result.exit_code == 0, result.output
    # baseline: warmup (counting its FLOPs) and the profiled run; compile: the same two
    assert generated == [(False, "reduce-overhead", True)] * 2 + [(True, "reduce-overhead", True)] * 2
    assert "_compiled_call" not in vars(captured["target"])  # generate()'s compiled step is not left behind
