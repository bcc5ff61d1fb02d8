"""A memory plan applied to a pipeline (ltxbench.memory.apply) on the CPU, where the streamers' loads run
synchronously: the tiny LTX-2 and LTX-Video pipelines give the unplaced pipeline's latents bit for bit with their
transformer blocks and text encoder layers streamed, with and without our injection (applied with the streamers
uninstalled and reverted the same way), and the plan's VAE tiling is switched on."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx as inject_ltx
from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.inject import streamer_of
from ltxbench.memory.apply import Placement, placement_of
from ltxbench.models import family_of
from tests.helpers import (
    build_ltx2_tiny,
    ltx2_generate,
    ltx2_transformer,
    ltx_embeddings,
    ltx_generate,
    ltx_pipeline,
    ltx_transformer,
    tiny_memory_plan,
)


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


CASES = {
    "ltx2": (build_ltx2_tiny, lambda pipe: ltx2_generate(pipe), inject_ltx2.apply_kernels),
    "ltx": (ltx_pipeline, lambda pipe: (ltx_generate(pipe, ltx_embeddings(pipe), 3.0),), inject_ltx.apply_kernels),
}


@pytest.mark.parametrize("phased", [False, True])
@pytest.mark.parametrize("family", ["ltx2", "ltx"])
def test_a_placed_pipeline_gives_the_same_latents_injected_or_not(family, phased):
    build, generate, inject = CASES[family]
    pipe = build()
    pipe.transformer = ltx2_transformer(5) if family == "ltx2" else ltx_transformer(num_layers=5)
    plain = generate(pipe)
    report = inject(pipe, "reference")
    injected = generate(pipe)
    report.revert()
    models = family_of("ltx2-tiny" if family == "ltx2" else "ltx-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=phased), models, "cpu")
    placement.place()
    placement.install()
    assert placement_of(pipe) is placement and len(placement.streamers) == 2
    stacks = [placement.streamers[0].blocks, placement.streamers[1].blocks]
    assert stacks[0] is pipe.transformer.transformer_blocks and all(streamer_of(s) is not None for s in stacks)
    loads = placement.streamers[0].loads
    assert _equal(generate(pipe), plain)
    encodes = 2 if phased and family == "ltx2" else 1  # the slots made at install, then for the encode
    assert placement.streamers[0].loads > loads and placement.streamers[1].loads == 2 * encodes
    report = placement.around(lambda: inject(pipe, "reference"))
    assert len(placement.streamers) == 2 and streamer_of(pipe.transformer.transformer_blocks) is not None
    assert _equal(generate(pipe), injected)
    report.revert()
    assert _equal(generate(pipe), plain)
    placement.uninstall()
    assert all(streamer_of(s) is None for s in stacks) and placement.movers == {}
    assert _equal(generate(pipe), plain)
    # each layout timed (the result's run.config.memory): at build, then around the injection and its revert
    laid = placement.as_dict()["layout_seconds"]
    assert len(laid["install"]) == 3 and len(laid["uninstall"]) == 3 and min(laid["install"]) >= 0


def _on_device(placement, name) -> bool:
    """Whether component `name`'s weights are in its Mover's device buffer (the CPU stands in for the GPU: the
    buffer is a storage of its own) and, for a stack, its streamer's slots exist."""
    mover = placement.movers[name]
    stored = {span.tensors[0].untyped_storage().data_ptr() for span in mover.spans}
    buffer = mover.buffer.untyped_storage().data_ptr() if mover.buffer is not None else None
    assert stored == ({buffer} if mover.on_device else {mover.slab.untyped_storage().data_ptr()})
    slots = [bool(s._buffers) for s in placement.streamers
             if name in placement.family.memory_stacks and s.blocks is getattr(placement.pipe, name).get_submodule(
                 placement.family.memory_stacks[name])]
    assert all(x == mover.on_device for x in slots)
    return mover.on_device


PHASE = {"text_encoder": "encode", "connectors": "encode", "transformer": "denoise", "vae": "decode",
         "audio_vae": "decode", "vocoder": "decode"}


def _generate_and_decode(family, pipe):
    """A generation from text, then its decodes (the video; LTX-2's audio), as the families run them."""
    from ltxbench.models import ltx2_run, ltx_run

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if family == "ltx2":
            latents = ltx2_generate(pipe)
            return (*latents, ltx2_run.decode_video(pipe, latents, gen), ltx2_run.decode_audio(pipe, latents, gen))
        latents = ltx_generate(pipe, None, 3.0)
        return latents, ltx_run.decode(pipe, latents, 9, 64, 64, gen)


@pytest.mark.parametrize("stays", [(), ("decode",)])
@pytest.mark.parametrize("family", ["ltx2", "ltx"])
def test_each_component_is_on_the_device_only_in_its_phase(family, stays):
    pipe = CASES[family][0]()
    generate = lambda p: _generate_and_decode(family, p)  # noqa: E731
    pipe.transformer = ltx2_transformer(5) if family == "ltx2" else ltx_transformer(num_layers=5)
    plain = generate(pipe)
    models = family_of("ltx2-tiny" if family == "ltx2" else "ltx-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=True, stays=stays), models, "cpu")
    placement.place()
    placement.install()
    assert not any(_on_device(placement, name) for name in placement.movers)  # nothing on the GPU until a phase
    seen = []

    def check(name):
        def hook(_module, _args):
            here = {other for other in placement.movers if _on_device(placement, other)}
            keep = {"transformer"} if PHASE[name] in stays else set()
            # the phase's components come as they are first called: the ones called before in this phase and this one
            called = {n for n in seen if PHASE[n] == PHASE[name]} | {name}
            assert here == called | keep, (name, here)
            seen.append(name)
        return hook

    handles = [getattr(pipe, name).register_forward_pre_hook(check(name)) for name in placement.movers
               if name not in ("vae", "audio_vae")]  # the VAEs run through their decoder
    handles += [getattr(pipe, name).decoder.register_forward_pre_hook(check(name)) for name in ("vae", "audio_vae")
                if name in placement.movers]
    assert _equal(generate(pipe), plain)
    assert set(seen) == set(placement.movers) and placement.phase == "decode"
    for handle in handles:
        handle.remove()
    placement.uninstall()


def test_a_component_the_run_does_not_call_never_comes_to_the_device():
    """With the prompt embeddings given, LTX-2's pipeline calls its connectors but not the text encoder: the encode
    phase brings the connectors alone (the text encoder's weights would take the phase's memory, and a copy)."""
    pipe = build_ltx2_tiny()
    pipe.transformer = ltx2_transformer(5)
    models = family_of("ltx2-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=True), models, "cpu")
    placement.place()
    placement.install()
    try:
        placement.enter("denoise", "transformer")
        placement.enter("encode", "connectors")
        assert [n for n in placement.movers if _on_device(placement, n)] == ["connectors"]
        placement.enter("encode", "text_encoder")
        assert {n for n in placement.movers if _on_device(placement, n)} == {"connectors", "text_encoder"}
    finally:
        placement.uninstall()


def test_the_plans_vae_tiling_is_switched_on():
    pipe = build_ltx2_tiny()
    family = family_of("ltx2-tiny")
    Placement(pipe, tiny_memory_plan(pipe, family, tiling=True), family, "cpu").place()
    assert pipe.vae.use_tiling and pipe.vae.use_framewise_decoding


def _generate_on_gpu(family, pipe):
    if family == "ltx2":
        return ltx2_generate(pipe)
    embeds, mask = ltx_embeddings(pipe)
    return (ltx_generate(pipe, (embeds.cuda(), mask.cuda()), 3.0),)


@pytest.mark.gpu
@pytest.mark.parametrize("stays", [(), ("decode",)])
@pytest.mark.parametrize("family", ["ltx2", "ltx"])
def test_a_phased_placement_on_the_gpu_gives_the_resident_latents(family, stays):
    """On CUDA the streamers copy on their own stream and the components come and go per phase: two generations in a
    row equal the resident pipeline's latents bit for bit, unpatched and with our kernels injected under the placement
    (a slot filled while queued work still reads the memory it reuses would show here)."""
    pipe = build_ltx2_tiny() if family == "ltx2" else ltx_pipeline()
    pipe.transformer = ltx2_transformer(5) if family == "ltx2" else ltx_transformer(num_layers=5)
    inject = CASES[family][2]
    pipe.to("cuda")
    resident = _generate_on_gpu(family, pipe)
    with inject(pipe, "cuda"):
        resident_injected = _generate_on_gpu(family, pipe)
    pipe.to("cpu")
    models = family_of("ltx2-tiny" if family == "ltx2" else "ltx-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=True, stays=stays), models, "cuda")
    placement.place()
    placement.install()
    try:
        for _ in range(2):
            assert _equal(_generate_on_gpu(family, pipe), resident)
        # our kernels injected while the weights are on the host (the transformer is outside its phase)
        report = placement.around(lambda: inject(pipe, "cuda"))
        try:
            for _ in range(2):
                assert _equal(_generate_on_gpu(family, pipe), resident_injected)
        finally:
            report.revert()
        assert _equal(_generate_on_gpu(family, pipe), resident)
    finally:
        placement.uninstall()
    torch.cuda.synchronize()


def test_an_injection_under_a_placement_runs_for_its_device(monkeypatch):
    """Placement.around tells the injection the device the model computes on, though its weights may be on the host
    (the cuda provider's device check, the GEMM choices and the FP8 check read it); outside, a module's own."""
    import ltxbench.inject
    from ltxbench.inject import run_device, runs_on

    layer = torch.nn.Linear(2, 2)
    assert run_device(layer) == torch.device("cpu")
    with runs_on("cuda:0"):
        assert run_device(layer) == torch.device("cuda:0")
    assert run_device(layer) == torch.device("cpu")
    pipe = ltx_pipeline()
    pipe.transformer = ltx_transformer(num_layers=5)
    models = family_of("ltx-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=True), models, "cpu")
    placement.place()
    placement.install()
    declared = []
    monkeypatch.setattr(ltxbench.inject, "runs_on", lambda device: declared.append(device) or runs_on("cuda:0"))
    seen = []
    placement.around(lambda: seen.append(run_device(pipe.transformer)))
    placement.uninstall()
    assert declared == [placement.device] and seen == [torch.device("cuda:0")]


def test_an_uninstalled_placement_stays_uninstalled_around_an_injection_and_its_revert():
    """Placement.around and the report's revert put the streamers back only where they were: a placement someone
    uninstalled (a peer's offload, a user) is not reinstalled under them."""
    pipe = ltx_pipeline()
    pipe.transformer = ltx_transformer(num_layers=5)
    models = family_of("ltx-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=False), models, "cpu")
    placement.place()
    assert not placement.installed
    placement.install()
    assert placement.installed and placement.streamers
    placement.uninstall()
    plain = ltx_generate(pipe, ltx_embeddings(pipe), 3.0)
    report = placement.around(lambda: inject_ltx.apply_kernels(pipe, "reference"))
    assert not placement.installed and placement.streamers == []
    assert streamer_of(pipe.transformer.transformer_blocks) is None
    report.revert()
    assert not placement.installed and placement.streamers == []
    assert _equal((ltx_generate(pipe, ltx_embeddings(pipe), 3.0),), (plain,))
    placement.install()  # installed, the same calls keep it installed
    report = placement.around(lambda: inject_ltx.apply_kernels(pipe, "reference"))
    assert placement.installed and streamer_of(pipe.transformer.transformer_blocks) is not None
    report.revert()
    assert placement.installed and len(placement.streamers) == 2
    placement.uninstall()
