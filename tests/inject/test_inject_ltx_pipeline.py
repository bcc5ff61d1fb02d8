"""LTX kernel injection in pipelines as users run them (CPU, reference provider, ltx-tiny, fp32): prompt embeddings
reused across calls, weights changed between calls (through `.data`, as PEFT's fuse_lora writes them), LoRA adapters
added, fused and unfused after the injection, model and sequential CPU offload before and after it, several videos
per prompt, a callback that edits the latents, guidance on and off; and revert through the hooks offload installs.
Every patched result is checked against the unpatched pipeline in the same state."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import OFFLOADED, ORIGINAL_CLASS, llm
from ltxbench.inject import ltx as ltx_inject
from ltxbench.inject.ltx import apply_kernels
from ltxbench.inject.ltx.cross_kv import CACHE_ATTR, CrossKVCache
from tests.helpers import llm_build, ltx_embeddings, ltx_generate, ltx_pipeline, ltx_transformer, max_rel_error

TOL = 1e-5  # max |patched - unpatched| / max |unpatched| over the latents (the reference path: same math op for op)

@pytest.fixture
def pipe():
    return ltx_pipeline()


def _write_through_data(pipe, scale: float) -> None:
    """What PEFT's fuse_lora does to a plain Linear's weight: an in-place write through `.data` (no version bump)."""
    g = torch.Generator().manual_seed(4)
    for block in pipe.transformer.transformer_blocks:
        weight = block.attn2.to_k.weight
        weight.data += scale * torch.randn(weight.shape, generator=g)


def _weight_change_between_calls(pipe, guidance):
    """(patched result after the change, the unpatched pipeline's result after it, the patched result before)."""
    embeddings = ltx_embeddings(pipe)
    with apply_kernels(pipe, "reference"):
        before = ltx_generate(pipe, embeddings, guidance)
        assert vars(pipe.transformer)[CACHE_ATTR].builds == 1  # the cache was used
        _write_through_data(pipe, 0.5)
        after = ltx_generate(pipe, embeddings, guidance)
    return after, ltx_generate(pipe, embeddings, guidance), before


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_a_weight_written_through_data_between_calls_reaches_the_next_call(pipe, guidance):
    after, expected, before = _weight_change_between_calls(pipe, guidance)
    assert max_rel_error(before, after) > 100 * TOL  # the change matters, so an old entry would be seen
    assert max_rel_error(after, expected) < TOL


def test_the_weight_check_fails_when_an_entry_outlives_its_generation(pipe, monkeypatch):
    """The mutation the test above must catch: entries kept from one pipeline call to the next."""
    monkeypatch.setattr(ltx_inject, "new_generation", lambda target: None)
    monkeypatch.setattr(CrossKVCache, "generations", property(lambda self: 1, lambda self, value: None), raising=False)
    after, expected, _ = _weight_change_between_calls(pipe, 1.0)
    assert max_rel_error(after, expected) > 100 * TOL


@pytest.mark.parametrize("order", ["adapter after injection", "adapter before injection"])
def test_lora_fuse_and_unfuse_match_the_unpatched_pipeline(order):
    pytest.importorskip("peft")
    from peft import LoraConfig

    patched, unpatched = ltx_pipeline(), ltx_pipeline()
    embeddings = ltx_embeddings(patched)
    # every projection of the block, the up-projection under the GELU epilogue included; random A and B: the adapter
    # changes the result
    config = LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj",
                                                           "ff.net.2"], init_lora_weights=False)

    def add_adapter(pipe):
        torch.manual_seed(5)
        pipe.transformer.add_adapter(config)

    add_adapter(unpatched)
    if order == "adapter before injection":
        add_adapter(patched)
    report = apply_kernels(patched, "reference")
    ltx_generate(patched, embeddings, 1.0)
    if order == "adapter after injection":
        add_adapter(patched)
    results = {"adapter": ltx_generate(patched, embeddings, 1.0)}
    patched.fuse_lora(components=["transformer"])
    results["fused"] = ltx_generate(patched, embeddings, 1.0)
    patched.unfuse_lora(components=["transformer"])
    results["unfused"] = ltx_generate(patched, embeddings, 1.0)
    report.revert()
    expected = ltx_generate(unpatched, embeddings, 1.0)
    assert max_rel_error(expected, ltx_generate(ltx_pipeline(), embeddings, 1.0)) > 100 * TOL  # the adapter matters
    for name, got in results.items():
        assert max_rel_error(got, expected) < TOL, name


# accelerate's sequential offload needs an accelerator to run on (on a CPU its hooks fail unpatched as well)
@pytest.mark.parametrize("offload", ["model", pytest.param("sequential", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("when", ["before injection", "after injection"])
def test_cpu_offload_with_injection_matches_and_revert_restores_the_model(offload, when, fused_calls):
    pipe = ltx_pipeline()
    device = "cuda" if offload == "sequential" else "cpu"
    embeddings = tuple(t.to(device) for t in ltx_embeddings(pipe))  # on the execution device, as encode_prompt gives
    expected = ltx_generate(pipe.to(device), embeddings, 3.0).cpu()
    pipe.to("cpu")

    def enable():
        getattr(pipe, f"enable_{offload}_cpu_offload")(device=device)

    if when == "before injection":
        enable()
    report = apply_kernels(pipe, "reference")
    if offload == "sequential" and when == "before injection":  # weights on the meta device: nothing patched
        assert not report.active and report.skipped == [("transformer", OFFLOADED)]
    if when == "after injection":
        enable()
    got = ltx_generate(pipe, embeddings, 3.0).cpu()
    ran_fused = bool(fused_calls)
    report.revert()
    fused_calls.clear()
    after = ltx_generate(pipe, embeddings, 3.0).cpu()
    assert max_rel_error(got, expected) < TOL
    assert ran_fused or (offload == "sequential" and when == "before injection")  # hooks own every forward there
    assert not fused_calls, f"the reverted pipeline still runs {sorted(set(fused_calls))}"
    assert max_rel_error(after, expected) < TOL


@pytest.mark.gpu
def test_model_offload_on_the_gpu_keeps_one_fused_copy_in_use(monkeypatch):
    """enable_model_cpu_offload after the injection moves the transformer to the GPU for the denoising and back after
    it, one parameter at a time: each fused concatenation follows (fuse.follow_moves), so the fused GEMMs run, on one
    copy of the weights, and none of it stays on the GPU once the model is back on the host."""
    from ltxbench.inject import fuse

    ran = []
    original = fuse.fused_linear
    monkeypatch.setattr(fuse, "fused_linear", lambda *a, **k: (lambda out: ran.append(out is not None) or out)(
        original(*a, **k)))
    pipe = ltx_pipeline()
    embeddings = tuple(t.to("cuda") for t in ltx_embeddings(pipe))  # on the execution device, as encode_prompt gives
    expected = ltx_generate(pipe.to("cuda"), embeddings, 3.0).cpu()
    report = apply_kernels(pipe, "reference")
    pipe.enable_model_cpu_offload(device="cuda")
    got = ltx_generate(pipe, embeddings, 3.0).cpu()
    sets = [vars(m)[fuse.FUSED_ATTR][1] for m in pipe.transformer.modules() if fuse.FUSED_ATTR in vars(m)]
    assert sets and all(f.intact and f.weight.device.type == "cpu" for f in sets)
    assert all(lin.weight.untyped_storage().data_ptr() == f.weight.untyped_storage().data_ptr()
               for f in sets for lin in f.linears)
    assert ran and all(ran)  # every projection set ran fused on the GPU
    report.revert()
    pipe.remove_all_hooks()
    assert max_rel_error(got, expected) < TOL


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_videos_per_prompt_and_a_callback_that_edits_latents(pipe, guidance):
    embeddings = None  # from text: diffusers repeats encoded prompts per video, not prompt embeddings passed in

    def damp(_pipe, step, _t, kwargs):
        return {"latents": kwargs["latents"] * 0.9} if step == 0 else {}

    options = {"num_videos_per_prompt": 2, "callback_on_step_end": damp}
    expected = ltx_generate(pipe, embeddings, guidance, **options)
    with apply_kernels(pipe, "reference"):
        got = ltx_generate(pipe, embeddings, guidance, **options)
    assert got.shape[0] == 2
    assert max_rel_error(got, expected) < TOL


def test_offloaded_parameters_are_refused_with_the_reason():
    """Parameters on the meta device (accelerate's offload keeps the real ones elsewhere) are read by the fused paths
    across modules: nothing is patched, and the report says why (LTX and LLM)."""

    model, lm = ltx_transformer(), llm_build("llama")
    for module in (model.transformer_blocks[1].attn2.to_k, lm.model.layers[1].mlp.up_proj):
        module.weight = torch.nn.Parameter(torch.empty_like(module.weight, device="meta"), requires_grad=False)
    for report, target in ((apply_kernels(model, "reference"), "transformer"),
                           (llm.apply_kernels(lm, "reference"), "model")):
        assert not report.active and report.skipped == [(target, OFFLOADED)]
    assert not any(ORIGINAL_CLASS in vars(type(m)) for m in (*model.modules(), *lm.modules()))
