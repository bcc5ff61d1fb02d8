"""`ltxbench bench e2e` on the CPU: config selection, validation exits, ltx-tiny phases/injection/revert, llama-tiny."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ltxbench.bench import e2e, e2e_report
from ltxbench.cli import app
from ltxbench.configurations import STANDARD, added_by
from ltxbench.errors import UsageError
from ltxbench.models import family, family_of, ltx, ltx_run
from tests.helpers import BENCH_E2E_LTX_TINY as TINY

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
LLAMA = ["bench", "e2e", "--model", "llama-tiny", "--weights", "random", "--device", "cpu", "--prompt-lengths",
         "16,32", "--new-tokens", "8", "--warmup-iterations", "1", "--repeats", "2"]


def _records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["records"]


def _by(records, name, provider):
    found = [r for r in records if r["name"] == name and r["provider"] == provider]
    assert found, f"no {name} record for {provider}"
    return found[0]


# --- selection and validation -------------------------------------------------------------------------

def test_select_configs_maps_the_original_flags():
    assert family.select_configs(None, None, True, "baseline") == ["compile"]
    assert family.select_configs(None, True, True, "baseline") == ["optimized+compile"]
    assert family.select_configs(None, False, False, "baseline") == ["baseline"]
    assert family.select_configs(None, True, False, "baseline") == ["optimized"]
    assert family.select_configs(None, None, False, "baseline,compile") == ["baseline", "compile"]
    assert family.select_configs("compile,baseline,compile", None, False, "x") == ["compile", "baseline"]
    with pytest.raises(UsageError, match="--configs cannot be combined"):
        family.select_configs("baseline", None, True, "baseline")
    with pytest.raises(UsageError, match="'fast'"):
        family.parse_configs("baseline,fast")
    assert family.parse_configs("all") == list(STANDARD)
    assert family.parse_configs("all", family_of("llama-tiny").config_names())[-2:] == ["liger", "liger+compile"]
    with pytest.raises(UsageError, match="'liger'"):  # a peer of another family
        family.parse_configs("liger", family_of("ltx-tiny").config_names())


@pytest.mark.parametrize(("extra", "needle"), [
    (["--num-frames", "50"], "--num-frames 50"),
    (["--configs", "baseline", "--compile"], "--configs cannot be combined"),
    (["--configs", "baseline", "--no-optimized-kernels"], "--configs cannot be combined"),
    (["--configs", "turbo"], "turbo"),
    (["--repeats", "0"], "--repeats 0"),
    (["--rounds", "0"], "--rounds 0"),
    (["--phase", "vae"], "--phase"),
    (["--steps", "1"], "--steps 1 must be at least 2"),
    (["--guidance-scale", "-1"], "--guidance-scale -1.0 must not be negative"),
])
def test_bad_arguments_exit_2(extra, needle, tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, *extra, "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not out.exists()


def test_kernel_provider_cuda_on_cpu_exits_2_naming_both(tmp_path):
    args = [a if a != "reference" else "cuda" for a in TINY]
    result = runner.invoke(app, [*args, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert "--kernel-provider cuda" in result.output and "--device cpu" in result.output


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_device_cuda_without_gpu_exits_4(tmp_path):
    args = [a if a != "cpu" else "cuda" for a in TINY if a not in ("--kernel-provider", "reference")]
    result = runner.invoke(app, [*args, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 4, result.output
    assert "GPU" in result.output


def test_validation_happens_before_torch_is_imported():
    code = ("import sys; from typer.testing import CliRunner; from ltxbench.cli import app; "
            "r = CliRunner().invoke(app, ['bench', 'e2e', '--num-frames', '50']); "
            "s = CliRunner().invoke(app, ['bench', 'e2e', '--model', 'llama-tiny', '--configs', 'bogus']); "
            "print(r.exit_code, s.exit_code, 'torch' in sys.modules, 'diffusers' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["2", "2", "False", "False"], proc.stdout + proc.stderr


# --- ltx-tiny -----------------------------------------------------------------------------------------

def test_ltx_tiny_baseline_and_optimized(tmp_path, captured):
    out, png = tmp_path / "e2e.json", tmp_path / "e2e.png"
    result = runner.invoke(app, [*TINY, "--configs", "baseline,optimized", "--output", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "e2e" and out.with_suffix(".csv").is_file() and png.stat().st_size > 0
    assert doc["run"]["config"]["configs"] == ["baseline", "optimized"]
    assert doc["run"]["config"]["injection"]["optimized"]["applied"] is True
    assert doc["run"]["config"]["timer"].startswith("time.perf_counter per phase (CPU)")
    records = doc["records"]
    for config in ("baseline", "optimized"):
        for name in ("text_encode", "vae_decode", "total"):
            assert _by(records, name, config)["stats"]["n"] == 2
        step = _by(records, "denoise_step", config)
        assert step["stats"]["n"] == 2 * 2 and step["unit"] == "ms" and step["better"] == "lower"
        assert step["derived"]["transformer_it_s"] > 0
        assert step["derived"]["peak_memory_bytes"] is None  # the CPU has no CUDA allocator to read
    assert "speedup_vs_baseline" in _by(records, "total", "optimized")["derived"]
    assert "speedup_vs_baseline" not in _by(records, "total", "baseline")["derived"]
    assert not [r for r in records if r["name"] == "compile"]
    transformer = captured["target"].transformer
    assert "forward" not in vars(transformer) and "forward" not in vars(transformer.rope)
    assert all("forward" not in vars(block) for block in transformer.transformer_blocks)
    assert all(type(b.attn1.processor).__name__ != "FusedLTXAttnProcessor" for b in transformer.transformer_blocks)


@pytest.mark.parametrize("model", ["ltx2-tiny", "wan-tiny"])
def test_phase_transformer_times_the_loop_alone(model, tmp_path):
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", model, "--weights", "random", "--device", "cpu",
                                 "--num-frames", "9", "--height", "64", "--width", "64", "--steps", "2",
                                 "--warmup-iterations", "1", "--repeats", "1", "--configs", "baseline",
                                 "--phase", "transformer", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert {r["name"] for r in _records(out) if r["provider"] == "baseline"} == {"denoise_step", "total"}


def test_ltx_tiny_phase_transformer_and_compile_flag(tmp_path, captured, compile_calls):
    out = tmp_path / "t.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--compile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert {r["provider"] for r in records} == {"compile"}
    assert {r["name"] for r in records} == {"denoise_step", "total", "compile"}
    assert _by(records, "denoise_step", "compile")["stats"]["n"] == 4
    compile_rec = _by(records, "compile", "compile")
    assert compile_rec["unit"] == "s" and compile_rec["stats"]["min"] >= 0
    assert compile_calls == [(captured["target"].transformer, "default")]
    assert captured["target"].transformer._compiled_call_impl is None  # undone after the config
    assert "compile_mode" not in _by(records, "total", "compile")["params"]  # default: params as in older files

    out2 = tmp_path / "ro.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--configs", "compile,optimized+compile",
                                 "--compile-mode", "reduce-overhead", "--output", str(out2)])
    assert result.exit_code == 0, result.output
    assert [mode for _, mode in compile_calls[1:]] == ["reduce-overhead", "reduce-overhead"]
    assert all(r["params"]["compile_mode"] == "reduce-overhead" for r in _records(out2))


@pytest.mark.parametrize("option,rule", [
    ("cross-kv-cache", "model: attn2 keys/values and caption projection once per generation (cross_kv cache)"),
    ("tuned-gemm", "linear: cuBLASLt GEMM, algorithm chosen by timing (ops.linear)"),
    ("pair-cfg-halves", "model: block 0's attn1 once for classifier-free guidance's identical halves (checked per "
                        "step)"),
])
def test_injection_flags_reach_the_injection_and_are_recorded_only_when_off(tmp_path, captured, option, rule):
    runs = {}
    for flag in (f"--{option}", f"--no-{option}"):
        out = tmp_path / f"{flag}.json"
        result = runner.invoke(app, [*TINY, "--phase", "transformer", "--configs", "optimized", flag,
                                     "--output", str(out)])
        assert result.exit_code == 0, result.output
        runs[flag] = json.loads(out.read_text())
    on, off = runs[f"--{option}"], runs[f"--no-{option}"]
    param = option.replace("-", "_")
    assert on["run"]["config"]["injection"]["optimized"]["rules"][rule] >= 1
    assert rule not in off["run"]["config"]["injection"]["optimized"]["rules"]
    assert all(param not in r["params"] for r in on["records"])  # default: params as in older files
    assert all(r["params"][param] is False for r in off["records"])
    assert f"--no-{option}" in off["run"]["argv"] and f"--{option}" in on["run"]["argv"]


def test_unknown_compile_mode_is_a_usage_error(tmp_path):
    result = runner.invoke(app, [*TINY, "--compile", "--compile-mode", "fastest", "--output", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    assert "--compile-mode 'fastest' is not one of default, reduce-overhead" in result.output
    result = runner.invoke(app, [*LLAMA, "--compile", "--decode-compile-mode", "fastest"])
    assert result.exit_code == 2
    assert "--decode-compile-mode 'fastest' is not one of default, reduce-overhead" in result.output


def test_summarize_compile_time_is_first_warmup_minus_steady_median():
    its = [{"total_ms": 5000.0, "step_ms": [4000.0]}, {"total_ms": 900.0, "step_ms": [1.0]},
           {"total_ms": 1000.0, "step_ms": [2.0]}, {"total_ms": 1100.0, "step_ms": [3.0]}]
    s = e2e.summarize("compile", its, warmup=1, compiled=True)
    assert s["compile_s"] == pytest.approx(4.0)
    assert s["step_ms"] == [1.0, 2.0, 3.0] and s["total_ms"] == [900.0, 1000.0, 1100.0]
    assert e2e.summarize("baseline", its, warmup=1, compiled=False)["compile_s"] is None


def test_rounds_alternate_the_order_and_pool_the_samples():
    """A B, B A, A B: each config timed in every round, its samples pooled; compile time from the first round."""
    import torch

    from ltxbench.inject import InjectionReport

    order, totals = [], iter(range(100, 1000, 10))

    def run(config):
        order.append(config)
        return {"total_ms": float(next(totals)), "step_ms": [1.0, 2.0]}

    results = e2e.run_configs(torch.nn.Linear(2, 2), ["baseline", "optimized"],
                              lambda name: InjectionReport("reference") if name == "optimized" else None,
                              run, warmup=1, repeats=2, device=torch.device("cpu"), log=lambda _: None, rounds=3)
    assert order.pop(0) == "baseline"  # the untimed first iteration of the process (100 ms): in no result
    per_config = [order[i] for i in range(0, len(order), 3)]  # 1 warmup + 2 repeats each
    assert per_config == ["baseline", "optimized", "optimized", "baseline", "baseline", "optimized"]
    assert list(results) == ["baseline", "optimized"]
    assert results["baseline"]["total_ms"] == [120.0, 130.0, 210.0, 220.0, 240.0, 250.0]
    assert results["optimized"]["step_ms"] == [1.0, 2.0] * 6
    assert results["baseline"]["first_iteration_ms"] == 110.0


def test_every_configuration_starts_clean_after_one_untimed_unpatched_iteration(monkeypatch):
    """Before any configuration, one iteration runs unpatched and uncompiled; each configuration resets dynamo
    before and after, compiles with static shapes, and is undone (injection reverted, compiled call dropped)
    before the next one runs."""
    import torch

    from ltxbench.inject import InjectionReport

    module = torch.nn.Linear(2, 2)
    events, compiled_kwargs = [], []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    monkeypatch.setattr(module, "compile", lambda **kw: compiled_kwargs.append(kw) or setattr(
        module, "_compiled_call_impl", lambda *a, **k: None))
    active = []

    def inject():
        report = InjectionReport("reference")
        active.append(True)
        report._undo.append(active.pop)
        return report

    def run(config):
        compiled = getattr(module, "_compiled_call_impl", None) is not None
        events.append(f"{config}:{'injected' if active else 'plain'}:{'compiled' if compiled else 'eager'}")
        return {"total_ms": 1.0, "step_ms": [1.0]}

    results = e2e.run_configs(module, ["optimized+compile", "baseline"],
                              lambda name: inject() if name.startswith("optimized") else None, run, warmup=1, repeats=1,
                              device=torch.device("cpu"), log=lambda _: None)
    # inductor's on-disk cache outlives dynamo.reset(): each compile says how much of it it hit
    assert results["optimized+compile"]["compile_cache"] == {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 0}
    assert "compile_cache" not in results["baseline"]
    settings = ltx.LTXSettings(model="ltx-tiny", weights="random", dtype="fp32")
    compile_record = next(r for r in family_of("ltx-tiny").records(results, {}, settings) if r["name"] == "compile")
    assert compile_record["derived"]["inductor_fxgraph_cache_hit"] == 0
    assert events == ["baseline:plain:eager",
                      "reset", *["optimized+compile:injected:compiled"] * 2, "reset",
                      "reset", *["baseline:plain:eager"] * 2, "reset"]
    assert compiled_kwargs == [{"mode": "default", "dynamic": False}] and not active


# --- llama-tiny ---------------------------------------------------------------------------------------

def test_llama_tiny_baseline(tmp_path, captured):
    out = tmp_path / "llm.json"
    no_weights = [a for a in LLAMA if a not in ("--weights", "random")]  # llama-tiny defaults to random weights
    result = runner.invoke(app, [*no_weights, "--configs", "baseline", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["run"]["config"]["weights"] == "random"
    records = _records(out)
    prefill = sorted(r["params"]["prompt_len"] for r in records if r["name"] == "prefill")
    assert prefill == [16, 32]
    decode = _by(records, "decode_step", "baseline")
    assert decode["stats"]["n"] == 2 * (8 - 1) and decode["derived"]["tokens_per_s"] > 0
    assert _by(records, "generate", "baseline")["params"]["new_tokens"] == 8
    model = captured["target"]
    assert not model.training and next(model.parameters()).dtype.is_floating_point


def test_llama_tiny_optimized_runs_the_llm_injection_and_reverts_it(tmp_path, captured):
    from ltxbench.inject.llm import RULE_ROPE

    out = tmp_path / "llm-opt.json"
    result = runner.invoke(app, [*LLAMA, "--configs", "baseline,optimized", "--kernel-provider", "reference",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    injection = doc["run"]["config"]["injection"]["optimized"]
    assert injection["applied"] is True and injection["rules"][RULE_ROPE] == 2
    # The table is printed whole where the output is not a terminal (Rich alone would cut to `base…`, `opti…`).
    assert "│ baseline " in result.output and "│ optimized " in result.output and "…" not in result.output
    assert _by(doc["records"], "decode_step", "optimized")["derived"]["speedup_vs_baseline"] > 0
    model = captured["target"]
    assert all("forward" not in vars(layer) for layer in model.model.layers)  # reverted after the run
    assert all(type(layer).__name__ == "LlamaDecoderLayer" and "_ltxbench_original_class" not in vars(type(layer))
               for layer in model.model.layers)


@pytest.mark.parametrize("flag", [None, "--no-tuned-gemm"])
def test_llm_tuned_gemm_reaches_the_injection_and_the_records(tmp_path, monkeypatch, flag):
    """--no-tuned-gemm keeps a prompt's projections on torch's linear (apply_kernels(tuned_gemm=False)) and is
    recorded; the default (on) is not, as for LTX. On the CPU nothing is searched: no GEMM choices in the record."""
    from ltxbench.inject import llm

    seen = []
    original = llm.apply_kernels

    def recording(model, provider="cuda", tuned_gemm=True):
        seen.append(tuned_gemm)
        return original(model, provider, tuned_gemm=tuned_gemm)

    monkeypatch.setattr(llm, "apply_kernels", recording)
    out = tmp_path / "llm-tuned.json"
    result = runner.invoke(app, [*LLAMA, "--configs", "optimized", "--kernel-provider", "reference",
                                 *([flag] if flag else []), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {flag is None}
    doc = json.loads(out.read_text())
    params = _by(doc["records"], "decode_step", "optimized")["params"]
    assert params.get("tuned_gemm", True) is (flag is None) and ("tuned_gemm" in params) is (flag is not None)
    assert "gemm_choices" not in doc["run"]["config"]["injection"]["optimized"]


def test_rounds_are_recorded_and_multiply_the_samples(tmp_path):
    out = tmp_path / "llm-rounds.json"
    result = runner.invoke(app, [*LLAMA, "--configs", "baseline", "--rounds", "2", "--output", str(out)])
    assert result.exit_code == 0, result.output
    decode = _by(_records(out), "decode_step", "baseline")
    assert decode["stats"]["n"] == 2 * 2 * (8 - 1) and decode["params"]["rounds"] == 2
    assert "round 2/2" in result.output


def test_llama_tiny_compile_configs_decode_through_generates_own_compile(tmp_path, captured, compile_calls,
                                                                          monkeypatch):
    """Compile configs: the prompt forwards run the module-level compile (stubbed: the CPU inductor build is too
    slow here), and generate() gets transformers' CompileConfig(fullgraph, decode mode) with that module compile
    set aside for the call; eager configs decode with transformers' auto-compile off."""
    from transformers import GenerationMixin

    calls = []
    original = GenerationMixin.generate

    def recording_generate(self, *args, **kwargs):
        config = kwargs.get("compile_config")
        calls.append((kwargs["disable_compile"], config and (config.mode, config.fullgraph),
                      getattr(self, "_compiled_call_impl", None)))
        return original(self, *args, **{k: v for k, v in kwargs.items() if k != "compile_config"})

    monkeypatch.setattr(GenerationMixin, "generate", recording_generate)
    out = tmp_path / "llm-compile.json"
    result = runner.invoke(app, [*LLAMA, "--configs", "baseline,compile", "--compile-mode", "max-autotune",
                                 "--decode-compile-mode", "max-autotune-no-cudagraphs", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert [mode for _, mode in compile_calls] == ["max-autotune"]
    # the process's untimed first iteration, then baseline's 1 warmup + 2 repeats: eager decode
    assert calls[:4] == [(True, None, None)] * 4
    assert calls[4:] == [(False, ("max-autotune-no-cudagraphs", True), None)] * 3
    records = _records(out)
    assert _by(records, "decode_step", "compile")["params"]["decode_compile_mode"] == "max-autotune-no-cudagraphs"
    assert "decode_compile_mode" not in _by(records, "decode_step", "baseline")["params"]
    assert all("decode_compile_mode" not in r["params"] for r in records if r["name"] == "prefill")
    model = captured["target"]
    assert model._compiled_call_impl is None and "_compiled_call" not in vars(model)


def test_llm_configs_shipped():
    from ltxbench.models.llm_build import LLM_CONFIGS, LLM_PRESETS

    assert Path(str(LLM_CONFIGS)) == Path(__file__).resolve().parents[2] / "configs" / "llm"  # the wheel ships them

    for name in LLM_PRESETS:
        data = json.loads((LLM_CONFIGS / f"{name}.json").read_text())
        assert data["model_type"] and data["vocab_size"] > 0
    llama = json.loads((LLM_CONFIGS / "llama-3-8b.json").read_text())
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["num_key_value_heads"],
            llama["intermediate_size"], llama["vocab_size"], llama["rope_theta"]) == (4096, 32, 8, 14336, 128256, 5e5)


@pytest.mark.parametrize("provider,tuned,searched", [("cuda", True, True), ("cuda", False, False),
                                                     ("reference", True, False)])
def test_the_gemm_search_is_one_untimed_step_before_the_configurations(monkeypatch, provider, tuned, searched):
    """With our kernels and tuned GEMMs, ops.linear's search (or the load of stored choices) runs in one untimed
    eager step before the first configuration, so that no configuration's warmup (compile time) absorbs it."""
    import ltxbench.inject.ltx as ltx_inject
    import ltxbench.ops

    events = []

    class Pipe:
        _execution_device = "cpu"
        transformer = object()

        def set_progress_bar_config(self, **_):
            pass

    class Report:
        def __enter__(self):
            return self

        def __exit__(self, *_):
            events.append("revert")

    def configs(*_args, **_kwargs):
        events.append("configs")
        return {"baseline": {"injection": {"applied": False}}, "optimized": {"injection": {"applied": True}}}

    monkeypatch.setattr(ltx_run, "encode", lambda *_: "embeds")
    monkeypatch.setattr(ltx_run, "run_once", lambda pipe, settings, embeds=None: events.append(("step", settings.steps,
                                                                                            embeds)))
    monkeypatch.setattr(ltx_inject, "apply_kernels", lambda pipe, prov, **kw: events.append(("inject", prov, kw))
                        or Report())
    monkeypatch.setattr(e2e, "run_configs", configs)
    monkeypatch.setattr(ltxbench.ops, "gemm_choices", lambda: ["bf16 x@w.T ... tuned"])
    settings = ltx.LTXSettings(model="ltx-tiny", weights="random", configs=["baseline", "optimized"],
                               kernel_provider=provider, phase="transformer", steps=10, tuned_gemm=tuned,
                               cross_kv_cache=False, warmup=1, repeats=1)
    results = family_of("ltx-tiny").bench(Pipe(), settings, log=lambda _: None)
    if not searched:
        assert events == ["configs"] and "gemm_search_s" not in results["optimized"]["injection"]
        return
    assert events == [("inject", "cuda", {"cross_kv_cache": False, "tuned_gemm": True, "pair_cfg_halves": True,
                                         "precision": "bf16", "fp8_accumulation": "fast"}),
                      ("step", 2, "embeds"),
                      "revert", "configs"]
    assert results["optimized"]["injection"]["gemm_search_s"] >= 0
    assert results["optimized"]["injection"]["gemm_choices"] == ["bf16 x@w.T ... tuned"]
    assert "gemm_choices" not in results["baseline"]["injection"]


def test_every_timed_iteration_is_a_new_generation_even_on_one_prompt_tensor(tmp_path, monkeypatch):
    """--phase transformer reuses one set of prompt embeddings for every iteration, and without guidance the
    pipeline passes that tensor on as it is: the optimized configs' attn2 key/value cache would then be built once
    in warmup and reused by every timed repeat, where the baseline computes it every step. Each iteration starts a
    new generation instead: one cache build per iteration."""
    from ltxbench.inject.ltx import cross_kv as ltx_cross_kv

    builds = []
    original = ltx_cross_kv.CrossKVCache.get

    def counting(self, model, encoder_hidden_states):
        before = self.builds
        entry = original(self, model, encoder_hidden_states)
        if self.builds > before:
            builds.append(1)
        return entry

    monkeypatch.setattr(ltx_cross_kv.CrossKVCache, "get", counting)
    out = tmp_path / "t.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--guidance-scale", "1.0", "--configs", "optimized",
                                 "--warmup-iterations", "1", "--repeats", "2", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert len(builds) == 1 + 2  # warmup + repeats: one build per iteration (the untimed first one is unpatched)


def test_an_llm_too_large_for_the_host_is_refused_before_it_is_built(tmp_path, monkeypatch):
    from ltxbench.memory import fit as memory

    monkeypatch.setattr(memory, "available", lambda device: (16 * 2**30, "the host has 16.0 GiB of RAM available"))
    out = tmp_path / "llm.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", "llama-3-8b", "--weights", "random", "--device", "cpu",
                                 "--configs", "baseline", "--output", str(out)])
    assert result.exit_code == 4, result.output
    assert "llama-3-8b in fp32 needs about 29.9 GiB for its weights alone" in result.output
    assert not out.exists()


def test_config_names_stay_whole_in_a_narrow_console():
    from rich.console import Console

    records = [{"name": "total", "provider": config, "params": {}, "derived": {}, "stats": {"median": 1234.5}}
               for config in ("baseline", "optimized+compile")]
    console = Console(width=80)
    with console.capture() as captured:
        console.print(e2e_report.render_table(records))
    assert "baseline" in captured.get() and "optimized+compile" in captured.get()


def test_ctrl_c_keeps_the_configurations_measured_and_marks_the_result_incomplete(tmp_path, monkeypatch):
    """Ctrl-C during the second configuration: the first one's records are written, the file says it is incomplete
    (and what was not measured), the command says so in one line and exits 130; compare refuses it as a baseline
    and, as the new side, fails on what it lacks."""
    calls = []
    real = ltx_run.run_once

    def interrupted_in_the_second_config(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # the untimed iteration, baseline's warmup + 2 repeats, then optimized's warmup
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ltx_run, "run_once", interrupted_in_the_second_config)
    out = tmp_path / "cut.json"
    result = runner.invoke(app, [*TINY, "--configs", "baseline,optimized", "--output", str(out)])
    assert result.exit_code == 130, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and lines[0].startswith("interrupted: kept 1 of 2 configurations (baseline) in ")
    assert lines[0].endswith("marked incomplete (not a baseline for compare)") and str(out) in lines[0]
    doc = json.loads(out.read_text())
    assert doc["run"]["config"]["incomplete"] == {"reason": "interrupted (Ctrl-C)", "measured": ["baseline"],
                                                 "not_measured": ["optimized"]}
    assert {r["provider"] for r in doc["records"]} == {"baseline"} and doc["records"]
    monkeypatch.setattr(ltx_run, "run_once", real)
    full = tmp_path / "full.json"
    assert runner.invoke(app, [*TINY, "--configs", "baseline,optimized", "--output", str(full)]).exit_code == 0
    as_base = runner.invoke(app, ["compare", str(out), str(full)])
    assert as_base.exit_code == 3 and "incomplete" in as_base.output
    as_new = runner.invoke(app, ["compare", str(full), str(out)])
    assert as_new.exit_code == 1 and "incomplete" in as_new.output


def test_ctrl_c_before_any_configuration_writes_nothing(tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ltx_run, "run_once", interrupt)
    out = tmp_path / "none.json"
    result = runner.invoke(app, [*TINY, "--configs", "baseline", "--output", str(out)])
    assert result.exit_code == 130, result.output
    assert [ln for ln in result.output.splitlines() if ln.startswith("interrupted")] == [
        "interrupted: nothing measured yet, nothing written"]
    assert not out.exists() and not list(tmp_path.iterdir())


# --- peer configurations (Liger-Kernel for LLMs) --------------------------------------------------------

def test_peer_configurations_belong_to_their_family_and_need_a_gpu(tmp_path):
    """`--configs all` is ours, torch's and the family's peers; a peer's configuration is refused (exit 2, before
    the model is built) on the CPU, and unknown to a family that does not declare it."""
    assert family_of("llama-tiny").config_names() == (*STANDARD, "liger", "liger+compile")
    offloads = ("group-offload", "group-offload+compile", "model-offload", "model-offload+compile")  # diffusers'
    own = tuple(f"{c}@{attention}" for attention in ("fa3", "auto") for c in (*STANDARD, "optimized-fp8",
                                                                            "optimized-fp8+compile"))
    # each of ours and torch's but FP8 attention with an attention of its own: FlashAttention-3, the measured choice
    assert family_of("ltx-tiny").config_names() == STANDARD + added_by("fp8-attention") + offloads + own
    assert family.parse_configs("all", family_of("ltx-tiny").config_names()) == [*STANDARD, *offloads]
    out = tmp_path / "x.json"
    on_cpu = runner.invoke(app, [*LLAMA, "--configs", "all", "--output", str(out)])
    assert on_cpu.exit_code == 2 and "--configs liger needs --device cuda" in on_cpu.output
    other = runner.invoke(app, [*TINY, "--configs", "baseline,liger", "--output", str(out)])
    assert other.exit_code == 2 and "unknown configuration 'liger'" in other.output
    assert not out.exists()


@pytest.mark.gpu
def test_llm_bench_puts_liger_beside_ours_and_undoes_both(tmp_path, captured):
    """On a GPU, `--configs all` times Liger's configurations in the same run; every record says how it compares
    with them (speedup_vs_liger), and the model is left exactly as built."""
    pytest.importorskip("liger_kernel")
    out = tmp_path / "all.json"
    argv = [a if a != "cpu" else "cuda" for a in LLAMA]
    result = runner.invoke(app, [*argv, "--configs", "baseline,optimized,liger", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    injection = doc["run"]["config"]["injection"]
    assert injection["liger"]["applied"] and injection["liger"]["provider"] == "liger"
    assert injection["liger"]["rules"]["rms_norm"] > 0 and injection["optimized"]["applied"]
    assert "speedup_vs_liger" in _by(doc["records"], "prefill", "optimized")["derived"]
    model = captured["target"]
    assert all(type(layer).__name__ == "LlamaDecoderLayer" and "forward" not in vars(layer.mlp)
               for layer in model.model.layers)


def test_sigterm_keeps_the_configurations_measured_as_ctrl_c_does(tmp_path, monkeypatch):
    """A job killed by its time limit (SIGTERM) writes what it measured, marked incomplete with the signal's name,
    and exits 130; the handler it installed is gone afterwards."""
    import signal

    calls, real = [], ltx_run.run_once

    def terminated_in_the_second_config(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # the untimed iteration, baseline's warmup + 2 repeats, then optimized's warmup
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(ltx_run, "run_once", terminated_in_the_second_config)
    out = tmp_path / "cut.json"
    result = runner.invoke(app, [*TINY, "--configs", "baseline,optimized", "--output", str(out)])
    assert result.exit_code == 130, result.output
    doc = json.loads(out.read_text())
    assert doc["run"]["config"]["incomplete"] == {"reason": "interrupted (SIGTERM)", "measured": ["baseline"],
                                                 "not_measured": ["optimized"]}
    assert signal.getsignal(signal.SIGTERM) is before


def test_regional_compile_compiles_each_repeated_block_and_is_undone(monkeypatch):
    """--compile-scope regional: diffusers' compile_repeated_blocks compiles each block named in _repeated_blocks
    (static shapes, the configuration's mode) and nothing else; the configuration drops every compiled block."""
    import torch
    from diffusers.models.modeling_utils import ModelMixin

    class Block(torch.nn.Linear):
        pass

    class Model(torch.nn.Module):
        _repeated_blocks = ["Block"]
        compile_repeated_blocks = ModelMixin.compile_repeated_blocks

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(2, 2) for _ in range(3)])
            self.head = torch.nn.Linear(2, 2)

    compiled = []

    def record(self, **kwargs):
        compiled.append((type(self).__name__, kwargs))
        self._compiled_call_impl = self._call_impl

    monkeypatch.setattr(torch.nn.Module, "compile", record)
    model = Model()
    with e2e.configuration(model, "compile", lambda name: None, "max-autotune-no-cudagraphs", "regional"):
        assert compiled == [("Block", {"mode": "max-autotune-no-cudagraphs", "dynamic": False})] * 3
        assert model._compiled_call_impl is None and model.head._compiled_call_impl is None
    assert all(block._compiled_call_impl is None for block in model.blocks)


def test_compile_scope_defaults_by_family_and_llms_refuse_regional(tmp_path, compile_calls):
    """LTX-2 compiles regionally unless told otherwise (its 48 blocks compiled whole take too long); LTX-Video the
    whole model, and refuses regional for its patched model (whose forward runs the blocks inline); an LLM refuses
    regional (exit 2); the scope is in the records' params only when not "model"."""
    from ltxbench.models.ltx2 import LTX2Settings

    assert LTX2Settings(model="ltx2-tiny", weights="random").compile_scope == "regional"
    out = tmp_path / "x.json"
    result = runner.invoke(app, [*TINY, "--configs", "compile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert compile_calls.scopes == ["model"] and "compile_scope" not in _records(out)[0]["params"]
    refused = runner.invoke(app, [*LLAMA, "--configs", "compile", "--compile-scope", "regional"])
    assert refused.exit_code == 2 and "--compile-scope regional" in refused.output
    inline = runner.invoke(app, [*TINY, "--configs", "compile,optimized+compile", "--compile-scope", "regional"])
    assert inline.exit_code == 2 and "--configs optimized+compile" in inline.output, inline.output  # blocks inline
    bad = runner.invoke(app, [*TINY, "--compile-scope", "blocks"])
    assert bad.exit_code == 2 and "--compile-scope 'blocks'" in bad.output


# --- --precision fp8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "needle"), [
    ([*TINY, "--precision", "fp16"], "--precision 'fp16': LTX-Video runs bf16 or fp8 or fp8-attention"),
    ([*LLAMA, "--precision", "fp8-attention"], "--precision 'fp8-attention': LLM runs bf16"),
    ([*TINY, "--precision", "fp8-attention", "--gpus", "2"], "--precision fp8-attention runs on one GPU, not --gpus 2"),
    ([*LLAMA, "--precision", "fp8"], "--precision 'fp8': LLM runs bf16"),
    ([*TINY, "--fp8-accumulation", "fast"], "--fp8-accumulation applies to the FP8 precisions"),
    ([*TINY, "--precision", "fp8", "--fp8-accumulation", "fp16"], "--fp8-accumulation 'fp16': choose fast or fp32"),
])
def test_a_precision_the_family_does_not_run_exits_2(args, needle, tmp_path):
    result = runner.invoke(app, [*args, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split())


@pytest.mark.slow
def test_precision_fp8_adds_the_fp8_configurations_and_records_their_error(tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--configs", "optimized", "--precision", "fp8",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert {(r["provider"], r["dtype"]) for r in records if r["name"] == "denoise_step"} == {
        ("optimized", "fp32"), ("optimized-fp8", "fp8"), ("optimized-fp8+compile", "fp8")}
    error = [r for r in records if r["name"] == "step_error"]
    assert [r["provider"] for r in error] == ["optimized-fp8"]  # one measurement, recorded once
    assert error[0]["check"]["passed"] and error[0]["check"]["weights"] == "random"
    assert 0.995 <= error[0]["stats"]["median"] < 1.0
    assert error[0]["derived"]["weight_bytes_fp8"] < error[0]["derived"]["weight_bytes_bf16"]
    assert error[0]["derived"]["video_frames"] == 9 and 0.5 < error[0]["derived"]["video_ssim"] < 1.0
    assert error[0]["derived"]["video_psnr_db"] > 20
    assert "fp8 step error: cosine" in result.output
    # the FP8 GEMMs' accumulation: fast by default, recorded, and in the table's precision column
    assert {r["params"]["fp8_accumulation"] for r in records} == {"fast"}
    assert "fp8, fast accumulation" in result.output
    injection = json.loads(out.read_text())["run"]["config"]["injection"]
    assert "fp8: weights stored per output channel" in " ".join(injection["optimized-fp8"]["rules"])
    assert not any(rule.startswith("fp8") for rule in injection["optimized"]["rules"])


def test_fp8_accumulation_fp32_records_as_older_fp8_files_did(tmp_path):
    """fp32 (partial sums promoted, as every FP8 result before the option): no fp8_accumulation in the records, so
    they compare with older files."""
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--configs", "optimized-fp8", "--precision", "fp8",
                                 "--fp8-accumulation", "fp32", "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert records and not any("fp8_accumulation" in r["params"] for r in records)
    assert "fast accumulation" not in result.output
    assert json.loads(out.read_text())["run"]["config"]["fp8_accumulation"] == "fp32"


def test_an_fp8_configuration_named_in_configs_records_its_accumulation(tmp_path):
    """--configs optimized-fp8 without --precision: the FP8 configuration still runs fast accumulation, so its
    records must say so (else they would read as fp32, as older files)."""
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--configs", "optimized-fp8", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert {r["params"]["fp8_accumulation"] for r in _records(out)} == {"fast"}
    assert json.loads(out.read_text())["run"]["config"]["fp8_accumulation"] == "fast"


def test_an_fp8_error_above_the_gate_exits_1_after_writing(tmp_path, monkeypatch):
    from ltxbench.bench import precision_error

    monkeypatch.setattr(precision_error, "FP8_COSINE_GATE", 1.0)
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, "--phase", "transformer", "--configs", "optimized-fp8",
                                 "--output", str(out)])
    assert result.exit_code == 1, result.output
    assert "FP8 step error above its gate" in " ".join(result.output.split())
    assert out.exists()


def test_psnr_and_ssim_of_known_cases():
    import torch

    from ltxbench.bench.precision_error import psnr, ssim

    frames = torch.rand(3, 3, 32, 40, generator=torch.Generator().manual_seed(0))
    assert ssim(frames, frames) == pytest.approx(1.0) and psnr(frames, frames) is None
    assert psnr(frames + 0.1, frames) == pytest.approx(20.0)  # MSE 0.01
    noise = torch.randn(frames.shape, generator=torch.Generator().manual_seed(1))
    light, heavy = ssim(frames + 0.01 * noise, frames), ssim(frames + 0.1 * noise, frames)
    assert 1.0 > light > heavy > 0.0
    assert ssim(frames + 0.1 * noise, frames) == pytest.approx(ssim(frames, frames + 0.1 * noise))
    # a uniform brightness shift leaves structure and contrast: SSIM is the luminance term alone
    mean = frames.mean().item()
    assert ssim(torch.full_like(frames, mean), torch.full_like(frames, mean + 0.1)) == pytest.approx(
        (2 * mean * (mean + 0.1) + 1e-4) / (mean**2 + (mean + 0.1) ** 2 + 1e-4), rel=1e-6)


@pytest.mark.parametrize(("mode", "hooked"), [("reduce-overhead", True), ("max-autotune", True), ("default", False),
                                              ("max-autotune-no-cudagraphs", False)])
def test_regional_compile_under_cuda_graphs_opens_one_graph_step_per_model_call(mode, hooked):
    """Regional compile replaying CUDA graphs: every model call starts one step of torch's CUDA-graph trees (a block
    call alone would open a new generation each, whose replays may overwrite the previous block's output); other
    modes and scopes add nothing; uncompile_module removes the hook with the compiled calls."""
    import torch
    from diffusers import ModelMixin
    from torch._inductor import cudagraph_trees

    class Block(torch.nn.Linear):
        pass

    class Model(ModelMixin):
        _repeated_blocks = ["Block"]

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(4, 4), Block(4, 4)])

        def forward(self, x):
            return x

    model = Model()
    e2e.compile_module(model, mode, "regional")
    assert (e2e.GRAPH_STEP_HOOK in vars(model)) == hooked
    before = cudagraph_trees.MarkStepBox.mark_step_counter
    model(torch.ones(1, 4))
    model(torch.ones(1, 4))
    assert before - cudagraph_trees.MarkStepBox.mark_step_counter == (2 if hooked else 0)
    e2e.uncompile_module(model)
    assert e2e.GRAPH_STEP_HOOK not in vars(model) and not model._forward_pre_hooks
    assert all(getattr(block, "_compiled_call_impl", None) is None for block in model.blocks)
    e2e.compile_module(model, mode, "model")
    assert e2e.GRAPH_STEP_HOOK not in vars(model) and not model._forward_pre_hooks
    e2e.uncompile_module(model)


# --- gemma-3-tiny --------------------------------------------------------------------------------------

GEMMA = ["bench", "e2e", "--model", "gemma-3-tiny", "--weights", "random", "--device", "cpu", "--prompt-lengths",
         "16,32", "--new-tokens", "4", "--warmup-iterations", "1", "--repeats", "1"]


def test_gemma_tiny_baseline_optimized_compile(tmp_path, captured, compile_calls):
    """Gemma 3 through the LLM family: its rules applied for optimized and reverted after, the compile config's
    module compile (stubbed) taken."""
    from ltxbench.inject.llm import gemma

    out = tmp_path / "gemma.json"
    result = runner.invoke(app, [*GEMMA, "--configs", "baseline,optimized,compile", "--kernel-provider", "reference",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    injection = doc["run"]["config"]["injection"]["optimized"]
    assert injection["applied"] is True
    assert {rule: injection["rules"][rule] for rule in gemma.RULES} == {gemma.RULE_NORM: 19, gemma.RULE_LAYER: 3,
                                                                        gemma.RULE_MLP: 3, gemma.RULE_ROPE: 3,
                                                                        gemma.RULE_DECODE: 7}
    assert len(compile_calls) == 1
    records = doc["records"]
    for config in ("baseline", "optimized", "compile"):
        assert _by(records, "decode_step", config)["stats"]["n"] == 4 - 1
    model = captured["target"]
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.layer_types[1] == "full_attention"
    assert all(type(layer).__name__ == "Gemma3DecoderLayer" and "forward" not in vars(layer)
               for layer in model.model.layers)


@pytest.mark.slow
def test_gemma_tiny_compile_with_inductor(tmp_path):
    """The compile configurations with torch.compile itself (inductor on the CPU, about 10 s a configuration)."""
    out = tmp_path / "gemma-compile.json"
    result = runner.invoke(app, [*GEMMA, "--configs", "compile,optimized+compile", "--kernel-provider", "reference",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert {r["provider"] for r in _records(out) if r["name"] == "compile"} == {"compile", "optimized+compile"}


def _out_of_memory_run(failing: str, calls: list):
    """A stand-in iteration: `failing` runs out of memory at its second call (a warmup went through), the others time
    1 ms."""
    import torch

    def run(config):
        calls.append(config)
        if config == failing and calls.count(config) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore text")
        return {"total_ms": 1.0, "step_ms": [1.0]}

    return run


def test_under_a_budget_a_configuration_out_of_memory_is_recorded_and_the_run_goes_on():
    import torch

    from ltxbench.bench.out_of_memory import did_not_fit

    calls, reverted = [], []

    class Report:
        def revert(self):
            reverted.append(True)

        def as_dict(self):
            return {"applied": True}

    results = e2e.run_configs(torch.nn.Linear(2, 2), ["baseline", "group-offload", "optimized"],
                              lambda name: Report() if name == "group-offload" else None,
                              _out_of_memory_run("group-offload", calls), warmup=1, repeats=2,
                              device=torch.device("cpu"), log=lambda _: None, rounds=2, budget_gib=8.0)
    assert results["group-offload"] == {"out_of_memory": {"budget_gib": 8.0, "error": "CUDA out of memory. Tried to "
                                                          "allocate 2.00 GiB"}, "injection": {"applied": True}}
    assert did_not_fit(results["group-offload"]) and reverted == [True]  # reverted once, not tried again
    assert calls.count("group-offload") == 2 and calls.count("optimized") == 6  # both rounds of the others
    assert not did_not_fit(results["optimized"]) and len(results["optimized"]["total_ms"]) == 4


def test_without_a_budget_out_of_memory_ends_the_run():
    import torch

    with pytest.raises(torch.OutOfMemoryError):
        e2e.run_configs(torch.nn.Linear(2, 2), ["baseline"], lambda name: None, _out_of_memory_run("baseline", []),
                        warmup=1, repeats=1, device=torch.device("cpu"), log=lambda _: None)


def test_a_configuration_that_did_not_fit_is_shown_as_out_of_memory_at_its_budget():
    from rich.console import Console

    from ltxbench.bench import e2e_report
    from ltxbench.results.report_tables import e2e_table
    from ltxbench.results.schema import out_of_memory_label

    fit = {"total_ms": [10.0], "step_ms": [4.0, 4.0], "compile_s": None, "peak_memory_bytes": None,
           "first_iteration_ms": 10.0, "injection": {}}
    results = {"baseline": fit, "model-offload": {"out_of_memory": {"budget_gib": 16.0, "error": "x"},
                                                  "injection": {}}}
    records = e2e_report.phase_records(results, {"memory_budget_gib": 16.0}, "bf16",
                                       (("denoise_step", "step_ms"), ("total", "total_ms")), "denoise_step",
                                       "transformer_it_s")
    failed = [r for r in records if r["provider"] == "model-offload"]
    assert len(failed) == 1 and failed[0]["name"] == "total" and failed[0]["stats"]["median"] is None
    assert out_of_memory_label(failed[0]) == "out of memory at 16 GiB"
    assert out_of_memory_label(records[0]) is None
    console = Console(record=True, width=200)
    console.print(e2e_report.render_table(records))
    assert "out of memory at 16 GiB" in console.export_text()
    table = e2e_table({"records": records})
    row = table[table["config"] == "model-offload"].iloc[0]
    assert "out of memory at 16 GiB" in row.tolist()


@pytest.mark.parametrize("placed", [False, True])
def test_the_fp8_errors_fp32_reference_is_not_a_copy_of_placed_blocks(monkeypatch, placed):
    """Under --memory-budget the streamed blocks share device slots (and the copy would share their hooks and host
    slabs): a deep copy computes with whatever block a slot last held. The reference is then skipped, said so."""
    import types

    import torch

    from ltxbench.bench import precision_error
    from ltxbench.memory import apply

    class Denoiser(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, hidden_states, return_dict=True):
            return (self.proj(hidden_states),)

    pipe = types.SimpleNamespace(transformer=Denoiser())
    x = torch.randn(2, 4)
    monkeypatch.setattr(apply, "placement_of", lambda _pipe: object() if placed else None)
    result = precision_error.measure(pipe, lambda _name: types.SimpleNamespace(revert=lambda: None),
                                     lambda: pipe.transformer(hidden_states=x), lambda _line: None)
    assert ("vs_fp32" in result) is not placed
    assert result.get("fp32_reference", "").startswith("skipped: the pipeline is placed by --memory-budget") is placed
