"""diffusers' offloading as peer configurations (ltxbench.models.video_peers) on the CPU, where group offloading runs
without a stream and model offload's hooks move nothing: their names parse, each gives the plain pipeline's latents,
and its revert leaves every parameter and buffer the same object, in the same table, on the same device, with the same
values, in storage of its own (not pinned), with no hook left, and our placement installed again."""

from __future__ import annotations

import pytest
import torch

from ltxbench.configurations import Configuration
from ltxbench.inject import streamer_of
from ltxbench.memory.apply import Placement, placement_of
from ltxbench.models import family_of, video_peers
from tests.helpers import build_ltx2_tiny, ltx2_generate, ltx2_transformer, tiny_memory_plan

APPLY = {video_peers.GROUP_OFFLOAD: video_peers.apply_group_offload,
         video_peers.MODEL_OFFLOAD: video_peers.apply_model_offload}
HOOK_ATTRIBUTES = ("_diffusers_hook", "_hf_hook", "_old_forward")


@pytest.mark.parametrize("model", ["ltx2-tiny", "ltx-tiny"])
def test_the_offload_peers_are_configurations_of_the_video_families(model):
    names = family_of(model).config_names()
    for peer in video_peers.OFFLOADS:
        assert peer in names and f"{peer}+compile" in names
        config = Configuration(f"{peer}+compile")
        assert config.patch == peer and config.peer == peer and config.compiled and not config.ours
    assert family_of(model).peers()[video_peers.GROUP_OFFLOAD].apply is video_peers.apply_group_offload
    assert "group-offload" not in family_of("llama-tiny").config_names()


def _state(pipe) -> list:
    """(module, table name, key, tensor, device, values, the module's attributes) of every parameter and buffer."""
    out = []
    for component in video_peers.components(pipe).values():
        for module in component.modules():
            for table in ("_parameters", "_buffers"):
                out += [(module, table, key, t, t.device, t.detach().clone(), dict(vars(module)))
                        for key, t in getattr(module, table).items() if t is not None]
    return out


def _assert_as_before(pipe, before) -> None:
    for module, table, key, tensor, device, values, attributes in before:
        now = getattr(module, table)[key]
        assert now is tensor and now.device == device and not now.is_pinned(), (table, key)
        assert torch.equal(now.detach(), values), (table, key)
        # the hook registry a pipeline call leaves on the transformer stays, the very object it was
        assert set(vars(module)) == set(attributes)
        assert all(vars(module).get(a) is attributes.get(a) for a in (*HOOK_ATTRIBUTES, "forward"))


def _pipeline():
    pipe = build_ltx2_tiny()
    pipe.transformer = ltx2_transformer(5)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("peer", video_peers.OFFLOADS)
def test_a_peer_gives_the_same_latents_and_its_revert_restores_the_pipeline(peer):
    pipe = _pipeline()
    plain = ltx2_generate(pipe)
    before = _state(pipe)
    pipe_attributes = dict(vars(pipe))
    report = APPLY[peer](pipe)
    hooked = any(vars(m).get(a) is not attributes.get(a) for m, *_, attributes in before for a in HOOK_ATTRIBUTES)
    assert hooked and report.active and report.as_dict()["rules"] == {peer: 1}
    assert report.as_dict()["provider"] == "diffusers" and report.as_dict()["library"].startswith("diffusers ")
    assert _equal(ltx2_generate(pipe), plain)
    report.revert()
    _assert_as_before(pipe, before)
    assert set(vars(pipe)) == set(pipe_attributes) and not report.active
    assert _equal(ltx2_generate(pipe), plain)
    report.revert()  # a second revert does nothing
    _assert_as_before(pipe, before)


def test_group_offload_is_applied_as_diffusers_documents_it_for_low_memory():
    pipe = _pipeline()
    with video_peers.apply_group_offload(pipe) as report:
        settings = report.as_dict()["settings"]
        assert settings == {"onload_device": "cpu", "offload_device": "cpu", "offload_type": "block_level",
                            "num_blocks_per_group": 1, "use_stream": False}  # a stream needs CUDA
        registry = vars(pipe.transformer)["_diffusers_hook"]
        assert registry.get_hook("group_offloading") is not None
    assert "_diffusers_hook" not in vars(pipe.transformer)


@pytest.mark.parametrize("phased", [False, True])
@pytest.mark.parametrize("peer", video_peers.OFFLOADS)
def test_under_a_placement_the_peer_runs_without_it_and_it_is_installed_again(peer, phased):
    pipe = _pipeline()
    plain = ltx2_generate(pipe)
    models = family_of("ltx2-tiny")
    placement = Placement(pipe, tiny_memory_plan(pipe, models, phased=phased), models, "cpu")
    placement.place()
    placement.install()
    placement.uninstall()
    before = _state(pipe)  # the placed pipeline with the placement taken off: what the peer starts from
    placement.install()
    blocks = pipe.transformer.transformer_blocks
    report = APPLY[peer](pipe)
    assert placement.streamers == [] and placement.movers == {} and streamer_of(blocks) is None
    assert _equal(ltx2_generate(pipe), plain)
    report.revert()
    assert placement_of(pipe) is placement and len(placement.streamers) == 2 and streamer_of(blocks) is not None
    assert bool(placement.movers) == phased
    assert _equal(ltx2_generate(pipe), plain)
    placement.uninstall()
    _assert_as_before(pipe, before)


def test_a_failed_apply_leaves_the_pipeline_as_it_was(monkeypatch):
    pipe = _pipeline()
    before = _state(pipe)

    def fails(**_kwargs):
        raise RuntimeError("no offload here")

    monkeypatch.setattr(pipe, "enable_group_offload", fails)
    with pytest.raises(RuntimeError, match="no offload here"):
        video_peers.apply_group_offload(pipe)
    monkeypatch.undo()
    _assert_as_before(pipe, before)


@pytest.mark.parametrize(("configs", "args", "needle"), [
    ("group-offload", ["--gpus", "2"], "diffusers' offloading runs on one GPU"),
    ("model-offload+compile", ["--compile-mode", "reduce-overhead", "--compile-scope", "regional"],
     "(CUDA graphs) is not supported"),
])
def test_refused_where_diffusers_offloading_cannot_run(configs, args, needle, tmp_path):
    from typer.testing import CliRunner

    from ltxbench.cli import app

    result = CliRunner().invoke(app, ["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", "--configs",
                                      configs, *args, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and needle in result.output, result.output
