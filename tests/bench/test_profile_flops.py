"""`ltxbench profile`'s FLOPs by kind (flops.by_kind) against hand counts, the GEMM and attention families' TFLOP/s
and % of peak (bench.profile_flops), their records, the printed table and the report's rows (only when present)."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from ltxbench.bench import flops, profile, profile_flops
from ltxbench.bench.profile_families import FAMILIES
from ltxbench.cli import app
from ltxbench.results.report_tables import profile_table

runner = CliRunner()
H200_BF16 = 989.4


def _gemm(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


class TinyBlock(torch.nn.Module):
    """A Linear to q, k, v, SDPA over 2 heads, an output Linear, a batched matmul and a 1-D convolution."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.conv = torch.nn.Conv1d(dim, 4, kernel_size=3)

    def forward(self, x):  # x: (batch, tokens, dim)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        o = self.out(o)
        gram = torch.bmm(o, o.transpose(1, 2))  # (b, s, s)
        return self.conv(o.transpose(1, 2)), gram


def test_the_split_of_a_tiny_block_is_the_hand_count():
    b, s, d, heads = 2, 5, 8, 2
    block = TinyBlock(d, heads)
    with torch.no_grad():
        _, counts = flops.by_kind(lambda: block(torch.randn(b, s, d)))
    gemm = (_gemm(b * s, d, 3 * d) + _gemm(b * s, d, d) + _gemm(b * s, d, s)  # qkv, out, the bmm
            + 2 * b * 4 * (s - 2) * d * 3)  # the convolution: every output element is d×3 multiply-adds
    assert counts == {"GEMM": gemm, "attention": flops.attention_flops(b, heads, s, s, d // heads), "other": 0}


@pytest.mark.parametrize(("op", "kind"), [
    (torch.ops.aten.mm, "GEMM"), (torch.ops.aten.addmm, "GEMM"), (torch.ops.aten.bmm, "GEMM"),
    (torch.ops.aten.baddbmm, "GEMM"), (torch.ops.aten._scaled_mm, "GEMM"), (torch.ops.aten.convolution, "GEMM"),
    (torch.ops.aten._convolution, "GEMM"), (torch.ops.aten.cudnn_convolution, "GEMM"),
    (torch.ops.aten._scaled_dot_product_flash_attention, "attention"),
    (torch.ops.aten._scaled_dot_product_efficient_attention, "attention"),
    (torch.ops.aten._scaled_dot_product_cudnn_attention, "attention"),
    (torch.ops.aten._flash_attention_forward, "attention"), (torch.ops.aten._efficient_attention_forward, "attention"),
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, "attention"),
    (torch.ops.aten.add, "other"), ("flex_attention", "attention")])
def test_every_counted_op_has_its_kind(op, kind):
    assert flops.kind_of(op) == kind


def test_counting_config_and_precisions():
    assert profile_flops.counting_config(["optimized", "baseline"]) == "baseline"
    assert profile_flops.counting_config(["compile", "optimized", "liger"]) is None  # a peer patches too
    assert profile_flops.precision_of("optimized-fp8", "bf16", "GEMM") == "fp8"
    assert profile_flops.precision_of("optimized-fp8", "bf16", "attention") == "bf16"
    assert profile_flops.precision_of("optimized-fp8-attention+compile", "bf16", "attention") == "fp8"
    assert profile_flops.precision_of("baseline", "fp32", "GEMM") == "fp32"


def _results(gemm_ms=4.0, attention_ms=2.0, counted=True, config="baseline"):
    fams = {f: {"ms": 0.0, "calls": 1, "share": 0.0} for f in FAMILIES}
    fams["GEMM"]["ms"], fams["attention"]["ms"] = gemm_ms, attention_ms
    res = {"families": fams, "total_ms": gemm_ms + attention_ms, "kernels": [], "timeline": None}
    if counted:
        res["model_flop"] = {"kinds": {"GEMM": 2e12, "attention": 0.5e12, "other": 0}, "gpu": "NVIDIA H200"}
    return {config: res}


def test_the_families_rates_are_their_kinds_flops_over_their_time():
    fams = profile_flops.add_rates(_results(), "bf16")["baseline"]["families"]
    assert fams["GEMM"]["model_tflop"] == pytest.approx(2.0) and fams["GEMM"]["tflops"] == pytest.approx(500.0)
    assert fams["GEMM"]["pct_of_peak"] == pytest.approx(100 * 500 / H200_BF16)
    assert fams["attention"]["tflops"] == pytest.approx(250.0)
    assert all("tflops" not in fams[f] for f in FAMILIES if f not in ("GEMM", "attention"))
    fp8 = profile_flops.add_rates(_results(config="optimized-fp8"), "bf16")["optimized-fp8"]["families"]
    assert fp8["GEMM"]["pct_of_peak"] == pytest.approx(100 * 500 / 1978.9)  # FP8 projections: the FP8 peak
    assert fp8["attention"]["pct_of_peak"] == pytest.approx(100 * 250 / H200_BF16)
    # a family without time (the CPU's, or an attention run by our kernels) and an uncounted run get nothing
    idle = profile_flops.add_rates(_results(attention_ms=0.0), "bf16")["baseline"]["families"]
    assert "tflops" in idle["GEMM"] and "tflops" not in idle["attention"]
    assert not profile_flops.rated(profile_flops.add_rates(_results(counted=False), "bf16"))
    cpu = _results()
    cpu["baseline"]["model_flop"]["gpu"] = None
    assert "pct_of_peak" not in profile_flops.add_rates(cpu, "fp32")["baseline"]["families"]["GEMM"]


def _text(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_records_table_and_report_rows_only_when_present():
    plain = _results(counted=False)
    rated = profile_flops.add_rates(_results(), "bf16")
    assert all("tflops" not in r["derived"] for r in profile.build_records(plain, {}, "bf16"))
    records = {r["name"]: r["derived"] for r in profile.build_records(rated, {}, "bf16")}
    assert records["GEMM"]["tflops"] == pytest.approx(500.0) and records["attention"]["model_tflop"] == 0.5
    assert "tflops" not in records["other"] and records["GEMM"]["share"] == 0.0
    assert "TFLOP/s" not in _text(profile.render_families(plain, "kernel time"))
    text = _text(profile.render_families(rated, "kernel time"))
    gemm_row = next(line for line in text.splitlines() if "GEMM TFLOP/s" in line)
    assert "500.0" in gemm_row and f"{100 * 500 / H200_BF16:.1f}" in gemm_row
    doc = {"records": profile.build_records(plain, {"steps": 2}, "bf16")}
    assert "GEMM TFLOP/s (% of dense peak)" not in profile_table(doc)["ms per step"].tolist()
    frame = profile_table({"records": profile.build_records(rated, {"steps": 2}, "bf16")})
    rows = dict(zip(frame["ms per step"], frame["baseline"], strict=True))
    assert rows["GEMM"] == "2.00"  # ms per step: 4 ms over 2 steps; the rate is per run and per step alike
    assert rows["GEMM TFLOP/s (% of dense peak)"] == f"500.0 ({100 * 500 / H200_BF16:.1f}%)"
    assert rows["attention TFLOP/s (% of dense peak)"].startswith("250.0 (")
    assert list(frame["ms per step"])[-2:] == ["GEMM TFLOP/s (% of dense peak)", "attention TFLOP/s (% of dense peak)"]


def test_profile_configs_counts_once_in_the_unpatched_warmup(tmp_path):
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    runs, applied = [], []

    def run():
        runs.append(torch.is_grad_enabled())
        with torch.no_grad():
            layer(x)

    traces = {c: tmp_path / f"{c}.json" for c in ("optimized", "baseline", "compile")}
    out = profile.profile_configs(layer, ["optimized", "baseline"], applied.append, run, torch.device("cpu"),
                                  traces, 5, lambda _line: None)
    assert len(runs) == 4 and applied == ["optimized", "baseline"]  # no extra run: baseline's warmup counted
    for res in out.values():
        assert res["model_flop"] == {"kinds": {"GEMM": _gemm(5, 4, 3), "attention": 0, "other": 0}, "gpu": None}
    runs.clear(), applied.clear()
    profile.profile_configs(layer, ["optimized"], applied.append, run, torch.device("cpu"), traces, 5,
                            lambda _line: None)
    assert len(runs) == 3 and applied == ["baseline", "optimized"]  # one untimed run of the unpatched model first


def test_the_stg_off_profile_counts_its_own_work(monkeypatch):
    """LTX-2's stg-off runs other work than the baseline (no STG pass): its FLOPs are counted on their own."""
    from ltxbench.models import family_of
    from ltxbench.models.ltx2 import LTX2Settings

    passed = {}
    monkeypatch.setattr(profile, "profile_configs", lambda *args, **kwargs: passed.update(kwargs) or {})

    class Pipe:
        transformer, _execution_device = None, torch.device("cpu")

        def set_progress_bar_config(self, **_kwargs):
            pass

    settings = LTX2Settings(model="ltx2-tiny", weights="random", configs=["baseline", "stg-off"], device="cpu")
    family_of("ltx2-tiny").profile(Pipe(), settings, {}, lambda _line: None)
    work = passed["work"]
    assert work("stg-off") == work("stg-off+compile") == work("ltx-core") != work("baseline")
    assert work("baseline") == work("compile") == work("optimized+compile")


def test_profile_counts_each_work_once_in_an_uncompiled_run(tmp_path):
    """A configuration of other work (its own key of `work`: here one call where the others make two) is counted in
    one more untimed run of it uncompiled, before the profiled ones; the others keep the count of the first
    unpatched eager configuration's warmup."""
    layer, x = torch.nn.Linear(4, 3), torch.randn(5, 4)
    applied = []

    def run():
        with torch.no_grad():
            for _ in range(1 if applied[-1].startswith("stg-off") else 2):
                layer(x)

    configs = ["baseline", "stg-off+compile", "optimized"]
    out = profile.profile_configs(layer, configs, applied.append, run, torch.device("cpu"),
                                  {c: tmp_path / f"{c}.json" for c in configs}, 5, lambda _line: None,
                                  work=lambda c: c.startswith("stg-off"))
    assert applied == ["stg-off", *configs]  # counted uncompiled, before the profiled configurations
    assert out["stg-off+compile"]["model_flop"]["kinds"]["GEMM"] == _gemm(5, 4, 3)
    assert out["baseline"]["model_flop"]["kinds"]["GEMM"] == out["optimized"]["model_flop"]["kinds"]["GEMM"] \
        == 2 * _gemm(5, 4, 3)


def _llama_profile_by_hand(cfg, prompt: int, new_tokens: int) -> dict:
    """{kind: FLOPs} of llm_run.profiled_iteration: a prefill without cache keeping the last logits, then generate() of
    `new_tokens` with a static cache: its own prefill (attending over the prompt), then one token per step, each
    attending over the whole cache, the prompt and every token fed but the last (the positions not yet written are
    masked, not skipped)."""
    d, ff, heads, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_hidden_layers
    head_dim, kv = d // heads, cfg.num_key_value_heads * (d // heads)
    tokens, cache = 2 * prompt + new_tokens - 1, prompt + new_tokens - 1
    gemm = (layers * (2 * _gemm(tokens, d, d) + 2 * _gemm(tokens, d, kv) + 2 * _gemm(tokens, d, ff)
                      + _gemm(tokens, ff, d)) + _gemm(1 + new_tokens, d, cfg.vocab_size))
    attention = layers * (2 * flops.attention_flops(1, heads, prompt, prompt, head_dim)
                          + (new_tokens - 1) * flops.attention_flops(1, heads, 1, cache, head_dim))
    return {"GEMM": gemm, "attention": attention}


def _profile_llama(tmp_path, device: str, configs: str):
    out = tmp_path / "llm.json"
    result = runner.invoke(app, ["profile", "--model", "llama-tiny", "--weights", "random", "--device", device,
                                 "--configs", configs, "--prompt-length", "16", "--new-tokens", "3",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())["records"]


def test_llama_tiny_profile_records_the_hand_counted_split(tmp_path, captured):
    result, records = _profile_llama(tmp_path, "cpu", "baseline")
    by_hand = _llama_profile_by_hand(captured["target"].config, 16, 3)
    records = {r["name"]: r for r in records}
    for name, flop in by_hand.items():
        derived = records[name]["derived"]
        assert derived["model_tflop"] * 1e12 == pytest.approx(flop)
        assert derived["tflops"] == pytest.approx(flop / (records[name]["stats"]["median"] * 1e-3) / 1e12)
        assert "pct_of_peak" not in derived  # the CPU: no peak
    assert "GEMM TFLOP/s (% of dense peak)" in result.output


@pytest.mark.gpu
def test_a_gpu_profile_rates_both_families_against_the_peak(tmp_path, captured):
    """On a GPU: the same FLOPs for every configuration, each family's rate over its own kernel time, and the % of
    peak where the GPU is in the peak table."""
    _, records = _profile_llama(tmp_path, "cuda", "baseline,optimized")
    by_hand = _llama_profile_by_hand(captured["target"].config, 16, 3)
    peak = flops.peak_tflops(torch.cuda.get_device_name(), "bf16")
    rated = [r for r in records if r["name"] in ("GEMM", "attention")]
    assert len(rated) == 4 and all(r["stats"]["median"] > 0 for r in rated)
    model_config = captured["target"].config
    # on the GPU the RoPE tables' outer product (inv_freq x positions, head_dim/2 x 1 x tokens) runs as a matmul, in
    # every forward: the prefill's 16 tokens, generate()'s 16, then its 2 single-token steps
    rope_tables = 2 * (model_config.hidden_size // model_config.num_attention_heads // 2) * (16 + 16 + 3 - 1)
    for config in ("baseline", "optimized"):
        mine = {r["name"]: r["derived"] for r in rated if r["provider"] == config}
        assert (mine["GEMM"]["model_tflop"] + mine["attention"]["model_tflop"]) * 1e12 == pytest.approx(
            sum(by_hand.values()) + rope_tables)
        assert mine["attention"]["model_tflop"] > 0  # an SDPA kernel, not the math path's bmm
        for derived in mine.values():
            assert ("pct_of_peak" in derived) == (peak is not None)
            if peak is not None:
                assert derived["pct_of_peak"] == pytest.approx(100 * derived["tflops"] / peak)


def test_a_profile_rates_the_work_its_configuration_did():
    """The calls an injection answered without running them leave the kinds' FLOPs (and show under "answered")."""
    from ltxbench.inject import CALLS_ANSWERED

    counted = {"kinds": {"GEMM": 100, "attention": 40, "other": 0},
               "calls": [{"GEMM": 40, "attention": 16, "other": 0}, {"GEMM": 20, "attention": 8, "other": 0}]}
    assert profile.done_flops(counted, {}, "NVIDIA H200") == {"kinds": counted["kinds"], "gpu": "NVIDIA H200"}
    done = profile.done_flops(counted, {CALLS_ANSWERED: [1]}, None)
    assert done == {"kinds": {"GEMM": 80, "attention": 32, "other": 0}, "gpu": None,
                    "answered": {"GEMM": 20, "attention": 8, "other": 0}}


def test_the_profile_counts_each_call_beside_the_whole_run():
    """Nested counters, as profile_configs counts: the run's kinds and each call's of the module, in one pass."""
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)

    def run():
        with torch.no_grad():
            layer(x)
            layer(x[:2])
            torch.nn.functional.linear(x, layer.weight)  # outside the module: the run's, not a call's

    calls: list = []
    _, kinds = flops.by_kind(lambda: flops.per_call(layer, run, calls))
    assert kinds["GEMM"] == _gemm(5, 4, 3) * 2 + _gemm(2, 4, 3)
    assert calls == [{"GEMM": _gemm(5, 4, 3), "attention": 0, "other": 0},
                     {"GEMM": _gemm(2, 4, 3), "attention": 0, "other": 0}]
