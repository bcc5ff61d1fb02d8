"""--memory-budget on the command line: refused in one line (exit 2) where it cannot apply, before torch loads; and
on the CPU (the device check and the plan forced, the streamers then load synchronously) the commands print the
plan, build the pipeline on the host, place it, run every configuration with the blocks streamed, and record the
budget and the plan."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.configurations import MEMORY_BUDGET
from ltxbench.memory.plan import GIB, MemoryPlan, Streaming
from tests.helpers import BENCH_E2E_LTX_TINY, LTX_TINY

runner = CliRunner()
LTX2_TINY = ["bench", "e2e", "--model", "ltx2-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9",
             "--height", "64", "--width", "64", "--steps", "2", "--warmup-iterations", "1", "--repeats", "1",
             "--kernel-provider", "reference"]


@pytest.mark.parametrize(("args", "needle"), [
    (["bench", "e2e", "--model", "llama-tiny", "--weights", "random"], "LTX-2 and Wan models"),
    (BENCH_E2E_LTX_TINY, "--memory-budget 8 needs --device cuda"),
    (["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", "--gpus", "2"], "runs on one GPU"),
    (["profile", "--model", "ltx-tiny", "--weights", "random", "--compile-mode", "reduce-overhead"],
     "(CUDA graphs) is not supported"),
    (["generate", "--prompt", "x", "--model", "ltx-tiny", "--weights", "random", "--cpu-offload"],
     "and --cpu-offload both place the weights"),
])
def test_refused_in_one_line_where_it_cannot_apply(args, needle, tmp_path):
    result = runner.invoke(app, [*args, "--memory-budget", "8", "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split())


@pytest.mark.parametrize(("value", "needle"), [("1", "below the minimum of 2"), ("5000", "above the maximum of 4096")])
def test_its_bounds(value, needle, tmp_path):
    result = runner.invoke(app, [*BENCH_E2E_LTX_TINY, "--memory-budget", value, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and needle in result.output, result.output


@pytest.fixture
def on_the_cpu(monkeypatch):
    """The device check passed on the CPU, and a plan that streams every block of both stacks through 2 slots."""
    from ltxbench.cli import _validate
    from ltxbench.memory import plan as planner

    check = _validate.memory_budget
    monkeypatch.setattr(_validate, "memory_budget", lambda family, settings, cpu_offload=False: check(
        family, dataclasses.replace(settings, device="cuda"), cpu_offload))

    def all_streamed(budget_gib, need, host_free=None):
        def stack(s):
            return Streaming(s.component, s.blocks, s.block_bytes, tuple(range(s.blocks)), 2)

        return MemoryPlan(int(budget_gib * GIB), stack(need.transformer), stack(need.text_encoder), need.others, 0, 0,
                          False, (("encode", 0), ("denoise", need.denoise_bytes), ("decode", 0)), 0, phased=True,
                          experts=need.experts)

    monkeypatch.setattr(planner, "plan_memory", all_streamed)  # cli._memory.plan_for reads it at each call


def test_bench_e2e_streams_every_configuration_and_records_the_budget(on_the_cpu, captured, tmp_path):
    from ltxbench.inject import streamer_of
    from ltxbench.memory.apply import placement_of

    out = tmp_path / "e2e.json"
    result = runner.invoke(app, [*LTX2_TINY, "--configs", "baseline,optimized", "--memory-budget", "6",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "memory plan: budget 6.00 GiB" in result.output and "2 streamed" in result.output
    doc = json.loads(out.read_text())
    memory = doc["run"]["config"]["memory"]
    assert memory["budget_gib"] == 6 and memory["transformer"]["streamed"] == [0, 1]
    assert memory["enforced"] is None  # the CPU has no allocator to cap
    assert memory["random_weights_drawn_on"] == "host"  # from the seed, the host's generator: other numbers
    assert memory["phased"] and set(memory["moved"]) >= {"transformer", "text_encoder", "vae", "connectors"}
    assert "  denoise: transformer" in result.output
    assert doc["run"]["config"][MEMORY_BUDGET] == 6.0 and "--memory-budget" in doc["run"]["argv"]
    assert {r["params"][MEMORY_BUDGET] for r in doc["records"]} == {6.0}
    assert doc["run"]["config"]["injection"]["optimized"]["applied"] is True
    pipe = captured["target"]
    placement = placement_of(pipe)
    assert placement is not None and len(placement.streamers) == 2  # installed again after the optimized revert
    assert set(placement.movers) == {"transformer", "text_encoder", "connectors", "vae", "audio_vae", "vocoder"}
    # installed again after the revert: every component on the host until its phase begins
    assert placement.phase is None and not any(m.on_device for m in placement.movers.values())
    assert streamer_of(pipe.transformer.transformer_blocks) is placement.streamers[0]
    assert streamer_of(pipe.text_encoder.model.language_model.layers) is placement.streamers[1]
    blocks = pipe.transformer.transformer_blocks
    assert all("forward" not in vars(block) for block in blocks)  # the injection reverted


def test_ltx_video_keeps_its_step_work_under_a_placement(on_the_cpu, monkeypatch, tmp_path):
    """The placement's pre-hook on the transformer only brings weights to the GPU: the patched step still builds its
    inputs itself (attn2's keys and values from the generation's cache, the guidance halves paired), running that
    hook first, instead of handing the call to the unpatched path as for a hook it does not know. The plan: phases,
    the transformer's blocks resident in its phase (as LTX-Video 2B at 8 GiB)."""
    from ltxbench.inject.ltx import step
    from ltxbench.memory import plan as planner

    def resident_blocks(budget_gib, need, host_free=None):
        transformer, text = need.transformer, need.text_encoder
        return MemoryPlan(int(budget_gib * GIB), Streaming("transformer", transformer.blocks, transformer.block_bytes,
                                                           (), 2),
                          Streaming(text.component, text.blocks, text.block_bytes, tuple(range(text.blocks)), 2),
                          need.others, 0, 0, False, (("encode", 0), ("denoise", need.denoise_bytes), ("decode", 0)),
                          0, phased=True, experts=need.experts)

    monkeypatch.setattr(planner, "plan_memory", resident_blocks)

    built, original = [], step.step_inputs

    def spied(*args, **kwargs):
        built.append((kwargs.get("prompt_entry") is not None, kwargs.get("paired")))
        return original(*args, **kwargs)

    monkeypatch.setattr(step, "step_inputs", spied)
    out = tmp_path / "ltx.json"
    result = runner.invoke(app, [*BENCH_E2E_LTX_TINY, "--configs", "optimized", "--memory-budget", "4",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["run"]["config"]["memory"]["phased"]
    assert built and all(cached for cached, _ in built) and any(paired for _, paired in built)


def test_generate_streams_and_records_the_plan(on_the_cpu, tmp_path):
    from ltxbench.results.io import load_result

    out = tmp_path / "x.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox", *LTX_TINY, "--memory-budget", "3",
                                 "--precision", "fp8", "--kernel-provider", "reference", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = load_result(out.with_suffix(".json"))
    assert doc["run"]["config"]["memory"]["text_encoder"]["streamed"] == [0, 1]
    assert {r["params"][MEMORY_BUDGET] for r in doc["records"]} == {3.0}
    assert doc["injection"]["applied"] is True and any(r.startswith("fp8: weights stored")
                                                       for r in doc["injection"]["rules"])


def test_bench_e2e_measures_diffusers_offloading_beside_ours_at_the_budget(on_the_cpu, captured, tmp_path):
    from ltxbench.inject import streamer_of
    from ltxbench.memory.apply import placement_of

    out = tmp_path / "e2e.json"
    result = runner.invoke(app, [*LTX2_TINY, "--configs", "baseline,group-offload,model-offload", "--memory-budget",
                                 "6", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert {r["provider"] for r in doc["records"]} == {"baseline", "group-offload", "model-offload"}
    injection = doc["run"]["config"]["injection"]
    assert injection["group-offload"]["rules"] == {"group-offload": 1}
    assert injection["model-offload"]["provider"] == "diffusers"
    pipe = captured["target"]
    placement = placement_of(pipe)  # installed again after each peer's revert
    assert len(placement.streamers) == 2 and streamer_of(pipe.transformer.transformer_blocks) is not None
    assert not any("_hf_hook" in vars(m) for m in pipe.transformer.modules())


@pytest.mark.parametrize(("failing", "exit_code"), [("model-offload", 0), ("baseline", 4)])
def test_a_configuration_out_of_memory_is_written_as_not_fitting(failing, exit_code, on_the_cpu, monkeypatch,
                                                                 tmp_path):
    """A peer that runs out of memory is a finding (exit 0); ours or the unpatched model not fitting fails the run
    (exit 4), with the result written either way."""
    import torch

    from ltxbench.bench import e2e
    from ltxbench.results.schema import out_of_memory_label

    iterate = e2e._iterate

    def runs_out(name, *args):
        if name == failing:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return iterate(name, *args)

    monkeypatch.setattr(e2e, "_iterate", runs_out)
    out = tmp_path / "e2e.json"
    result = runner.invoke(app, [*LTX2_TINY, "--configs", "baseline,model-offload", "--memory-budget", "6",
                                 "--output", str(out)])
    assert result.exit_code == exit_code, result.output
    assert f"{failing}: out of memory at 6 GiB (recorded as not fitting; going on)" in result.output
    records = json.loads(out.read_text())["records"]
    failed = [r for r in records if r["provider"] == failing]
    assert [out_of_memory_label(r) for r in failed] == ["out of memory at 6 GiB"]
    assert any(r["provider"] != failing and r["stats"]["median"] is not None for r in records)


@pytest.mark.parametrize(("weights", "device", "free", "on_gpu"), [
    ("random", "cuda", 40 * GIB, True),       # fits: seeded on the GPU, then moved to the host
    ("random", "cuda", 21 * GIB, False),      # the pipeline and the margin do not fit beside what is in use
    ("random", "cuda", None, False),          # free memory unknown
    ("pretrained", "cuda", 40 * GIB, False),  # real weights load on the host
    ("random", "cpu", 40 * GIB, False),
])
def test_random_weights_are_made_on_the_gpu_where_the_whole_pipeline_fits(weights, device, free, on_gpu, monkeypatch):
    from types import SimpleNamespace

    from ltxbench.cli import _memory
    from ltxbench.memory import fit

    monkeypatch.setattr(fit, "available", lambda _device: (free, ""))
    settings = SimpleNamespace(weights=weights, device=device)
    plan = SimpleNamespace(built_bytes=20 * GIB)
    assert _memory._random_on_the_gpu(settings, plan) is on_gpu


@pytest.mark.parametrize(("free_gib", "offered"), [(30.6, "--memory-budget 29 "), (2.5, None)])
def test_the_out_of_memory_hint_offers_only_a_budget_the_cli_takes(free_gib, offered, monkeypatch):
    from ltxbench.errors import EnvironmentProblem
    from ltxbench.memory import fit

    monkeypatch.setattr(fit, "available", lambda _device: (free_gib * GIB, "the GPU has little free"))
    with pytest.raises(EnvironmentProblem) as refused:
        fit.ensure_fits(40 * GIB, "cuda", "ltx2-19b", torch.bfloat16, budgeted=True)
    assert refused.value.exit_code == 4
    assert (offered in refused.value.hint) if offered else "--memory-budget" not in refused.value.hint


def test_a_budget_above_the_gpus_memory_is_refused_before_anything_is_built(monkeypatch):
    from types import SimpleNamespace

    from ltxbench.cli import _memory
    from ltxbench.errors import EnvironmentProblem
    from ltxbench.memory import fit

    monkeypatch.setattr(fit, "gpu_memory", lambda _device: int(47.5 * GIB))
    built = []
    with pytest.raises(EnvironmentProblem, match="--memory-budget 60 is more than this GPU's 47.5 GiB") as refused:
        _memory.plan_for(SimpleNamespace(memory_budget_gib=60.0, device="cuda"), lambda: built.append(1))
    assert refused.value.exit_code == 4 and "at most 47" in refused.value.hint and not built


WAN_TINY = ["bench", "e2e", "--model", "wan-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9",
            "--height", "64", "--width", "64", "--steps", "2", "--warmup-iterations", "1", "--repeats", "1",
            "--kernel-provider", "reference"]


def test_wan_streams_its_blocks_and_text_layers_and_gives_the_resident_latents(on_the_cpu, captured, tmp_path):
    """Wan under a budget: its blocks and UMT5's layers stream (every one, through 2 slots), each component comes
    in its phase, and the streamed generation's latents are the resident ones, unpatched and with our rules."""
    from ltxbench.memory.apply import placement_of
    from ltxbench.models import family_of, wan_run

    out = tmp_path / "wan.json"
    result = runner.invoke(app, [*WAN_TINY, "--configs", "baseline,optimized", "--memory-budget", "6",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    memory = doc["run"]["config"]["memory"]
    assert memory["transformer"]["streamed"] == [0, 1] and memory["text_encoder"]["streamed"] == [0, 1]
    assert {r["params"][MEMORY_BUDGET] for r in doc["records"]} == {6.0}
    pipe = captured["target"]
    placement = placement_of(pipe)
    assert placement is not None and set(placement.movers) == {"transformer", "text_encoder", "vae"}
    family = family_of("wan-tiny")
    settings = family.settings("bench e2e", model="wan-tiny", weights="random", device="cpu", num_frames=9,
                               height=64, width=64, steps=2, kernel_provider="reference", dtype="fp32")
    resident = family.build(settings)
    for name in ("transformer", "text_encoder", "vae"):  # the same seeded weights, built again on the CPU
        getattr(resident, name).load_state_dict(getattr(pipe, name).state_dict())
    with torch.no_grad():
        embeds = wan_run.encode(resident, settings, "cpu")
        placed_embeds = wan_run.encode(pipe, settings, "cpu")
        latents = [wan_run.denoise(p, e, settings, torch.Generator().manual_seed(0), None)
                   for p, e in ((resident, embeds), (pipe, placed_embeds))]
    assert torch.equal(placed_embeds[0], embeds[0]) and torch.equal(latents[1], latents[0])


def test_wan_a14b_plans_both_experts_one_on_the_gpu_at_a_time(on_the_cpu, captured, tmp_path):
    """Wan 2.2 A14B under a budget: both experts planned as the transformer (their blocks streamed alike), each on
    the GPU only during its own steps (the high-noise expert leaves when the low-noise one is first called), and the
    generation's latents are the resident pipeline's."""
    from ltxbench.memory.apply import placement_of
    from ltxbench.models import family_of, wan_run

    args = [a if a != "wan-tiny" else "wan-tiny-a14b" for a in WAN_TINY]
    out = tmp_path / "a14b.json"
    result = runner.invoke(app, [*args, "--steps", "4", "--configs", "baseline,optimized", "--memory-budget", "6",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "transformer blocks (each of 2 experts, one at a time)" in " ".join(result.output.split())
    memory = json.loads(out.read_text())["run"]["config"]["memory"]
    assert memory["experts"] == 2 and {"transformer", "transformer_2"} <= set(memory["moved"])
    pipe = captured["target"]
    placement = placement_of(pipe)
    assert set(placement.movers) == {"transformer", "transformer_2", "text_encoder", "vae"}
    assert len(placement.streamers) == 3
    on_gpu = []

    def seen(_module, _args):
        on_gpu.append(tuple(name for name in ("transformer", "transformer_2")
                            if placement.movers[name].on_device))

    handles = [getattr(pipe, name).register_forward_pre_hook(seen) for name in ("transformer", "transformer_2")]
    family = family_of("wan-tiny-a14b")
    settings = family.settings("bench e2e", model="wan-tiny-a14b", weights="random", device="cpu", num_frames=9,
                               height=64, width=64, steps=4, kernel_provider="reference", dtype="fp32")
    resident = family.build(settings)
    for name in ("transformer", "transformer_2", "text_encoder", "vae"):
        getattr(resident, name).load_state_dict(getattr(pipe, name).state_dict())
    try:
        with torch.no_grad():
            embeds = wan_run.encode(resident, settings, "cpu")
            latents = [wan_run.denoise(p, embeds, settings, torch.Generator().manual_seed(0), None)
                       for p in (resident, pipe)]
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(latents[1], latents[0])
    # the pre-hooks run after the phase hook: each call finds its own expert, and only it, on the device
    assert set(on_gpu) == {("transformer",), ("transformer_2",)}
    assert on_gpu.index(("transformer_2",)) > 0 and ("transformer",) not in on_gpu[on_gpu.index(("transformer_2",)):]



def test_wan_i2v_under_a_budget_encodes_the_image_in_the_encode_phase(on_the_cpu, captured, tmp_path):
    """Wan 2.1 I2V under a budget: CLIP's vision tower is held in the encode phase (its call brings it), the blocks
    stream, and the image-to-video latents are the resident pipeline's."""
    from PIL import Image

    from ltxbench.memory.apply import placement_of
    from ltxbench.models import family_of, wan_run

    image = tmp_path / "first.png"
    Image.new("RGB", (64, 64), "red").save(image)
    args = [a if a != "wan-tiny" else "wan-tiny-i2v" for a in WAN_TINY]
    result = runner.invoke(app, [*args, "--image", str(image), "--configs", "baseline", "--memory-budget", "6",
                                 "--output", str(tmp_path / "i2v.json")])
    assert result.exit_code == 0, result.output
    pipe = captured["target"]
    placement = placement_of(pipe)
    assert placement.phase_of("image_encoder") == "encode" and "image_encoder" in placement.movers
    family = family_of("wan-tiny-i2v")
    settings = family.settings("bench e2e", model="wan-tiny-i2v", weights="random", device="cpu", num_frames=9,
                               height=64, width=64, steps=2, kernel_provider="reference", dtype="fp32",
                               image=str(image))
    resident = family.build(settings)
    for name in ("transformer", "text_encoder", "vae", "image_encoder"):
        getattr(resident, name).load_state_dict(getattr(pipe, name).state_dict())
    frame = Image.open(image)
    with torch.no_grad():
        embeds = wan_run.encode(resident, settings, "cpu")
        latents = [wan_run.denoise(p, embeds, settings, torch.Generator().manual_seed(0), None, frame)
                   for p in (resident, pipe)]
    assert torch.equal(latents[1], latents[0])
    assert not placement.movers["image_encoder"].on_device  # the denoise sent it back to the host


@pytest.mark.parametrize(("free_gib", "device", "gpus", "fitted"), [
    (47.9, "cuda", 1, True),     # LTX-2 19B whole (~74 GiB, estimated) does not fit: planned to 47.75 GiB
    (80, "cuda", 1, False),      # it fits: placed as before, nothing planned
    (47.9, "cpu", 1, False),     # not a GPU run
    (47.9, "cuda", 2, False),    # several GPUs: each rank holds its own whole pipeline
])
def test_generate_plans_the_gpus_free_memory_where_the_whole_pipeline_does_not_fit(free_gib, device, gpus, fitted,
                                                                                    monkeypatch):
    from ltxbench.cli import _memory
    from ltxbench.errors import EnvironmentProblem
    from ltxbench.memory import fit
    from ltxbench.models import family_of

    monkeypatch.setattr(fit, "available", lambda dev: (int(free_gib * GIB), f"the GPU has {free_gib} GiB free"))
    family = family_of("ltx2-19b")  # sized on the meta device
    settings = family.settings("generate", model="ltx2-19b", weights="random", device=device, gpus=gpus,
                               num_frames=121, height=512, width=768, steps=8)
    got = _memory.fitted_budget(family, settings)
    assert (got is not None) == fitted
    if fitted:
        budget, needed, where = got
        assert budget == 47.75 and 70 < needed < 80 and where == "the GPU has 47.9 GiB free"
    monkeypatch.setattr(fit, "available", lambda dev: (GIB, "the GPU has 1.0 GiB free"))
    if fitted:  # under the 2 GiB a planned run takes: exit 4, one line
        with pytest.raises(EnvironmentProblem, match="ltx2-19b needs about .* GiB of GPU memory at once and the GPU "
                                                     "has 1.0 GiB free, under the 2 GiB a planned run needs"):
            _memory.fitted_budget(family, settings)
    llm = family_of("llama-tiny")
    assert _memory.fitted_budget(llm, llm.settings("generate", model="llama-tiny", weights="random",
                                                   device="cuda")) is None


def test_generate_runs_the_plan_of_the_free_memory_and_says_so(on_the_cpu, monkeypatch, tmp_path):
    from ltxbench.cli import _memory
    from ltxbench.results.io import load_result

    fitted = (3.0, 5.25, "the GPU has 3.1 GiB free")
    monkeypatch.setattr(_memory, "fitted_budget", lambda family, settings, footprint=None: fitted)
    out = tmp_path / "x.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox", *LTX_TINY, "--kernel-provider", "reference",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("the whole pipeline needs about 5.2 GiB of GPU memory at once and the GPU has 3.1 GiB free: planned to "
            "3 GiB (--memory-budget chooses)") in text and "memory plan: budget 3.00 GiB" in text
    doc = load_result(out.with_suffix(".json"))
    assert doc["run"]["config"]["memory"]["budget_from"].startswith("the GPU's free memory")
    assert {r["params"][MEMORY_BUDGET] for r in doc["records"]} == {3.0}


def test_a_planned_generate_sizes_the_pipeline_once(monkeypatch):
    """The free-memory plan and the plan itself read one footprint: the meta build of the components runs once."""
    from ltxbench.cli import _memory
    from ltxbench.memory import fit
    from ltxbench.models import family_of

    monkeypatch.setattr(fit, "available", lambda dev: (int((512 if dev == "cpu" else 47.9) * GIB), "free"))
    built = []
    footprint = _memory._footprint
    monkeypatch.setattr(_memory, "_footprint", lambda *a: built.append(1) or footprint(*a))
    family = family_of("ltx2-19b")
    settings = family.settings("generate", model="ltx2-19b", weights="random", device="cuda", num_frames=121,
                               height=512, width=768, steps=8)
    plan = _memory.planned(family, settings, lambda line: None, fit_free=True)
    assert plan is not None and settings.memory_budget_gib == 47.75 and built == [1]
