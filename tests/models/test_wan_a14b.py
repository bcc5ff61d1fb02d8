"""Wan 2.2 A14B's two experts through the family seam on the CPU (wan-tiny-a14b): the preset's sizes, both experts
running their share of the steps by boundary_ratio, both patched and reverted by one report, both compiled and
both counted."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.models import family_of, wan, wan_build, wan_run

runner = CliRunner()
STEPS = 6
TINY = ["--model", "wan-tiny-a14b", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "64", "--steps", str(STEPS)]
E2E = ["bench", "e2e", *TINY, "--warmup-iterations", "1", "--repeats", "1"]


@pytest.fixture(scope="module")
def tiny():
    pipe = wan_build.build_pipeline("wan-tiny-a14b", "random", "cpu", "fp32")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _settings(**values):
    return wan.WanSettings(model="wan-tiny-a14b", weights="random", device="cpu", num_frames=9, height=64, width=64,
                           steps=STEPS, **values)


def _expected_calls(pipe) -> tuple[int, int]:
    """(high-noise, low-noise) expert calls of a guided generation: two per step, split at boundary_ratio x 1000."""
    pipe.scheduler.set_timesteps(STEPS)
    boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    high = sum(1 for t in pipe.scheduler.timesteps if t >= boundary)
    return 2 * high, 2 * (STEPS - high)


def _count_calls(modules, fn) -> list[int]:
    counts = [0] * len(modules)
    handles = [m.register_forward_pre_hook(lambda *_a, i=i: counts.__setitem__(i, counts[i] + 1))
               for i, m in enumerate(modules)]
    try:
        fn()
    finally:
        for handle in handles:
            handle.remove()
    return counts


def test_the_a14b_preset_is_two_14b_experts_switching_at_0_875():
    configs = wan_build.component_configs("wan2.2-a14b")
    assert configs["pipeline"] == {"boundary_ratio": 0.875}
    parts = wan_build.build_components(configs, "meta", torch.bfloat16)
    for name, count in {"transformer": 14.289e9, "transformer_2": 14.289e9, "vae": 126.9e6,
                        "text_encoder": 5.681e9}.items():
        assert abs(sum(p.numel() for p in parts[name].parameters()) / count - 1) < 1e-3, name
    assert family_of("wan2.2-a14b").presets["wan2.2-a14b"] == "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def test_a_pipeline_directory_with_two_experts_reads_both_and_its_boundary(tmp_path):
    folder = wan_build.CONFIGS / "wan-tiny-a14b"
    for comp in (*wan_build.COMPONENTS, "transformer_2"):
        (tmp_path / comp).mkdir()
        name = "scheduler_config.json" if comp == "scheduler" else "config.json"
        (tmp_path / comp / name).write_text((folder / f"{comp}.json").read_text())
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "boundary_ratio": 0.9}))
    configs = wan_build.component_configs(str(tmp_path))
    assert configs["transformer_2"] == json.loads((folder / "transformer_2.json").read_text())
    assert configs["pipeline"] == {"boundary_ratio": 0.9}


def test_the_tiny_pipeline_has_two_distinct_experts_and_the_family_names_both(tiny):
    assert tiny.config.boundary_ratio == 0.875
    assert tiny.transformer is not tiny.transformer_2
    first, second = (next(m.parameters()) for m in (tiny.transformer, tiny.transformer_2))
    assert not torch.equal(first, second)  # each expert from its own seed
    assert wan.WanFamily().denoisers(tiny) == [tiny.transformer, tiny.transformer_2]
    single = wan_build.build_pipeline("wan-tiny", "random", "cpu", "fp32")
    assert wan.WanFamily().denoisers(single) == [single.transformer]


def test_each_expert_runs_its_share_of_the_steps(tiny):
    high, low = _expected_calls(tiny)
    assert high and low  # the split falls inside the run
    counts = _count_calls([tiny.transformer, tiny.transformer_2], lambda: wan_run.run_once(tiny, _settings()))
    assert counts == [high, low]


def test_flops_are_counted_over_both_experts(tiny):
    from ltxbench.bench import flops

    high, low = _expected_calls(tiny)
    _, calls = flops.per_call([tiny.transformer, tiny.transformer_2], lambda: wan_run.run_once(tiny, _settings()))
    assert len(calls) == high + low and min(calls) > 0
    _, first_only = flops.per_call(tiny.transformer, lambda: wan_run.run_once(tiny, _settings()))
    assert len(first_only) == high


def test_one_report_patches_both_experts_and_reverts_both(tiny):
    from ltxbench.inject.wan import BLOCK_RULE, GELU_RULE, GENERATION_RULE, QK_NORM_RULE, QK_ROPE_RULE, apply_kernels
    from ltxbench.inject.wan.pair import PAIR_RULE

    experts = [tiny.transformer, tiny.transformer_2]
    modules = [list(expert.modules()) for expert in experts]
    classes = [[type(m) for m in mods] for mods in modules]
    report = apply_kernels(tiny, "reference")
    # 2 blocks in each expert; the guidance pair on each expert
    assert dict(report.rules) == {BLOCK_RULE: 4, QK_ROPE_RULE: 4, QK_NORM_RULE: 8, GELU_RULE: 4,
                                  PAIR_RULE: 2, GENERATION_RULE: 1}
    for expert, before in zip(experts, classes, strict=True):
        assert any(type(m) is not cls for m, cls in zip(expert.modules(), before, strict=True))
    report.revert()
    assert [tiny.transformer, tiny.transformer_2] == experts
    for expert, mods, before in zip(experts, modules, classes, strict=True):
        after = list(expert.modules())
        assert all(a is b for a, b in zip(after, mods, strict=True)) and len(after) == len(mods)
        assert [type(m) for m in after] == before


@pytest.mark.parametrize("scope", ["model", "regional"])
def test_bench_e2e_compiles_both_experts_and_undoes_both(scope, tmp_path, captured, compile_calls, tiny):
    from ltxbench.bench import flops

    out = tmp_path / "e2e.json"
    result = runner.invoke(app, [*E2E, "--configs", "baseline,compile", "--phase", "transformer",
                                 "--compile-scope", scope, "--output", str(out)])
    assert result.exit_code == 0, result.output
    pipe = captured["target"]
    assert compile_calls == [(pipe.transformer, "default"), (pipe.transformer_2, "default")]
    assert compile_calls.scopes == [scope, scope]
    assert pipe.transformer._compiled_call_impl is None and pipe.transformer_2._compiled_call_impl is None
    records = json.loads(out.read_text())["records"]
    step = next(r for r in records if r["provider"] == "baseline" and r["name"] == "denoise_step")
    _, calls = flops.per_call([tiny.transformer, tiny.transformer_2], lambda: wan_run.run_once(tiny, _settings()))
    # every step's two guided calls counted, whichever expert made them (the experts' calls cost the same)
    assert step["derived"]["model_tflop"] * 1e12 == pytest.approx(sum(calls) / STEPS, rel=1e-9)


def test_optimized_patches_both_experts_in_one_report(tmp_path):
    from ltxbench.inject.wan import BLOCK_RULE, GELU_RULE, GENERATION_RULE, QK_NORM_RULE, QK_ROPE_RULE
    from ltxbench.inject.wan.pair import PAIR_RULE

    out = tmp_path / "o.json"
    result = runner.invoke(app, [*E2E, "--configs", "optimized", "--phase", "transformer", "--output", str(out)])
    assert result.exit_code == 0, result.output
    injection = json.loads(out.read_text())["run"]["config"]["injection"]["optimized"]
    assert injection["rules"] == {BLOCK_RULE: 4, QK_ROPE_RULE: 4, QK_NORM_RULE: 8, GELU_RULE: 4, PAIR_RULE: 2,
                                  GENERATION_RULE: 1}
    assert injection["skipped"] == []
