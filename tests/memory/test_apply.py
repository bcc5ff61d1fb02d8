"""A memory plan applied to a pipeline (ltxbench.memory.apply) on the CPU, where the streamers' loads run
synchronously: the tiny LTX-2 and LTX-Video pipelines give the unplaced pipeline's latents bit for bit with their
transformer blocks and text encoder layers streamed, with and without our injection (applied with the streamers
uninstalled and reverted the same way), and the plan's VAE tiling is switched on."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx as inject_ltx
from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.memory import streamer_of
from ltxbench.memory.apply import Placement, placement_of
from ltxbench.memory.plan import GIB, MemoryPlan, Streaming
from ltxbench.models import family_of
from tests.helpers import (
    build_ltx2_tiny,
    ltx2_generate,
    ltx2_transformer,
    ltx_embeddings,
    ltx_generate,
    ltx_pipeline,
    ltx_transformer,
)


def _plan(pipe, family, tiling=False) -> MemoryPlan:
    """4 of the transformer's 5 blocks streamed through 2 slots, the text encoder's 2 layers through 2."""
    def stack(name, streamed):
        return Streaming(name, 5 if name == "transformer" else 2, 0, streamed, 2)

    whole = tuple((name, 0) for name in ("connectors", "vae", "audio_vae", "vocoder") if hasattr(pipe, name))
    return MemoryPlan(GIB, stack("transformer", (0, 1, 3, 4)), stack("text_encoder", (0, 1)), whole, 0, tiling, 0,
                      0, 0)


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


CASES = {
    "ltx2": (build_ltx2_tiny, lambda pipe: ltx2_generate(pipe), inject_ltx2.apply_kernels),
    "ltx": (ltx_pipeline, lambda pipe: (ltx_generate(pipe, ltx_embeddings(pipe), 3.0),), inject_ltx.apply_kernels),
}


@pytest.mark.parametrize("family", ["ltx2", "ltx"])
def test_a_placed_pipeline_gives_the_same_latents_injected_or_not(family):
    build, generate, inject = CASES[family]
    pipe = build()
    pipe.transformer = ltx2_transformer(5) if family == "ltx2" else ltx_transformer(num_layers=5)
    plain = generate(pipe)
    report = inject(pipe, "reference")
    injected = generate(pipe)
    report.revert()
    models = family_of("ltx2-tiny" if family == "ltx2" else "ltx-tiny")
    placement = Placement(pipe, _plan(pipe, models), models, "cpu")
    placement.place()
    placement.install()
    assert placement_of(pipe) is placement and len(placement.streamers) == 2
    stacks = [placement.streamers[0].blocks, placement.streamers[1].blocks]
    assert stacks[0] is pipe.transformer.transformer_blocks and all(streamer_of(s) is not None for s in stacks)
    loads = placement.streamers[0].loads
    assert _equal(generate(pipe), plain)
    assert placement.streamers[0].loads > loads and placement.streamers[1].loads == 2  # its 2 layers stay in 2 slots
    report = placement.around(lambda: inject(pipe, "reference"))
    assert len(placement.streamers) == 2 and streamer_of(pipe.transformer.transformer_blocks) is not None
    assert _equal(generate(pipe), injected)
    report.revert()
    assert _equal(generate(pipe), plain)
    placement.uninstall()
    assert all(streamer_of(s) is None for s in stacks)


def test_the_plans_vae_tiling_is_switched_on():
    pipe = build_ltx2_tiny()
    family = family_of("ltx2-tiny")
    Placement(pipe, _plan(pipe, family, tiling=True), family, "cpu").place()
    assert pipe.vae.use_tiling and pipe.vae.use_framewise_decoding
