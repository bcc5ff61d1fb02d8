"""GPU: a phased memory plan on CUDA, where the streamers copy on their own stream and the components' weights come and
go per phase: the tiny pipelines' latents equal the resident pipeline's bit for bit, generation after generation (a
slot filled while queued work still reads the memory it reuses would show here as a difference)."""

from __future__ import annotations

import pytest
import torch

from ltxbench.memory.apply import Placement
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
from tests.memory.test_apply import _equal, _plan

pytestmark = pytest.mark.gpu


def _generate(family, pipe):
    if family == "ltx2":
        return ltx2_generate(pipe)
    embeds, mask = ltx_embeddings(pipe)
    return (ltx_generate(pipe, (embeds.cuda(), mask.cuda()), 3.0),)


@pytest.mark.parametrize("stays", [(), ("decode",)])
@pytest.mark.parametrize("family", ["ltx2", "ltx"])
def test_a_phased_placement_on_the_gpu_gives_the_resident_latents(family, stays):
    pipe = build_ltx2_tiny() if family == "ltx2" else ltx_pipeline()
    pipe.transformer = ltx2_transformer(5) if family == "ltx2" else ltx_transformer(num_layers=5)
    pipe.to("cuda")
    resident = _generate(family, pipe)
    pipe.to("cpu")
    models = family_of("ltx2-tiny" if family == "ltx2" else "ltx-tiny")
    placement = Placement(pipe, _plan(pipe, models, phased=True, stays=stays), models, "cuda")
    placement.place()
    placement.install()
    try:
        for _ in range(2):
            assert _equal(_generate(family, pipe), resident)
    finally:
        placement.uninstall()
    torch.cuda.synchronize()
