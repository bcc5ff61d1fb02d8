"""The memory planner (ltxbench.memory.plan, sizes): streamed blocks spread between resident ones, as many blocks
resident as the budget holds and not one more, the text encoder's layers after the transformer's blocks, VAE tiling
only where an untiled decode does not fit, one-line refusals (exit 4) where the budget or the host cannot hold the
run, and the sizes counted on the meta device (FP8 blocks smaller)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ltxbench.errors import EnvironmentProblem
from ltxbench.memory.plan import (
    ALLOWANCE,
    GIB,
    Footprint,
    Stack,
    activation_bytes,
    plan_memory,
    spread,
    streamed_blocks,
)

MIB = 2**20
NEED = Footprint(transformer=Stack("transformer", 48, 720 * MIB, 640 * MIB),
                 text_encoder=Stack("text_encoder", 48, 400 * MIB, 2048 * MIB),
                 others=(("connectors", 2700 * MIB), ("vae", 2300 * MIB)), built_bytes=60 * GIB,
                 denoise_bytes=1700 * MIB, encode_bytes=900 * MIB, decode_bytes=9 * GIB, decode_tiled_bytes=500 * MIB)


def _denoise_peak(need: Footprint, resident: int) -> int:
    tr = need.transformer
    slots = 2 if resident < tr.blocks else 0
    return ALLOWANCE + tr.outside_bytes + (resident + slots) * tr.block_bytes + need.denoise_bytes


def _encode_peak(need: Footprint, resident: int, beside: int = 0) -> int:
    te = need.text_encoder
    return (ALLOWANCE + te.outside_bytes + 2700 * MIB + (resident + (2 if resident < te.blocks else 0)) * te.block_bytes
            + need.encode_bytes + beside)


def test_spread_puts_streamed_blocks_between_resident_ones():
    assert spread(8, 4) == (1, 3, 5, 7) and spread(48, 0) == ()
    streamed = streamed_blocks(48, 30)
    assert len(streamed) == 18 and not any(b - a == 1 for a, b in zip(streamed, streamed[1:], strict=False))
    many = streamed_blocks(48, 12)  # more streamed than resident: the resident ones spread, runs of 3 at most
    assert len(many) == 36 and len(set(spread(48, 12)) & set(many)) == 0
    runs = "".join("s" if i in many else "r" for i in range(48)).split("r")
    assert max(map(len, runs)) <= 3


@pytest.mark.parametrize("budget", [13, 16, 24, 40])
def test_the_denoise_phase_alone_sizes_the_transformer_and_not_one_block_more(budget):
    plan = plan_memory(budget, NEED, host_free=None)
    tr, te = plan.transformer, plan.text_encoder
    assert plan.phased and plan.phase_bytes("denoise") == _denoise_peak(NEED, tr.resident) <= budget * GIB
    assert tr.resident == tr.blocks or _denoise_peak(NEED, tr.resident + 1) > budget * GIB
    held = NEED.transformer.outside_bytes + tr.gpu_bytes
    # the encode: the text encoder (and the connectors) alone, or beside the transformer where all of it fits there
    beside = held if "encode" in plan.transformer_stays else 0
    assert plan.phase_bytes("encode") == _encode_peak(NEED, te.resident, beside) <= budget * GIB
    assert te.resident == te.blocks or _encode_peak(NEED, te.resident + 1, beside) > budget * GIB
    assert ("encode" in plan.transformer_stays) == (_encode_peak(NEED, te.blocks, held) <= budget * GIB)
    # the decode: the VAE alone (untiled: 9 GiB fits from 13 GiB), beside the transformer where it fits
    decode = ALLOWANCE + 2300 * MIB + NEED.decode_bytes
    assert not plan.vae_tiling and plan.phase_bytes("decode") == decode + (held if "decode" in
                                                                            plan.transformer_stays else 0)
    assert ("decode" in plan.transformer_stays) == (decode + held <= budget * GIB)
    assert plan.gpu_bytes == max(plan.phase_bytes(p) for p in ("encode", "denoise", "decode")) <= budget * GIB
    assert len(tr.streamed) == tr.blocks - tr.resident
    moved = {"connectors": 2700 * MIB, "vae": 2300 * MIB, "text_encoder": 2048 * MIB + te.resident * 400 * MIB,
             "transformer": 640 * MIB + tr.resident * 720 * MIB}
    assert plan.host_bytes == tr.host_bytes + te.host_bytes + sum(moved[name] for name in plan.moved)
    assert plan.lines()[0].startswith(f"memory plan: budget {budget:.2f} GiB")
    assert any(line.startswith("  denoise: transformer") for line in plan.lines())


def test_phases_free_the_denoise_of_the_other_components():
    """At 24 GiB the denoise phase holds the transformer's blocks beside only its activations, the transformer outside
    its blocks, 2 slots and the allowance (CUDA context 1 GiB, allocator 0.75 GiB)."""
    plan = plan_memory(24, NEED)
    assert ALLOWANCE == 1792 * MIB
    assert plan.transformer.resident == (24 * GIB - 1792 * MIB - 640 * MIB - 1700 * MIB) // (720 * MIB) - 2 == 26
    assert plan.weights_bytes("denoise") == 640 * MIB + 28 * 720 * MIB and plan.transformer_stays == ()
    assert set(plan.moved) == {"transformer", "text_encoder", "connectors", "vae"}


def test_a_large_budget_is_static_and_decodes_untiled():
    plan = plan_memory(80, NEED)
    assert not plan.phased and plan.moved == () and not plan.vae_tiling
    assert plan.transformer.streamed == plan.text_encoder.streamed == () and plan.host_bytes == 0
    assert plan.gpu_bytes == plan.phase_bytes("decode") == plan.phase_bytes("encode") + NEED.decode_bytes - \
        NEED.encode_bytes
    assert "transformer blocks: all 48 on the GPU" in "\n".join(plan.lines())


def test_the_vae_decodes_in_tiles_only_where_its_phase_cannot_hold_it_untiled():
    big = dataclasses.replace(NEED, decode_bytes=15 * GIB)  # 1 + 2.25 + 15 GiB: over 16
    assert plan_memory(16, big).vae_tiling and not plan_memory(16, NEED).vae_tiling
    assert dict(plan_memory(16, big).activations)["decode"] == NEED.decode_tiled_bytes


def test_budgets_that_cannot_hold_a_phase_are_refused_in_one_line():
    smallest = _denoise_peak(NEED, 0)
    with pytest.raises(EnvironmentProblem) as refused:
        plan_memory((smallest - 1) / GIB, NEED)
    assert refused.value.exit_code == 4 and "\n" not in refused.value.message
    assert "the denoise phase" in refused.value.message and f"at least {smallest / GIB:.2f} GiB" in \
        refused.value.message
    encode = dataclasses.replace(NEED, encode_bytes=8 * GIB)
    with pytest.raises(EnvironmentProblem, match="cannot hold the encode phase"):
        plan_memory(13, encode)
    assert plan_memory(_encode_peak(encode, 0) / GIB, encode).text_encoder.resident == 0
    with pytest.raises(EnvironmentProblem, match="the host has 40.00 GiB available"):
        plan_memory(24, NEED, host_free=40 * GIB)
    assert plan_memory(24, NEED, host_free=90 * GIB).budget_bytes == 24 * GIB


def test_the_plan_is_frozen_and_recorded():
    plan = plan_memory(24, NEED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.vae_tiling = False
    recorded = plan.as_dict()
    assert recorded["budget_gib"] == 24 and recorded["transformer"]["streamed"] == list(plan.transformer.streamed)
    assert recorded["planned_peak_bytes"] == plan.gpu_bytes


def test_activation_estimate_scales_with_tokens_width_and_samples():
    one = activation_bytes(6144, 4096, 1)
    assert activation_bytes(6144, 4096, 2) == 2 * one == activation_bytes(12288, 4096, 1)
    assert activation_bytes(6144, 2048, 1) == one // 2
    assert activation_bytes(10, 4, 1, vocab=100) == activation_bytes(10, 4, 1) + 10 * 100 * 2


def test_sizes_counted_on_the_meta_device():
    """LTX-2's released configs: 48 blocks and Gemma's 48 layers, its image tower left out, FP8 blocks smaller by
    their projections' bytes; the 19B plan at 24 and 16 GiB stays within each."""
    from ltxbench.memory.fit import module_bytes
    from ltxbench.memory.sizes import footprint, stack_of
    from ltxbench.models import family_of, ltx2_build
    from ltxbench.models.ltx2 import LTX2Settings

    family = family_of("ltx2-19b")
    parts = ltx2_build.build_components(ltx2_build.component_configs("ltx2-19b"), "meta", torch.bfloat16)
    settings = LTX2Settings(model="ltx2-19b", weights="random", family="ltx2")
    need = footprint(family, settings, parts)
    tr, te = need.transformer, need.text_encoder
    assert (tr.blocks, te.blocks) == (48, 48)
    blocks = parts["transformer"].transformer_blocks
    assert tr.block_bytes == module_bytes(blocks[0]) and tr.outside_bytes == module_bytes(
        parts["transformer"]) - 48 * module_bytes(blocks[0])
    tower = module_bytes(parts["text_encoder"].model.vision_tower, parts["text_encoder"].model.multi_modal_projector)
    assert te.outside_bytes + 48 * te.block_bytes + tower == module_bytes(parts["text_encoder"])
    assert {name for name, _ in need.others} == {"connectors", "vae", "audio_vae", "vocoder"}
    assert need.built_bytes == module_bytes(*(p for p in parts.values() if hasattr(p, "parameters")))
    fp8 = stack_of("transformer", parts["transformer"], "transformer_blocks", fp8=True)
    linears = [m for m in blocks[0].modules() if type(m) is torch.nn.Linear]
    assert fp8.block_bytes == tr.block_bytes - sum(m.weight.numel() - 4 * m.out_features for m in linears)
    assert fp8.block_bytes < 0.55 * tr.block_bytes
    plans = [plan_memory(budget, need) for budget in (24, 16)]
    assert all(p.gpu_bytes <= p.budget_bytes for p in plans)
    assert len(plans[1].transformer.streamed) > len(plans[0].transformer.streamed) > 0
    # the denoise: one call's activations, the text keys/values our kernels keep for the generation (attn2 4096 and
    # audio_attn2 2048 wide, keys and values, 1024 prompt tokens, the guidance pair and the positive half) and the
    # prompt embeddings the pipeline keeps (Gemma's 49 hidden states, 3840 wide: the pair and the negative's own)
    prompt = 49 * 1024 * 3840 * 2
    assert need.denoise_bytes == (activation_bytes(6144, 4096, 2) + 48 * 2 * (4096 + 2048) * 1024 * 3 * 2
                                  + 3 * prompt)
    assert need.encode_bytes == activation_bytes(1024, 3840, 1, vocab=262208) + 3 * prompt
    assert plans[0].transformer.resident == 19  # 121 x 512 x 768, guided: the denoise phase alone


@pytest.mark.parametrize(("precision", "configs", "fp8_blocks", "fp8_copies"), [
    ("bf16", ["baseline", "optimized"], False, False),
    ("fp8", ["baseline", "optimized", "optimized-fp8"], False, True),  # the bf16 ones run under the plan too
    ("bf16", ["baseline", "optimized-fp8"], False, True),
    ("bf16", ["optimized-fp8", "optimized-fp8+compile"], True, True),
    ("fp8", None, True, True),  # generate: --precision's configuration alone
])
def test_the_plan_holds_fp8_blocks_only_where_every_configuration_runs_them(precision, configs, fp8_blocks,
                                                                           fp8_copies):
    """bench e2e under --memory-budget runs every configuration under one plan: its blocks are sized for bf16 where
    any configuration runs bf16 blocks (an FP8-sized plan put the bf16 ones past the budget), and the host holds
    the FP8 copies beside the bf16 weights where any configuration makes them."""
    from ltxbench.memory.fit import module_bytes
    from ltxbench.memory.sizes import footprint, stack_of
    from ltxbench.models import family_of, ltx2_build
    from ltxbench.models.ltx2 import LTX2Settings

    parts = ltx2_build.build_components(ltx2_build.component_configs("ltx2-19b"), "meta", torch.bfloat16)
    settings = LTX2Settings(model="ltx2-19b", weights="random", family="ltx2", precision=precision, configs=configs)
    need = footprint(family_of("ltx2-19b"), settings, parts)
    blocks = parts["transformer"].transformer_blocks
    fp8 = stack_of("transformer", parts["transformer"], "transformer_blocks", fp8=True).block_bytes
    assert need.transformer.block_bytes == (fp8 if fp8_blocks else module_bytes(blocks[0]))
    built = module_bytes(*(p for p in parts.values() if hasattr(p, "parameters")))
    assert need.built_bytes == built and need.fp8_copy_bytes == (48 * fp8 if fp8_copies else 0)


def test_fp8_random_weights_are_drawn_on_the_gpu_by_the_bf16_build_alone(monkeypatch):
    """The FP8 copies are made on the host after the build: whether random weights are drawn on the GPU depends on
    the bf16 pipeline alone. LTX-2 19B with FP8 on an 80 GB GPU: its bf16 build fits, the build and the copies would
    not; counting the copies drew 31 B parameters on one host core (minutes) instead of on the GPU (seconds)."""
    from types import SimpleNamespace

    from ltxbench.cli import _memory
    from ltxbench.memory import fit
    from ltxbench.memory.sizes import footprint
    from ltxbench.models import family_of, ltx2_build
    from ltxbench.models.ltx2 import LTX2Settings

    parts = ltx2_build.build_components(ltx2_build.component_configs("ltx2-19b"), "meta", torch.bfloat16)
    settings = LTX2Settings(model="ltx2-19b", weights="random", family="ltx2", precision="fp8", configs=None)
    need = footprint(family_of("ltx2-19b"), settings, parts)
    plan = plan_memory(24, need)
    assert plan.built_bytes == need.built_bytes
    free = need.built_bytes + _memory.BUILD_MARGIN + GIB  # a GPU the bf16 build fits, not the build and the copies
    assert need.built_bytes + need.fp8_copy_bytes + _memory.BUILD_MARGIN > free
    monkeypatch.setattr(fit, "available", lambda _device: (free, ""))
    assert _memory._random_on_the_gpu(SimpleNamespace(weights="random", device="cuda"), plan)
    # the host holds both: one that holds the build but not the copies is refused before anything is built
    with pytest.raises(EnvironmentProblem, match="builds the pipeline in host memory"):
        plan_memory(24, need, host_free=need.built_bytes + need.fp8_copy_bytes // 2)


def test_experts_are_planned_as_the_transformer_one_on_the_gpu_at_a_time():
    """Wan 2.2 A14B: transformer_2 has the transformer's stack and plan; the denoise holds one expert at a time (the
    same resident blocks as one transformer), both move between phases, and the host holds both experts' copies."""
    from ltxbench.memory.sizes import footprint
    from ltxbench.models import family_of, wan_build
    from ltxbench.models.wan import WanSettings

    parts = wan_build.build_components(wan_build.component_configs("wan2.2-a14b"), "meta", torch.bfloat16)
    need = footprint(family_of("wan2.2-a14b"), WanSettings(model="wan2.2-a14b", weights="random", family="wan"), parts)
    assert need.experts == 2 and [name for name, _ in need.others] == ["vae"]
    single = dataclasses.replace(need, experts=1)
    for budget in (24, 16):
        plan, alone = plan_memory(budget, need), plan_memory(budget, single)
        assert plan.transformer == alone.transformer and plan.stack("transformer_2") is plan.transformer
        assert plan.phase_bytes("denoise") == alone.phase_bytes("denoise") <= budget * GIB
        assert {"transformer", "transformer_2"} <= set(plan.moved)
        tr = plan.transformer
        moving = plan.transformer_outside + tr.resident * tr.block_bytes  # an expert's weights that move
        assert plan.host_bytes - alone.host_bytes == tr.host_bytes + moving * (1 if "transformer" in alone.moved else 2)
    assert plan_memory(24, need).transformer.resident == 13
    static = plan_memory(200, need)  # both experts whole on the GPU at once where the budget holds them
    assert not static.phased and static.weights_bytes("denoise") == static.weights_bytes("decode") > 2 * (
        parts["transformer"].num_parameters() * 2)
