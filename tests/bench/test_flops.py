"""Model FLOPs (bench.flops): torch's counter on the tiny models against hand counts, the peak table, the derived
rates, and their place in `bench e2e`'s records and tables."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.bench import e2e_report, flops
from ltxbench.cli import app
from ltxbench.results.report_tables import e2e_table
from tests.helpers import BENCH_E2E_LTX_TINY, LLM_TINY, llm_build

runner = CliRunner()


def _gemm(m: int, k: int, n: int) -> int:
    return 2 * m * k * n  # a multiply and an add per term


def llama_prefill_by_hand(tokens: int) -> int:
    """LLM_TINY's llama, one prefill keeping the last logits: per layer q, k, v, o, gate, up, down and attention."""
    d, ff, heads, kv = LLM_TINY["hidden_size"], LLM_TINY["intermediate_size"], LLM_TINY["num_attention_heads"], \
        LLM_TINY["num_key_value_heads"]
    head_dim = d // heads
    layer = (_gemm(tokens, d, d) + 2 * _gemm(tokens, d, kv * head_dim) + _gemm(tokens, d, d)
             + 2 * _gemm(tokens, d, ff) + _gemm(tokens, ff, d)
             + flops.attention_flops(1, heads, tokens, tokens, head_dim))
    return LLM_TINY["num_hidden_layers"] * layer + _gemm(1, d, LLM_TINY["vocab_size"])


def test_attention_flops_are_two_gemms():
    assert flops.attention_flops(2, 32, 2688, 2688, 64) == 2 * _gemm(2 * 32 * 2688, 64, 2688)
    assert flops.attention_flops(1, 1, 3, 5, 7) == 4 * 3 * 5 * 7


def test_torch_counts_the_tiny_llama_prefill_as_by_hand():
    model = llm_build("llama")
    ids = torch.randint(3, LLM_TINY["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, calls = flops.per_call(model, lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
    assert calls == [llama_prefill_by_hand(12)]
    assert not model._forward_hooks and not model._forward_pre_hooks  # the counter's hooks are gone


def test_cpu_attention_is_counted_masked_or_not():
    q, k = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 32, 8)
    mask = torch.zeros(2, 1, 16, 32)
    from torch.utils.flop_counter import FlopCounterMode

    flops._count_attention()
    for kwargs in ({}, {"attn_mask": mask}):
        with FlopCounterMode(display=False) as counter:
            torch.nn.functional.scaled_dot_product_attention(q, k, k, **kwargs)
        assert counter.get_total_flops() == flops.attention_flops(2, 4, 16, 32, 8)
    with FlopCounterMode(display=False) as counter:  # grouped-query: 2 key/value heads for 4 query heads
        torch.nn.functional.scaled_dot_product_attention(q, k[:, :2], k[:, :2], enable_gqa=True)
    assert counter.get_total_flops() == flops.attention_flops(2, 4, 16, 32, 8)


def test_grouped_query_shapes_count_every_query_head():
    """torch releases whose sdpa_flop_count asserts equal head counts (2.11, on the GPU with transformers' GQA) get
    the kv heads broadcast to the query's; equal heads and ungroupable shapes go through unchanged."""
    def strict(q, k, v):
        assert q[1] == k[1] == v[1], "incompatible"
        return flops.attention_flops(q[0], q[1], q[2], k[2], q[3])

    count = flops.with_kv_heads_broadcast(strict)
    assert count((1, 32, 7, 128), (1, 8, 9, 128), (1, 8, 9, 128)) == flops.attention_flops(1, 32, 7, 9, 128)
    assert count((2, 4, 5, 64), (2, 4, 5, 64), (2, 4, 5, 64)) == flops.attention_flops(2, 4, 5, 5, 64)
    with pytest.raises(AssertionError):
        count((1, 6, 7, 8), (1, 4, 7, 8), (1, 4, 7, 8))


def test_units_of_an_iteration():
    assert flops.video_step({"step_ms": [1.0, 2.0]}, [10, 10, 6, 6]) == {"step_ms": 16}
    assert flops.video_step({"step_ms": []}, [10]) == {}
    # two prefills, generate()'s prefill, then its decode steps
    assert flops.llm_units([16, 32], [100, 200, 110, 5, 7]) == {"prefill_16_ms": 100, "prefill_32_ms": 200,
                                                                "step_ms": 6}


@pytest.mark.parametrize(("gpu", "precision", "peak"), [
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA H200", "fp8", 1978.9), ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H100 PCIe", "fp8-attention", 1513.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A100-SXM4-80GB", "fp8", None), ("NVIDIA L40S", "fp8", 733.0),
    ("NVIDIA GeForce RTX 4090", "fp16", 165.2), ("NVIDIA H200", "fp32", None), ("NVIDIA B9000", "bf16", None),
    (None, "bf16", None)])
def test_peak_table(gpu, precision, peak):
    assert flops.peak_tflops(gpu, precision) == peak


def test_rates_tflops_and_mfu():
    got = flops.rates(989.4e12 * 0.5 * 0.002, 2.0, "NVIDIA H200", "bf16")  # half the peak's work in 2 ms
    assert got["model_tflop"] == pytest.approx(0.9894) and got["tflops"] == pytest.approx(494.7)
    assert got["mfu"] == pytest.approx(0.5)
    assert flops.rates(1e12, 2.0, "NVIDIA H200", "bf16", gpus=2)["mfu"] == pytest.approx(500 / 989.4 / 2)
    assert "mfu" not in flops.rates(1e12, 2.0, None, "bf16")  # the CPU: TFLOP/s only
    assert flops.rates(None, 2.0, "NVIDIA H200", "bf16") == {}


@pytest.mark.parametrize("tied", [False, True])
def test_a_decode_step_reads_every_weight_once_but_the_untied_input_embedding(tied):
    model = llm_build("llama", tie_word_embeddings=tied)
    embedding = model.get_input_embeddings().weight
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    assert (model.get_output_embeddings().weight is embedding) == tied
    expected = every if tied else every - embedding.numel() * embedding.element_size()
    assert flops.decode_weight_bytes(model) == expected


def test_the_hbm_floor_of_a_decode_step():
    got = flops.hbm_floor(16_060_000_000, 8.29, "NVIDIA H100 80GB HBM3")  # Llama-3-8B's weights at 8.29 ms
    assert got["weight_gb"] == pytest.approx(16.06) and got["hbm_floor_ms"] == pytest.approx(16.06 / 3.35)
    assert got["pct_of_hbm_floor"] == pytest.approx(100 * 16.06 / 3.35 / 8.29)
    assert flops.hbm_floor(1e9, 1.0, "NVIDIA H200")["hbm_floor_ms"] == pytest.approx(1 / 4.8)
    assert flops.hbm_floor(1e9, 1.0, None) == {"weight_gb": 1.0} and flops.hbm_floor(None, 1.0, "NVIDIA H200") == {}


def test_llm_decode_records_carry_the_floor_and_the_tables_show_it():
    from ltxbench.models.llm_run import build_records

    res = {"peak_memory_bytes": 1, "compile_s": None, "generate_ms": [20.0], "prefill_16_ms": [5.0],
           "step_ms": [4.0, 4.0], "decode_weights": {"bytes": 9.6e9, "gpu": "NVIDIA H200"}}
    records = build_records({"baseline": res}, {"batch_size": 1}, "bf16", [16], 4)
    step = next(r for r in records if r["name"] == "decode_step")
    assert step["derived"]["pct_of_hbm_floor"] == pytest.approx(50.0)  # 9.6 GB at 4.8 TB/s: 2 ms of 4
    assert e2e_table({"records": records})["% of HBM floor"].tolist() == ["50.0%"]
    assert "% of HBM floor" in [c.header for c in e2e_report.render_table(records).columns]
    batched = build_records({"baseline": res}, {"batch_size": 2}, "bf16", [16], 4)
    assert "pct_of_hbm_floor" not in next(r for r in batched if r["name"] == "decode_step")["derived"]


def test_llm_records_carry_model_flops_and_the_tables_show_them(tmp_path):
    out = tmp_path / "llm.json"
    argv = ["bench", "e2e", "--model", "llama-tiny", "--device", "cpu", "--prompt-lengths", "16,32", "--new-tokens",
            "4", "--warmup-iterations", "1", "--repeats", "1", "--configs", "baseline", "--output", str(out)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    by = {(r["name"], r["params"].get("prompt_len")): r["derived"] for r in doc["records"]}
    short, long_ = by[("prefill", 16)], by[("prefill", 32)]
    assert 2 < long_["model_tflop"] / short["model_tflop"] < 2.5  # linear in tokens, plus attention's square
    assert short["tflops"] > 0
    step = next(r for r in doc["records"] if r["name"] == "decode_step")
    assert step["derived"]["tflops"] == pytest.approx(step["derived"]["model_tflop"] / (step["stats"]["median"]
                                                                                         * 1e-3))
    assert "mfu" not in step["derived"] and "model_tflop" not in by[("generate", 16)]
    assert "step TFLOP/s" in e2e_table(doc).columns and "TFLOP/s" in result.output
    # each prefill's own TFLOP/s, a column per prompt length, in the report's table and the printed one
    frame = e2e_table(doc)
    assert frame["prefill 32 TFLOP/s"].tolist() == [f"{long_['tflops']:.1f}"] and "prefill 16 TFLOP/s" in frame
    headers = [c.header for c in e2e_report.render_table(doc["records"]).columns]
    assert headers.index("prefill@16 TFLOP/s") < headers.index("prefill@32 TFLOP/s") < headers.index("step TFLOP/s")


def test_video_step_records_carry_model_flops(tmp_path):
    out = tmp_path / "ltx.json"
    result = runner.invoke(app, [*BENCH_E2E_LTX_TINY, "--configs", "baseline", "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["records"]
    step = next(r for r in records if r["name"] == "denoise_step")
    assert step["derived"]["model_tflop"] > 0 and step["derived"]["tflops"] > 0
    assert all("model_tflop" not in r["derived"] for r in records if r["name"] != "denoise_step")


def test_tables_without_the_fields_show_no_columns():
    rec = {"name": "denoise_step", "provider": "baseline", "dtype": "bf16", "params": {"phase": "transformer"},
           "metric": "time", "unit": "ms", "better": "lower",
           "stats": {"median": 10.0, "p20": 9.0, "p80": 11.0, "min": 9.0, "max": 12.0, "n": 3},
           "derived": {"transformer_it_s": 100.0}}
    prefill = {**rec, "name": "prefill", "params": {"prompt_len": 16}, "derived": {}}
    assert not [c for c in e2e_table({"records": [rec, prefill]}).columns if "TFLOP/s" in c or c == "MFU"]
    assert not [c.header for c in e2e_report.render_table([rec, prefill]).columns if "TFLOP/s" in c.header]
    assert "MFU" not in [c.header for c in e2e_report.render_table([rec]).columns]
    rec["derived"].update(tflops=400.0, mfu=0.4, model_tflop=4.0)
    frame = e2e_table({"records": [rec]})
    assert frame["MFU"].tolist() == ["40.0%"] and frame["step TFLOP/s"].tolist() == ["400.0"]


def test_calls_answered_without_running_are_left_out_of_the_rates():
    """A configuration whose injection answered calls (LTX-2's STG pass from the pair) did less work: its TFLOP/s and
    MFU are of the FLOPs it ran; the answered share is reported apart (a 1% slip in that share fails)."""
    from ltxbench.bench.e2e_report import flop_rates
    from ltxbench.inject import CALLS_ANSWERED

    calls = [8e12, 4e12, 3.5e12] * 2  # pair, STG, modality; two steps
    counted = {"units": {"step_ms": sum(calls) / 2}, "calls": calls, "gpu": "NVIDIA H200"}
    full = flop_rates({"model_flop": counted, "step_ms": [20.0], "injection": {}}, "step_ms", "bf16", {})
    done = flop_rates({"model_flop": counted, "step_ms": [20.0], "injection": {CALLS_ANSWERED: [1, 4]}},
                      "step_ms", "bf16", {})
    assert full["model_tflop"] == pytest.approx(15.5) and "answered_tflop" not in full
    assert done["model_tflop"] == pytest.approx(11.5, rel=1e-3) and done["answered_tflop"] == pytest.approx(4.0)
    assert done["mfu"] == pytest.approx(11.5e12 / 20e-3 / 1e12 / 989.4, rel=1e-3)
    assert done["mfu"] / full["mfu"] == pytest.approx(11.5 / 15.5, rel=1e-3)


def test_the_ltx2_optimized_step_rates_the_work_it_did(tmp_path):
    """ltx2-tiny on the CPU with the pipeline's guidance: optimized answers the STG pass, so its step's FLOPs are the
    baseline's less one batch-1 call a step, and answered_tflop holds that call."""
    out = tmp_path / "e2e.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", "ltx2-tiny", "--device", "cpu", "--weights", "random",
                                 "--num-frames", "9", "--height", "64", "--width", "64", "--steps", "2",
                                 "--warmup-iterations", "1", "--repeats", "1", "--phase", "transformer",
                                 "--kernel-provider", "reference", "--configs", "baseline,optimized",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    step = {r["provider"]: r["derived"] for r in doc["records"] if r["name"] == "denoise_step"}
    assert doc["run"]["config"]["injection"]["optimized"]["calls_answered"] == [1, 4]
    assert "answered_tflop" not in step["baseline"]
    base, mine = step["baseline"]["model_tflop"], step["optimized"]
    assert mine["model_tflop"] + mine["answered_tflop"] == pytest.approx(base)
    assert 0.15 < mine["answered_tflop"] / base < 0.35  # one batch-1 call of the four samples a step computes
