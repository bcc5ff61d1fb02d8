"""Classifier-free guidance's identical halves (ltx/cfg.py): block 0's attn1 on one half where, and only where, the
step's batch is two copies of the same samples (CPU, reference provider)."""

import pytest
import torch
from torch._dynamo.testing import EagerAndRecordGraphs

from ltxbench.inject.ltx import PAIRED_RULE, apply_kernels
from ltxbench.inject.ltx.cfg import Answer, HalvesCheck, compare_halves, first_half
from tests.helpers import ltx_inputs, ltx_transformer


def identical_halves(hidden_states, timestep, video_coords=None) -> bool:
    """compare_halves' answer, waited for."""
    return bool(compare_halves(hidden_states, timestep, video_coords))


def _cfg_inputs(model):
    """What diffusers' LTX pipeline passes with guidance: cat([latents] * 2), t.expand(2), two different prompts."""
    inputs = ltx_inputs(model)
    latents = inputs["hidden_states"][:1]
    inputs["hidden_states"] = torch.cat([latents] * 2)
    inputs["timestep"] = torch.tensor(700.0).expand(2)
    return inputs


def _attn1_batches(model) -> list[list[int]]:
    """Per block, the batch size of every attn1 call (forward pre-hooks on the attention modules)."""
    seen = [[] for _ in model.transformer_blocks]
    for index, block in enumerate(model.transformer_blocks):
        block.attn1.register_forward_pre_hook(
            lambda _m, args, kwargs, index=index: seen[index].append(kwargs["hidden_states"].size(0)),
            with_kwargs=True)
    return seen


def test_identical_halves_compares_every_input_that_reaches_attn1():
    x = torch.randn(3, 5, 4)
    pair = torch.cat([x, x])
    t = torch.tensor([3.0, 3.0, 3.0, 3.0, 3.0, 3.0])
    assert identical_halves(pair, t) and identical_halves(pair, torch.tensor(3.0).expand(6))
    assert identical_halves(pair, torch.tensor(3.0)) and identical_halves(pair, t[:1])  # one timestep for all
    assert not identical_halves(torch.cat([x, x + 1e-6]), t)
    assert not identical_halves(pair, torch.tensor([1.0, 2.0, 3.0, 1.0, 2.0, 4.0]))
    per_token = torch.rand(3, 5)
    assert identical_halves(pair, torch.cat([per_token, per_token]))  # image-to-video: a timestep per token
    coords = torch.rand(3, 3, 5)
    assert identical_halves(pair, t, torch.cat([coords, coords]))
    assert not identical_halves(pair, t, torch.cat([coords, coords.flip(0)]))
    assert not identical_halves(torch.cat([x, x, x[:1]]), torch.ones(7))  # odd batch
    assert not identical_halves(x[:1], torch.ones(1)) and not identical_halves(pair, torch.ones(4))  # no halves


def test_first_half_slices_what_has_the_batch_and_leaves_the_rest():
    grid, freqs, cos = torch.rand(4, 6, 3), torch.rand(5), torch.rand(4, 6, 8)
    half_grid, same_freqs = first_half((grid, freqs), 4)
    assert torch.equal(half_grid, grid[:2]) and same_freqs is freqs
    assert first_half((cos, cos), 4)[1].shape == (2, 6, 8)


@pytest.mark.parametrize("rope_from_coords,per_token", [(True, False), (False, False), (True, True)])
def test_guided_batch_runs_block_0_attn1_on_one_half_with_the_same_result(rope_from_coords, per_token):
    """per_token: the image-to-video pipeline's timestep, one per token (B, S) and the same in both halves."""
    model = ltx_transformer(num_layers=2)
    inputs = _cfg_inputs(model)
    if per_token:
        tokens = inputs["hidden_states"].shape[1]
        inputs["timestep"] = torch.linspace(0.0, 900.0, tokens).expand(2, tokens)
    with torch.no_grad():
        expected = model(**inputs)[0]
        seen = _attn1_batches(model)
        with apply_kernels(model, "reference", rope_from_coords=rope_from_coords) as report:
            got = model(**inputs)[0]
        with apply_kernels(model, "reference", rope_from_coords=rope_from_coords, pair_cfg_halves=False):
            unpaired = model(**inputs)[0]
    assert PAIRED_RULE in dict(report.rules)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(got, unpaired, atol=1e-6, rtol=0)
    assert not torch.equal(got[0], got[1])  # the prompts still make the halves differ
    assert seen == [[1, 2], [2, 2]]  # paired, then turned off


def test_halves_that_differ_run_the_whole_batch():
    model = ltx_transformer(num_layers=2)
    inputs = _cfg_inputs(model)
    inputs["hidden_states"] = inputs["hidden_states"].clone()
    inputs["hidden_states"][1, 0, 0] += 0.5
    with torch.no_grad():
        expected = model(**inputs)[0]
        seen = _attn1_batches(model)
        with apply_kernels(model, "reference"):
            got = model(**inputs)[0]
            inputs["timestep"] = torch.tensor([700.0, 650.0])
            inputs["hidden_states"][1, 0, 0] -= 0.5  # same latents, different timesteps
            model(**inputs)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert seen[0] == [2, 2]


def _after_a_paired_step(change):
    """A 2-layer model's output for change(guided inputs), run right after a paired guided step, the unpatched
    model's output for the same inputs, and the attn1 batch sizes per block during the patched calls."""
    model = ltx_transformer(num_layers=2)
    guided = _cfg_inputs(model)
    inputs = change(guided)
    with torch.no_grad():
        expected = model(**inputs)[0]
        seen = _attn1_batches(model)
        with apply_kernels(model, "reference"):
            model(**guided)
            got = model(**inputs)[0]
    return got, expected, seen


def test_a_paired_step_whose_timesteps_differ_runs_again_on_the_whole_batch():
    """The check compares the timestep halves too: after a guided step (answer: pair), a step with the same latents
    but another timestep per half runs paired by that answer, then again on the whole batch, and returns exactly
    what the unpatched model does."""
    got, expected, seen = _after_a_paired_step(lambda guided: dict(guided, timestep=torch.tensor([700.0, 650.0])))
    assert seen[0] == [1, 1, 2] and seen[1] == [2, 2, 2]  # the second step ran twice
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_an_answer_the_structure_gives_is_not_overridden_by_the_last_step():
    """A batch of one cannot be two halves: after a paired step, such a call runs as it is (no empty half, no
    rerun), whatever the last answer was."""
    got, expected, seen = _after_a_paired_step(lambda guided: {
        k: v[:1] if isinstance(v, torch.Tensor) and v.ndim and v.size(0) == 2 else v for k, v in guided.items()})
    assert seen[0] == [1, 1] and seen[1] == [2, 1]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_a_step_runs_by_the_last_answer_and_again_on_the_whole_batch_when_its_own_differs():
    """The answer is read one step late (no wait before the step): CFG, then different halves (ran paired, so
    again unpaired), then CFG (runs unpaired by the last answer), then CFG (paired)."""
    model = ltx_transformer(num_layers=2)
    guided = _cfg_inputs(model)
    other = dict(guided, hidden_states=guided["hidden_states"].clone())
    other["hidden_states"][1] += 0.25
    calls = [guided, other, guided, guided]
    with torch.no_grad():
        expected = [model(**inputs)[0] for inputs in calls]
        seen = _attn1_batches(model)
        with apply_kernels(model, "reference"):
            got = [model(**inputs)[0] for inputs in calls]
    for result, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(result, reference, atol=1e-6, rtol=0)
    assert seen[0] == [1, 1, 2, 2, 1] and seen[1] == [2] * 5  # the second call ran twice


def test_the_check_answers_from_the_structure_where_it_can_and_else_on_the_device():
    x = torch.randn(2, 3, 4)
    assert compare_halves(x, torch.tensor(1.0).expand(4), None) is False  # the timestep has another batch
    assert compare_halves(x[:1], torch.ones(1)) is False
    differs = compare_halves(x, torch.tensor(5.0))  # random halves: answered on the device, and the answer is no
    assert isinstance(differs, torch.Tensor) and differs.shape == () and not bool(differs)
    pending = compare_halves(torch.cat([x, x]), torch.ones(4))
    assert isinstance(pending, torch.Tensor) and pending.shape == () and bool(pending)
    check = HalvesCheck()
    assert check.guess(Answer(pending)) and check.last is None  # the first step: its own answer
    assert not check.settle(Answer(pending), ran_paired=True) and check.last is True
    assert check.guess(Answer(torch.tensor(False))) is True  # a later step: the last answer, not its own
    assert check.settle(Answer(torch.tensor(False)), ran_paired=True)  # ran paired on different halves: again
    assert check.guess(Answer(False)) is False and check.guess(Answer(torch.tensor(True))) is False


def test_turned_off_it_is_reported_and_compiled_forwards_specialize_on_the_check():
    model = ltx_transformer(num_layers=2)
    with apply_kernels(model, "reference", pair_cfg_halves=False) as report:
        assert PAIRED_RULE in {rule for rule, _ in report.skipped}
    paired, unpaired = _cfg_inputs(model), ltx_inputs(model)
    with torch.no_grad():
        expected = [model(**paired)[0], model(**unpaired)[0]]
        with apply_kernels(model, "reference"):
            torch._dynamo.reset()
            recorded = EagerAndRecordGraphs()
            model.compile(backend=recorded, fullgraph=True)
            try:
                got = [model(**paired)[0], model(**unpaired)[0], model(**paired)[0]]
            finally:
                model._compiled_call_impl = None
                torch._dynamo.reset()
    for result, reference in zip(got, expected + expected[:1], strict=True):
        torch.testing.assert_close(result, reference, atol=1e-6, rtol=0)
    assert len(recorded.graphs) == 2  # one per answer of the check, each reused


def test_a_guided_pipeline_pairs_every_step():
    from ltxbench.models.ltx_build import build_pipeline

    pipe = build_pipeline("ltx-tiny", "random", "cpu", "fp32")
    pipe.set_progress_bar_config(disable=True)

    def latents():
        return pipe(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt_embeds=-embeds,
                    negative_prompt_attention_mask=mask, num_frames=9, height=64, width=64, num_inference_steps=3,
                    guidance_scale=3.0, generator=torch.Generator().manual_seed(0), output_type="latent").frames

    channels = pipe.transformer.config.caption_channels
    embeds, mask = torch.randn(1, 8, channels, generator=torch.Generator().manual_seed(1)), torch.ones(1, 8)
    with torch.no_grad():
        expected = latents()
        seen = _attn1_batches(pipe.transformer)
        with apply_kernels(pipe, "reference"):
            got = latents()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert seen[0] == [1, 1, 1] and seen[1] == [2, 2, 2]


@pytest.mark.gpu
@pytest.mark.parametrize("rope_from_coords", [True, False])
def test_cuda_kernels_pair_the_halves_eagerly_and_under_module_compile(rope_from_coords):
    model = ltx_transformer("ltx-2b", num_layers=2, device="cuda", dtype=torch.bfloat16)
    inputs = ltx_inputs(model, "cuda", torch.bfloat16, frames=3, height=8, width=12)
    inputs["hidden_states"] = torch.cat([inputs["hidden_states"][:1]] * 2)
    inputs["timestep"] = torch.tensor(700.0, device="cuda").expand(2)
    other = dict(inputs, hidden_states=inputs["hidden_states"].clone())
    other["hidden_states"][1] += 0.25
    with torch.no_grad():
        expected = model(**inputs)[0].float()
        expected_other = model(**other)[0].float()
        seen = _attn1_batches(model)
        with apply_kernels(model, "cuda", rope_from_coords=rope_from_coords):
            got = model(**inputs)[0].float()
            assert seen[0] == [1] and seen[1] == [2]
            for block in model.transformer_blocks:  # no Python side effects in the compiled graph
                block.attn1._forward_pre_hooks.clear()
            model.compile()
            try:
                compiled = model(**inputs)[0].float()
                # halves that differ after a paired step: run paired by the last answer, then again on the whole batch
                differing = model(**other)[0].float()
            finally:
                model._compiled_call_impl = None
                torch._dynamo.reset()
    cos = torch.nn.functional.cosine_similarity(differing.flatten(), expected_other.flatten(), dim=0).item()
    assert cos >= 0.999, cos
    for result in (got, compiled):
        cos = torch.nn.functional.cosine_similarity(result.flatten(), expected.flatten(), dim=0).item()
        assert cos >= 0.999, cos


@pytest.mark.gpu
def test_the_device_check_enqueues_without_a_synchronization_and_reads_back_its_answer():
    x = torch.randn(2, 2688, 128, device="cuda", dtype=torch.bfloat16)
    pair, t = torch.cat([x, x]), torch.tensor(700.0, device="cuda").expand(4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in the check raises
    try:
        answers = [Answer(compare_halves(pair, t)), Answer(compare_halves(torch.cat([x, x + 1]), t))]
        on_host = compare_halves(pair, torch.tensor([700.0, 700.0, 700.0, 650.0]))  # a CPU timestep: read now
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [a.get() for a in answers] == [True, False] and on_host is False
