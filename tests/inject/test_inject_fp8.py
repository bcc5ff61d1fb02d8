"""precision="fp8" on LTX-Video and LTX-2 (CPU, reference provider, fp32 models): the fused FP8 path equals a
simulation of FP8 on the unpatched model (each block projection's weight and input rounded to e4m3 per row), a 1%
change of a formula fails that, the revert brings back the exact weights, the weight memory drops, and what cannot
run in FP8 is refused with its reason."""

from __future__ import annotations

import pytest
import torch

from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.inject import fp8
from ltxbench.inject.ltx import apply_kernels
from ltxbench.ops import reference, reference_fp8
from tests.helpers import (
    build_ltx2_tiny,
    ltx2_generate,
    ltx_embeddings,
    ltx_generate,
    ltx_pipeline,
    max_rel_error,
    simulated_fp8,
    with_shifted_output,
    without_flash_attention_3,
)

TOL = 2e-5  # fused FP8 vs the simulation: the same roundings, fp32 sums in another order


def _block_projections(model):
    for block in model.transformer_blocks:
        yield from (block.attn1.to_q, block.attn1.to_k, block.attn1.to_v, block.attn1.to_out[0], block.attn2.to_q,
                    block.attn2.to_k, block.attn2.to_v, block.attn2.to_out[0], block.ff.net[0].proj, block.ff.net[2])


def _ltx2_block_projections(model):
    from ltxbench.inject.ltx2.precision import ATTENTIONS

    for block in model.transformer_blocks:
        for name in ATTENTIONS:
            attn = getattr(block, name)
            yield from (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])
        yield from (block.ff.net[0].proj, block.ff.net[2], block.audio_ff.net[0].proj, block.audio_ff.net[2])


def _simulated_fp8(pipe, embeddings, projections=_block_projections, run=None):
    """The unpatched model with every block projection's weight and input rounded to FP8 per row (per output channel,
    per token): what the fused FP8 path must compute."""
    return simulated_fp8(projections(pipe.transformer),
                         lambda: ltx_generate(pipe, embeddings, 3.0) if run is None else run(pipe))


@pytest.fixture(scope="module")
def runs():
    pipe = ltx_pipeline()
    embeddings = ltx_embeddings(pipe)
    return pipe, embeddings, ltx_generate(pipe, embeddings, 3.0), _simulated_fp8(pipe, embeddings)


def test_fp8_equals_a_simulation_of_fp8_on_the_unpatched_model(runs):
    pipe, embeddings, exact, simulated = runs
    with apply_kernels(pipe, "reference", precision="fp8") as report:
        got = ltx_generate(pipe, embeddings, 3.0)
    # per block: the 10 projections, and q/k/v concatenated on attn1
    assert report.rules[fp8.STORE_RULE] == 2 * 11
    assert max_rel_error(got, simulated) <= TOL, max_rel_error(got, simulated)
    # really quantized, and close to the exact output
    assert 1e-3 < max_rel_error(got, exact) < 0.05, max_rel_error(got, exact)


@pytest.mark.parametrize("layer", ["attn1.to_q", "ff.net.0.proj", "ff.net.2"])
def test_a_hook_put_on_a_fused_fp8_projection_runs(runs, layer):
    """q/k/v run as one FP8 GEMM, the feed-forward as one FP8 path: a forward hook put on one of their layers after the
    injection must still run, so that call takes each layer on its own FP8 weight; the result is the simulation's
    with the same hook."""
    pipe, embeddings, _, simulated = runs
    proj = pipe.transformer.transformer_blocks[0].get_submodule(layer)

    expected = with_shifted_output(proj, lambda: _simulated_fp8(pipe, embeddings))
    assert max_rel_error(expected, simulated) > 100 * TOL  # the hook matters
    with apply_kernels(pipe, "reference", precision="fp8"):
        got = with_shifted_output(proj, lambda: ltx_generate(pipe, embeddings, 3.0))
    assert max_rel_error(got, expected) <= TOL, max_rel_error(got, expected)


@pytest.mark.parametrize("where", ["norm scale 1%", "gelu before quantizing", "weight scale 1%"])
def test_a_perturbed_fp8_formula_fails_the_simulation(runs, monkeypatch, where):
    pipe, embeddings, _, simulated = runs
    if where == "norm scale 1%":
        original = reference.add_rms_norm_modulate_fp8
        monkeypatch.setattr(reference, "add_rms_norm_modulate_fp8",
                            lambda *a, **k: (lambda q, s, h: (q, s * 1.01, h))(*original(*a, **k)))
    elif where == "gelu before quantizing":  # the exact GELU swapped for the erf one
        monkeypatch.setattr(reference, "gelu_tanh_fp8",
                            lambda x: reference_fp8._to_fp8_rows(torch.nn.functional.gelu(x.float())))
    else:
        original = reference.quantize_fp8
        monkeypatch.setattr(reference, "quantize_fp8", lambda x: (lambda q, s: (q, s * 1.01))(*original(x)))
    with apply_kernels(pipe, "reference", precision="fp8"):
        got = ltx_generate(pipe, embeddings, 3.0)
    assert max_rel_error(got, simulated) > 10 * TOL, max_rel_error(got, simulated)


def test_revert_restores_the_exact_weights_and_output(runs):
    pipe, embeddings, exact, _ = runs
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    report = apply_kernels(pipe, "reference", precision="fp8")
    assert pipe.transformer.transformer_blocks[0].ff.net[2].weight.numel() == 0  # freed, not shadowed
    report.revert()
    after = pipe.transformer.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert torch.equal(ltx_generate(pipe, embeddings, 3.0), exact)


def test_the_fp8_weights_move_with_the_model(runs, monkeypatch):
    """Model CPU offload moves the model with .to(device): the FP8 weights are buffers that move with it, and every
    projection reads them where they are now. Simulated by replacing every tensor of the model with a copy, as a move
    does: the output is unchanged and every FP8 weight a GEMM reads is one of the model's current buffers."""
    pipe, embeddings, _, _ = runs
    used = []
    original = reference.linear_fp8

    def recording(x, x_scale, weight, *args, **kwargs):
        used.append(weight.untyped_storage().data_ptr())
        return original(x, x_scale, weight, *args, **kwargs)

    monkeypatch.setattr(reference, "linear_fp8", recording)
    with apply_kernels(pipe, "reference", precision="fp8"):
        first = ltx_generate(pipe, embeddings, 3.0)
        pipe.transformer._apply(lambda t: t.clone())
        used.clear()
        moved = ltx_generate(pipe, embeddings, 3.0)
        current = {t.untyped_storage().data_ptr() for t in pipe.transformer.buffers()}
    assert used and set(used) <= current
    assert torch.equal(first, moved)


def test_a_cast_of_the_fp8_weights_fails_loudly(runs):
    """module.to(dtype) casts every floating-point buffer, the FP8 weights included: the next call says so."""
    pipe, embeddings, _, _ = runs

    with apply_kernels(pipe, "reference", precision="fp8"):  # the revert removes the cast buffers
        # what .to(torch.bfloat16) does to the FP8 buffers (the fp32 test model itself stays fp32)
        pipe.transformer._apply(lambda t: t.to(torch.bfloat16) if t.dtype == torch.float8_e4m3fn else t)
        with pytest.raises(RuntimeError, match=r"were cast to torch.bfloat16 \(a .to\(dtype\) after the injection"):
            ltx_generate(pipe, embeddings, 3.0)


def test_a_lora_fused_after_the_injection_fails_loudly(runs):
    """The FP8 weights are a copy: a later change of a projection's weight must not be silently ignored."""
    pipe, _, _, _ = runs
    with apply_kernels(pipe, "reference", precision="fp8"):
        layer = pipe.transformer.transformer_blocks[0].attn1.to_out[0]
        with pytest.raises(RuntimeError):
            layer.weight.data += torch.ones(layer.out_features, layer.in_features)


def test_new_values_for_a_stored_weight_are_refused_moves_are_not(runs):
    """`weight.data = w` keeps the Parameter, so nothing else sees it: refused with one line, where the FP8 copy
    would otherwise go on computing with the old weight. A move of the empty placeholder (diffusers' group
    offloading assigns `.data` too) passes, and the revert gives the layer its weight back as a plain Parameter."""
    pipe, _, _, _ = runs
    layer = pipe.transformer.transformer_blocks[0].attn1.to_q
    with apply_kernels(pipe, "reference", precision="fp8"):
        with pytest.raises(RuntimeError, match="held by ltxbench.s FP8 injection"):
            layer.weight.data = torch.randn(layer.out_features, layer.in_features)
        layer.weight.data = layer.weight.data.to("cpu")  # a move: still empty
        assert layer.weight.numel() == 0
        # q/k/v run as one GEMM on a concatenated bias: the layer's own bias is held there too
        with pytest.raises(RuntimeError, match="held by ltxbench.s FP8 injection"):
            layer.bias.data = torch.randn(layer.out_features)
        with torch.no_grad(), pytest.raises(RuntimeError):
            layer.bias += torch.ones(layer.out_features)  # in place, as a merge adds its delta: on the empty one
        # a scalar edit broadcasts over the empty placeholder: without the guard, a silent no-op
        edits = {"weight *= 2": lambda: layer.weight.__imul__(2), "weight.mul_(2)": lambda: layer.weight.mul_(2),
                 "weight.data *= 2": lambda: layer.weight.data.mul_(2),
                 "init": lambda: torch.nn.init.zeros_(layer.weight), "bias.data += 1": lambda: layer.bias.data.add_(1),
                 "weight[:] = 0": lambda: layer.weight.__setitem__(slice(None), 0.0),
                 "weight.set_(w)": lambda: layer.weight.set_(torch.randn(layer.out_features, layer.in_features)),
                 # a list holding it (the foreach ops), a detached alias of it, an empty slice of a real vector
                 "foreach mul_": lambda: torch._foreach_mul_([layer.weight], 2.0),
                 "foreach zero_": lambda: torch._foreach_zero_([layer.bias]),
                 "detach().mul_": lambda: layer.weight.detach().mul_(2),
                 "vector_to_parameters": lambda: torch.nn.utils.vector_to_parameters(
                     torch.zeros(sum(p.numel() for p in pipe.transformer.parameters())),
                     pipe.transformer.parameters())}
        for name, edit in edits.items():
            with torch.no_grad(), pytest.raises(RuntimeError, match="held by ltxbench.s FP8 injection"):
                edit()
                pytest.fail(f"{name} passed")
        pipe.transformer.requires_grad_(False)  # metadata, not values: passes
        pipe.transformer.requires_grad_(True)  # as the shared pipeline was
    assert type(layer.weight) is torch.nn.Parameter and layer.weight.shape == (layer.out_features, layer.in_features)
    assert type(layer.bias) is torch.nn.Parameter and layer.bias.shape == (layer.out_features,)


def test_the_weight_memory_counts_one_byte_per_projection_weight():
    """bf16 weights (2 bytes) leave the device, FP8 ones (1 byte + a 4-byte scale per output channel) stay: about
    half at LTX-2B's widths (2048: the scales add 0.2%), measured by bench e2e. A concatenation (q/k/v) also keeps
    its bias, concatenated (2 bytes per output channel), and its layers' own biases leave the device."""
    from ltxbench.models.ltx_build import build_pipeline

    pipe = build_pipeline("ltx-tiny", "random", "cpu", "bf16")
    before = fp8.weight_bytes(pipe.transformer)["total"]
    layers = list(_block_projections(pipe.transformer))
    with apply_kernels(pipe, "reference", precision="fp8"):
        after = fp8.weight_bytes(pipe.transformer)
        joined = [getattr(m, name) for m in pipe.transformer.modules()
                  if isinstance(vars(m).get(fp8.WEIGHT_ATTR), fp8.Fp8Stored) for name in vars(m)[fp8.WEIGHT_ATTR].names]
        assert joined  # attn1's q/k/v at least
    joined_bias = sum(2 * layer.out_features for layer in joined if layer.bias is not None)
    assert after["parameters"] == before - sum(2 * layer.weight.numel() for layer in layers) - joined_bias
    assert after["fp8_weights"] == sum(layer.weight.numel() + 4 * layer.out_features for layer in layers) + joined_bias
    assert fp8.weight_bytes(pipe.transformer)["total"] == before


def test_unknown_precision_and_a_wrapped_projection_are_refused(runs):
    pipe, _, _, _ = runs
    with pytest.raises(UsageError, match="precision 'fp16'"):
        apply_kernels(pipe, "reference", precision="fp16")
    block = pipe.transformer.transformer_blocks[1]
    original = block.attn2.to_q
    block.attn2.to_q = torch.nn.Sequential(original)
    try:
        with pytest.raises(UsageError, match="transformer_blocks.1: a projection is not a plain nn.Linear"):
            apply_kernels(pipe, "reference", precision="fp8")
    finally:
        block.attn2.to_q = original


def test_gpus_without_fp8_tensor_cores_are_refused_with_exit_4(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(EnvironmentProblem, match="compute capability 9.0") as caught:
        fp8.require_fp8("cuda:0")
    assert caught.value.exit_code == 4


# --- LTX-2 ----------------------------------------------------------------------------------------------

def _ltx2_latents(pipe):
    video, audio = ltx2_generate(pipe)
    return torch.cat([video.flatten(), audio.flatten()])


@pytest.fixture(scope="module")
def ltx2_runs():
    pipe = build_ltx2_tiny()
    return pipe, _ltx2_latents(pipe), _simulated_fp8(pipe, None, _ltx2_block_projections, _ltx2_latents)


def test_ltx2_fp8_equals_the_simulation_and_reverts_exactly(ltx2_runs):
    from ltxbench.inject import ltx2 as inject_ltx2

    pipe, exact, simulated = ltx2_runs
    with inject_ltx2.apply_kernels(pipe, "reference", precision="fp8") as report:
        got = _ltx2_latents(pipe)
        assert pipe.transformer.transformer_blocks[0].video_to_audio_attn.to_k.weight.numel() == 0
    # per block: 6 attentions x 4 projections + 2 feed-forwards x 2, and 4 concatenations (q/k/v x 2, k/v x 2)
    assert report.rules[fp8.STORE_RULE] == 2 * (24 + 4 + 4)
    assert max_rel_error(got, simulated) <= TOL, max_rel_error(got, simulated)
    # the tiny model's 16-wide rows: coarse steps
    assert 1e-3 < max_rel_error(got, exact) < 0.15, max_rel_error(got, exact)
    assert torch.equal(_ltx2_latents(pipe), exact)


def test_ltx2_a_perturbed_norm_fails_the_simulation(ltx2_runs, monkeypatch):
    from ltxbench.inject import ltx2 as inject_ltx2

    pipe, _, simulated = ltx2_runs
    original = reference.rms_norm_modulate_fp8
    monkeypatch.setattr(reference, "rms_norm_modulate_fp8",
                        lambda *a, **k: (lambda q, s: (q, s * 1.01))(*original(*a, **k)))
    with inject_ltx2.apply_kernels(pipe, "reference", precision="fp8"):
        got = _ltx2_latents(pipe)
    assert max_rel_error(got, simulated) > 10 * TOL, max_rel_error(got, simulated)


def test_ltx2_fp8_is_refused_before_anything_is_patched(ltx2_runs):
    from ltxbench.inject import ltx2 as inject_ltx2

    pipe, exact, _ = ltx2_runs
    attn = pipe.transformer.transformer_blocks[1].audio_attn2
    original = attn.to_v
    attn.to_v = torch.nn.Sequential(original)
    try:
        with pytest.raises(UsageError, match="transformer_blocks.1.audio_attn2: a projection is not a plain"):
            inject_ltx2.apply_kernels(pipe, "reference", precision="fp8")
    finally:
        attn.to_v = original
    assert torch.equal(_ltx2_latents(pipe), exact)  # nothing left patched


def test_every_fp8_projection_shares_one_patched_class(ltx2_runs):
    """Regional compile compiles one block and guards on its layers' classes: a class per layer would recompile the
    block for each of the 48 (what LTX-2 19B's optimized-fp8+compile first did)."""
    from ltxbench.inject import ltx2 as inject_ltx2

    pipe, _, _ = ltx2_runs
    blocks = pipe.transformer.transformer_blocks
    with inject_ltx2.apply_kernels(pipe, "reference", precision="fp8"):
        linears = {type(layer) for layer in _ltx2_block_projections(pipe.transformer)}
        feed_forwards = {type(block.ff) for block in blocks} | {type(block.audio_ff) for block in blocks}
    assert len(linears) == 1 and len(feed_forwards) == 1, (linears, feed_forwards)


def _accumulations(monkeypatch) -> list:
    """The fast_accumulation of every FP8 GEMM called from now on (through the reference provider)."""
    seen, original = [], reference.linear_fp8

    def recording(*args, fast_accumulation=False, **kwargs):
        seen.append(fast_accumulation if len(args) < 7 else args[6])
        return original(*args[:6], **kwargs)

    monkeypatch.setattr(reference, "linear_fp8", recording)
    return seen


@pytest.mark.parametrize("accumulation", [None, "fast", "fp32"])
def test_every_fp8_gemm_accumulates_as_the_injection_says(runs, ltx2_runs, monkeypatch, accumulation):
    """Both families: fast (the default) or fp32 reaches every FP8 GEMM, and a third value is refused."""
    from ltxbench.inject import ltx2 as inject_ltx2

    seen = _accumulations(monkeypatch)
    chosen = {} if accumulation is None else {"fp8_accumulation": accumulation}
    (pipe, embeddings, _, _), (ltx2_pipe, _, _) = runs, ltx2_runs
    with apply_kernels(pipe, "reference", precision="fp8", **chosen):
        ltx_generate(pipe, embeddings, 3.0)
    with inject_ltx2.apply_kernels(ltx2_pipe, "reference", precision="fp8", **chosen):
        _ltx2_latents(ltx2_pipe)
    assert seen and set(seen) == {accumulation != "fp32"}
    for inject in (apply_kernels, inject_ltx2.apply_kernels):
        with pytest.raises(UsageError, match="fp8_accumulation 'fp16' is not one of fast, fp32"):
            inject(pipe if inject is apply_kernels else ltx2_pipe, "reference", precision="fp8",
                   fp8_accumulation="fp16")


def test_ltx2_fp8_attention_runs_the_video_self_attention_in_fp8(ltx2_runs, monkeypatch):
    """precision="fp8-attention" on LTX-2 (cuDNN's backend, its emulation under the reference provider): the video
    self-attention of every block takes per-tensor FP8 q/k/v, q and k from the split q/k norm + RoPE kernel (a descale
    per batch element, all alike) and v quantized over the whole tensor; the latents stay within
    FP8 attention's error of "fp8", a 1% error in v's descale shows, the revert is exact."""
    import sys
    import types

    import torch.nn.functional as F

    from ltxbench.inject import ltx2 as inject_ltx2
    from ltxbench.ops import cudnn_fp8_attention as op

    pipe, exact, _ = ltx2_runs
    without_flash_attention_3(monkeypatch)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))  # importable: chosen; emulated on the CPU
    calls, emulated = [], op.emulated

    def recording(q, k, v, qd, kd, vd):
        calls.append((q.dtype, qd.shape, vd.shape))
        return emulated(q, k, v, qd, kd, vd)

    monkeypatch.setattr(op, "emulated", recording)
    with inject_ltx2.apply_kernels(pipe, "reference", precision="fp8"):
        fp8_only = _ltx2_latents(pipe)
    with inject_ltx2.apply_kernels(pipe, "reference", precision="fp8-attention") as report:
        got = _ltx2_latents(pipe)
    blocks = len(pipe.transformer.transformer_blocks)
    assert report.rules[inject_ltx2.ATTN1_FP8_RULE.format("cuDNN")] == blocks
    assert calls and len(calls) % blocks == 0 and all(c[0] == torch.float8_e4m3fn and c[1][1:] == (1,)
                                                      and c[2] == (1, 1) for c in calls)
    cosine = F.cosine_similarity(got.double(), fp8_only.double(), dim=0).item()
    assert 0.99 <= cosine < 1.0, cosine
    monkeypatch.setattr(op, "emulated", lambda q, k, v, qd, kd, vd: emulated(q, k, v, qd, kd, vd * 1.01))
    with inject_ltx2.apply_kernels(pipe, "reference", precision="fp8-attention"):
        assert max_rel_error(_ltx2_latents(pipe), got) > 1e-4
    assert torch.equal(_ltx2_latents(pipe), exact)
