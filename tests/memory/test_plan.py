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


def _planned_peak(need: Footprint, transformer_resident: int, text_resident: int, activations: int) -> int:
    tr, te = need.transformer, need.text_encoder
    slots = lambda stack, resident: (2 if resident < stack.blocks else 0) * stack.block_bytes  # noqa: E731
    return (GIB + tr.outside_bytes + te.outside_bytes + sum(b for _, b in need.others) + activations
            + transformer_resident * tr.block_bytes + slots(tr, transformer_resident)
            + text_resident * te.block_bytes + slots(te, text_resident))


def test_spread_puts_streamed_blocks_between_resident_ones():
    assert spread(8, 4) == (1, 3, 5, 7) and spread(48, 0) == ()
    streamed = streamed_blocks(48, 30)
    assert len(streamed) == 18 and not any(b - a == 1 for a, b in zip(streamed, streamed[1:], strict=False))
    many = streamed_blocks(48, 12)  # more streamed than resident: the resident ones spread, runs of 3 at most
    assert len(many) == 36 and len(set(spread(48, 12)) & set(many)) == 0
    runs = "".join("s" if i in many else "r" for i in range(48)).split("r")
    assert max(map(len, runs)) <= 3


@pytest.mark.parametrize("budget", [13, 16, 24, 40])
def test_as_many_blocks_resident_as_the_budget_holds_and_not_one_more(budget):
    plan = plan_memory(budget, NEED, host_free=None)
    tr, te = plan.transformer, plan.text_encoder
    assert plan.vae_tiling and plan.activation_bytes == NEED.denoise_bytes  # 9 GiB untiled does not fit
    assert plan.gpu_bytes == _planned_peak(NEED, tr.resident, te.resident, plan.activation_bytes) <= budget * GIB
    if tr.resident < tr.blocks:  # the text encoder's layers get only what is left below one more block
        assert te.resident * te.block_bytes < tr.block_bytes
    one_more = (tr.resident + 1, te.resident) if tr.resident < tr.blocks else (tr.resident, te.resident + 1)
    assert _planned_peak(NEED, *one_more, plan.activation_bytes) > budget * GIB
    assert len(tr.streamed) == tr.blocks - tr.resident and plan.host_bytes == tr.host_bytes + te.host_bytes
    assert plan.lines()[0].startswith(f"memory plan: budget {budget:.2f} GiB")


def test_a_large_budget_streams_nothing_and_decodes_untiled():
    plan = plan_memory(80, NEED)
    assert plan.transformer.streamed == plan.text_encoder.streamed == () and not plan.vae_tiling
    assert plan.host_bytes == 0 and plan.activation_bytes == NEED.decode_bytes
    assert "transformer blocks: all 48 on the GPU" in "\n".join(plan.lines())


def test_budgets_that_cannot_hold_the_run_are_refused_in_one_line():
    smallest = _planned_peak(NEED, 0, 0, NEED.denoise_bytes)
    with pytest.raises(EnvironmentProblem) as refused:
        plan_memory((smallest - 1) / GIB, NEED)
    assert refused.value.exit_code == 4 and "\n" not in refused.value.message
    assert f"at least {smallest / GIB:.2f} GiB" in refused.value.message
    assert plan_memory(smallest / GIB, NEED).transformer.resident == 0
    with pytest.raises(EnvironmentProblem, match="the host has 40.00 GiB available"):
        plan_memory(24, NEED, host_free=40 * GIB)
    assert plan_memory(24, NEED, host_free=61 * GIB).budget_bytes == 24 * GIB


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
    from ltxbench.memory.sizes import footprint, stack_of
    from ltxbench.models import family_of, ltx2_build
    from ltxbench.models.ltx2 import LTX2Settings
    from ltxbench.models.memory import module_bytes

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
