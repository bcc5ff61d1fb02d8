"""LTX kernel injection: the mechanics on CPU with the reference provider, the kernels on GPU."""

import math

import pytest
import torch

from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.inject import ORIGINAL_CLASS
from ltxbench.inject.fuse import FUSED_ATTR, MOVES_RULE
from ltxbench.inject.ltx import (
    ATTN2_RULES,
    ATTN_FORWARD_RULE,
    CROSS_KV_RULE,
    MODEL_RULE,
    PAIRED_RULE,
    RESIDUAL_RULE,
    TUNED_GEMM_RULE,
    FusedLTXAttnProcessor,
    apply_kernels,
)
from ltxbench.inject.ltx.cfg import PAIRED_ATTR
from ltxbench.inject.ltx.cross_kv import CACHE_ATTR
from tests.helpers import count_calls, ltx_inputs, ltx_transformer, with_shifted_output

BLOCK_RULE = "block: rms_norm_modulate, gated_residual x2, add_rms_norm_modulate"


FEATURES = {  # apply_kernels keyword sets: the defaults, each optional part off, and the GELU kernel rule
    "defaults": {},
    "rope-tables": {"rope_from_coords": False},
    "no-fusion": {"fuse_projections": False, "gelu_epilogue": False},
    "gelu-kernel": {"gelu_epilogue": False, "gelu_tanh": True},
    "cross-attention-kernel": {"cross_attention": True},
    "torch-gemms": {"tuned_gemm": False},
}


@pytest.mark.parametrize("features", list(FEATURES))
def test_reference_provider_matches_unpatched_transformer(features):
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    kwargs = FEATURES[features]
    with torch.no_grad():
        expected = model(**inputs)[0]
        with apply_kernels(model, "reference", **kwargs) as report:
            assert report.rules.get("ff: gelu_tanh", 0) == (2 if kwargs.get("gelu_tanh") else 0)
            assert report.rules.get("attn1: one q/k/v GEMM", 0) == (2 if kwargs.get("fuse_projections", 1) else 0)
            assert report.rules[ATTN2_RULES[kwargs.get("cross_attention", False)]] == 2  # tiny: head dim 32
            got = model(**inputs)[0]
        assert not report.active
        assert not any(hasattr(b.attn1, FUSED_ATTR) for b in model.transformer_blocks)
        after = model(**inputs)[0]
    # the reference path is the unpatched math op for op (bit-exact on the CPU; the cross_attention twin differs
    # by ~5e-7): a wrong eps (1e-6 for 1e-5 in norm_q/norm_k moves the output by ~3e-6) must not pass
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert torch.equal(after, expected)


def test_cross_attention_kernel_only_where_diffusers_runs_its_default_backend(monkeypatch):
    """attn2 goes through ops.cross_attention with diffusers' default (native) backend; a backend chosen for the
    model or globally, or context parallelism, keeps dispatch_attention_fn. attn1 never uses it."""
    from diffusers.models.attention_dispatch import attention_backend

    from ltxbench.ops import reference

    model = ltx_transformer()
    inputs = ltx_inputs(model)
    calls, original = [], reference.cross_attention
    monkeypatch.setattr(reference, "cross_attention", lambda *a: calls.append(a[3]) or original(*a))

    def attn2_masks(backend=None):
        calls.clear()
        with torch.no_grad(), apply_kernels(model, "reference", cross_attention=True):
            for block in model.transformer_blocks:
                block.attn2.processor._attention_backend = backend
            model(**inputs)
        return list(calls)

    default = attn2_masks()
    assert len(default) == 2 and all(m.shape == (2, 2, 1, 7) for m in default)  # one per block, (B, heads, 1, L)
    assert attn2_masks("native") == []
    with attention_backend("_native_math"):
        assert attn2_masks() == []
    processor = FusedLTXAttnProcessor(reference, model.transformer_blocks[0].attn2.processor, cross_attention=True)
    assert processor._runs_own_cross_attention()
    processor._parallel_config = object()
    assert not processor._runs_own_cross_attention()


def test_cross_attention_by_default_only_at_the_head_dims_where_it_won():
    two_b, thirteen_b = ltx_transformer("ltx-2b", device="meta"), ltx_transformer("ltx-13b", device="meta")
    assert apply_kernels(two_b, "reference").rules[ATTN2_RULES[True]] == 28  # head dim 64
    assert apply_kernels(thirteen_b, "reference").rules[ATTN2_RULES[True]] == 48  # head dim 128
    tiny = ltx_transformer(device="meta")  # head dim 32: the scalar path, never measured faster: SDPA stays
    assert apply_kernels(tiny, "reference").rules[ATTN2_RULES[False]] == 2
    assert apply_kernels(ltx_transformer(device="meta"), "reference",
                         cross_attention=True).rules[ATTN2_RULES[True]] == 2
    assert apply_kernels(ltx_transformer("ltx-2b", device="meta"), "reference",
                         cross_attention=False).rules[ATTN2_RULES[False]] == 28


def test_fused_projections_are_used_and_keep_one_copy_of_the_weights(monkeypatch):
    model = ltx_transformer()
    attn1, attn2 = model.transformer_blocks[0].attn1, model.transformer_blocks[0].attn2
    with torch.no_grad(), apply_kernels(model, "reference"):
        (names1, fused1), (names2, _) = getattr(attn1, FUSED_ATTR), getattr(attn2, FUSED_ATTR)
        assert names1 == ("to_q", "to_k", "to_v") and names2 == ("to_k", "to_v")
        assert attn1.to_v.weight.untyped_storage().data_ptr() == fused1.weight.untyped_storage().data_ptr()
        calls = count_calls(monkeypatch, [(name, lin) for name, lin in (("q1", attn1.to_q), ("k1", attn1.to_k),
                                                                         ("v1", attn1.to_v), ("k2", attn2.to_k),
                                                                         ("v2", attn2.to_v))])
        model(**ltx_inputs(model))
    assert not calls  # every q/k/v of attn1 and k/v of attn2 came from the fused GEMMs


@pytest.mark.parametrize("fuse", [True, False])
def test_the_blocks_gemms_go_through_ops_linear_unless_turned_off(monkeypatch, fuse):
    """tuned_gemm: every projection of a block step runs ops.linear (the provider's): fused q/k/v (or the three
    layers), attn2's q, both out-projections, the feed-forward's up (GELU epilogue) and down; attn2's k/v come from
    the cross_kv cache; attn2's out-projection adds the residual stream in its GEMM. Off: none does, and the
    processor keeps torch's linear."""
    from ltxbench.ops import reference

    model = ltx_transformer()
    inputs = ltx_inputs(model)
    real, calls = reference.linear, []

    def spy(*args, **kwargs):
        calls.append((args[1].shape, len(args) > 4 and args[4] is not None))
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "linear", spy)
    with torch.no_grad():
        expected = model(**inputs)[0]
        with apply_kernels(model, "reference", fuse_projections=fuse) as report:
            got = model(**inputs)[0]
        per_block, blocks = 6 if fuse else 8, len(model.transformer_blocks)
        assert len(calls) == per_block * blocks, calls
        assert sum(residual for _, residual in calls) == blocks and report.rules[RESIDUAL_RULE] == blocks
        assert report.rules[TUNED_GEMM_RULE] == (4 if fuse else 7) * len(model.transformer_blocks)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        calls.clear()
        with apply_kernels(model, "reference", fuse_projections=fuse, tuned_gemm=False) as report:
            model(**inputs)
            assert model.transformer_blocks[0].attn1.processor.linear is torch.nn.functional.linear
        assert calls == [] and TUNED_GEMM_RULE not in report.rules and RESIDUAL_RULE not in report.rules


def test_attn2_takes_the_residual_into_its_gemm_only_where_that_is_the_same_math(monkeypatch):
    """The residual goes into the out-projection's GEMM only through our processor and forward, with a plain Linear
    and no active dropout; with a gradient wanted the processor adds it with torch (ops.linear has no backward)."""
    from ltxbench.inject.ltx.attention import attention_forward, takes_residual

    model = ltx_transformer()
    attn2 = model.transformer_blocks[0].attn2
    assert not takes_residual(attn2)  # diffusers' processor
    with apply_kernels(model, "reference"):
        assert takes_residual(attn2)
        attn2.to_out[1].p = 0.5
        attn2.to_out[1].train()  # active dropout comes before the residual add: not the GEMM's beta = 1
        assert not takes_residual(attn2)
        attn2.to_out[1].eval()
        assert takes_residual(attn2)
        attn2.forward = attention_forward.__get__(attn2)  # an instance-level wrapper (hooks): left to itself
        assert not takes_residual(attn2)
        del attn2.forward
        h, text = torch.randn(2, 5, attn2.query_dim, requires_grad=True), torch.randn(2, 3, attn2.cross_attention_dim)
        got = attn2(h, encoder_hidden_states=text, residual=h)
        assert got.requires_grad
        torch.testing.assert_close(got, h + attn2(h, encoder_hidden_states=text))
    with apply_kernels(model, "reference", tuned_gemm=False):
        assert not takes_residual(attn2)


def test_tuned_gemms_leave_wrapped_layers_and_autograd_to_torch(monkeypatch):
    """A Linear subclass (a LoRA-style wrapper with its own math) keeps its forward, reported; with gradients wanted
    the patched layers run torch's linear (ops.linear has no backward)."""
    from ltxbench.ops import reference

    class ScaledLinear(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = ltx_transformer()
    block = model.transformer_blocks[0]
    old = block.ff.net[2]
    block.ff.net[2] = ScaledLinear(old.in_features, old.out_features)
    calls = []
    real = reference.linear
    monkeypatch.setattr(reference, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    with apply_kernels(model, "reference") as report:
        assert type(block.ff.net[2]) is ScaledLinear
        assert any(t == TUNED_GEMM_RULE and "ScaledLinear" in r for t, r in report.skipped)
        x = torch.randn(2, 5, block.attn1.to_out[0].in_features)
        out = block.attn1.to_out[0](x)  # patched, parameters require grad, grad mode on
        assert out.requires_grad and calls == []
        with torch.no_grad():
            block.attn1.to_out[0](x)
        assert calls == [1]
        # The fused q/k/v GEMM too: an input that wants a gradient (frozen weights) goes to torch's linear.
        model.requires_grad_(False)
        xq = torch.randn(2, 5, block.attn1.to_q.in_features, requires_grad=True)
        qkv = block.attn1.processor.linear(xq, block.attn1.to_q.weight, block.attn1.to_q.bias)
        assert qkv.requires_grad and calls == [1]


def test_injected_transformer_compiles_without_graph_breaks():
    """The optimized+compile configuration: dynamo sees the whole patched forward as one graph."""
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad(), apply_kernels(model, "reference"):
        explained = torch._dynamo.explain(model)(**inputs)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_compiled_patched_transformer_follows_a_weight_swapped_through_data():
    """`to_k.weight.data = new` after injection and compile (a weight swap that keeps the Parameter): the compiled
    patched transformer must compute with the new weight, as the unpatched one does, not with the fused copy."""
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    attn = model.transformer_blocks[0].attn1
    swapped = torch.randn_like(attn.to_k.weight)
    with torch.no_grad(), apply_kernels(model, "reference"):
        compiled = torch.compile(model, backend="eager")
        before = compiled(**inputs)[0]
        attn.to_k.weight.data = swapped.clone()
        after = compiled(**inputs)[0]
    model._compiled_call_impl = None
    with torch.no_grad():
        expected = model(**inputs)[0]  # unpatched, with the swapped weight
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_per_token_modulation_of_image_to_video_blocks():
    """I2V/condition pipelines give every token its own timestep: temb is (B, S, 6D), not (B, 1, 6D)."""
    model = ltx_transformer()
    block = model.transformer_blocks[0]
    b, s, d = 2, 12, model.config.num_attention_heads * model.config.attention_head_dim
    g = torch.Generator().manual_seed(2)
    h, enc = torch.randn(b, s, d, generator=g), torch.randn(b, 5, d, generator=g)
    temb = 0.1 * torch.randn(b, s, 6 * d, generator=g)
    rope = model.rope(h, 1, 3, 4, (8 / 25, 32, 32))
    with torch.no_grad():
        expected = block(h, enc, temb, rope)
        with apply_kernels(model, "reference"):
            got = block(h, enc, temb, rope)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_per_token_timesteps_through_the_chained_model_forward():
    """Condition pipelines pass a timestep per token (B, S): the model forward's modulation goes block by block."""
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    tokens = inputs["hidden_states"].shape[1]
    inputs["timestep"] = torch.linspace(0.0, 900.0, 2 * tokens).reshape(2, tokens)
    with torch.no_grad():
        expected = model(**inputs)[0]
        with apply_kernels(model, "reference") as report:
            assert report.rules[MODEL_RULE] == 1
            got = model(**inputs)[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_rope_from_coords_hands_the_kernels_a_contiguous_grid():
    """diffusers builds the grid as a transposed view; made contiguous once per forward, not copied per attn1 call."""
    model = ltx_transformer()
    h = ltx_inputs(model)["hidden_states"]
    diffusers_grid = model.rope._prepare_video_coords(2, 3, 4, 6, (8 / 25, 32, 32), h.device)
    with apply_kernels(model, "reference"):
        grid, freqs = model.rope(h, 3, 4, 6, (8 / 25, 32, 32))
    assert not diffusers_grid.is_contiguous()
    assert grid.is_contiguous() and freqs.is_contiguous() and torch.equal(grid, diffusers_grid)


def test_report_counts_on_the_2b_structure_and_revert_restores_everything():
    model = ltx_transformer("ltx-2b", device="meta")
    processors = [(b.attn1.processor, b.attn2.processor) for b in model.transformer_blocks]
    report = apply_kernels(model, "reference")
    assert dict(report.rules) == {"rope: angles from coordinates": 1, MODEL_RULE: 1, BLOCK_RULE: 28,
                                  "attn1: qk_rms_norm_rope": 28, ATTN2_RULES[True]: 28,
                                  "attn1: one q/k/v GEMM": 28, "attn2: one k/v GEMM": 28,
                                  "ff: up-projection + GELU-tanh as one GEMM (epilogue)": 28,
                                  ATTN_FORWARD_RULE: 56, CROSS_KV_RULE: 1, RESIDUAL_RULE: 28, PAIRED_RULE: 1,
                                  TUNED_GEMM_RULE: 28 * 4,  # attn1/attn2 to_out, attn2 to_q, ff down
                                  MOVES_RULE: 56}  # the two fused sets of each block follow .to()
    skipped = {t for t, _ in report.skipped}
    assert {"VAE RMSNorm"} <= skipped
    assert all(isinstance(b.attn1.processor, FusedLTXAttnProcessor) for b in model.transformer_blocks)
    assert report.as_dict()["applied"] is True
    from diffusers.models.transformers.transformer_ltx import LTXAttention, LTXVideoTransformerBlock

    assert type(model.transformer_blocks[0]) is not LTXVideoTransformerBlock  # patched through a subclass
    report.revert()
    assert "forward" not in vars(model.rope) and "forward" not in vars(model) and CACHE_ATTR not in vars(model)
    assert PAIRED_ATTR not in vars(model)
    assert not any(ORIGINAL_CLASS in vars(type(m)) for m in model.modules())
    assert type(model.transformer_blocks[0]) is LTXVideoTransformerBlock
    assert type(model.transformer_blocks[0].attn1) is LTXAttention
    assert type(model.transformer_blocks[0].ff.net[2]) is torch.nn.Linear
    for block, (p1, p2) in zip(model.transformer_blocks, processors, strict=True):
        assert "forward" not in vars(block) and block.attn1.processor is p1 and block.attn2.processor is p2
        assert not hasattr(block.attn1, FUSED_ATTR) and "forward" not in vars(block.ff.net[0])
        assert "_apply" not in vars(block.attn1) and "_apply" not in vars(block.attn2)


def test_a_hooked_model_forward_is_left_alone_and_reported():
    model = ltx_transformer()
    hooked = model.forward  # what accelerate / context-parallel hooks leave: an instance-level forward
    model.forward = hooked
    with apply_kernels(model, "reference") as report:
        assert model.forward is hooked and MODEL_RULE not in report.rules and report.rules[BLOCK_RULE] == 2
        assert any("already wrapped" in reason for _, reason in report.skipped)


def test_attention_forward_skips_the_signature_check_but_extra_kwargs_take_the_original_path(monkeypatch):
    import inspect

    model = ltx_transformer()
    attn = model.transformer_blocks[0].attn1
    h = torch.randn(2, 12, model.config.num_attention_heads * model.config.attention_head_dim)
    calls = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad(), apply_kernels(model, "reference"):
        plain = attn(h)
        assert not calls  # diffusers' forward inspects the processor on every call; ours does not
        with_extra = attn(h, unknown_kwarg=1)  # the original forward: filtered out, with diffusers' warning
        assert calls
    torch.testing.assert_close(with_extra, plain)
    with torch.no_grad():
        torch.testing.assert_close(attn(h), plain, atol=1e-6, rtol=0)


def test_attn2_mask_is_prepared_once_per_forward(monkeypatch):
    from diffusers.models.transformers.transformer_ltx import LTXAttention

    model = ltx_transformer(num_layers=3)
    inputs = ltx_inputs(model)  # a padded prompt: a real additive mask
    calls = []
    prepare = LTXAttention.prepare_attention_mask
    monkeypatch.setattr(LTXAttention, "prepare_attention_mask", lambda *a, **k: calls.append(1) or prepare(*a, **k))
    with torch.no_grad():
        expected = model(**inputs)[0]
        assert len(calls) == 3  # diffusers: once per block
        calls.clear()
        with apply_kernels(model, "reference"):
            got = model(**inputs)[0]
        assert len(calls) == 1
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_an_attention_whose_forward_is_not_the_processor_shim_keeps_it():
    from diffusers.models.transformers.transformer_ltx import LTXAttention

    class Custom(LTXAttention):
        def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
            return 2 * super().forward(hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)

    model = ltx_transformer()
    model.transformer_blocks[0].attn1.__class__ = Custom
    with apply_kernels(model, "reference") as report:
        assert report.rules[ATTN_FORWARD_RULE] == 3  # the other three attentions of the two blocks
        assert any(t == "transformer_blocks.0.attn1 forward" for t, _ in report.skipped)
        assert type(model.transformer_blocks[0].attn1) is Custom


def test_processor_keeps_attention_backend_and_parallel_config():
    model = ltx_transformer()
    original = model.transformer_blocks[0].attn1.processor
    original._attention_backend, original._parallel_config = "native", object()
    with apply_kernels(model, "reference"):
        ours = model.transformer_blocks[0].attn1.processor
        assert ours._attention_backend == "native" and ours._parallel_config is original._parallel_config


def test_cuda_provider_refuses_a_cpu_model_and_non_ltx_targets():
    with pytest.raises(EnvironmentProblem, match="needs the transformer on a CUDA device"):
        apply_kernels(ltx_transformer(), "cuda")
    with pytest.raises(UsageError, match="expects an LTX pipeline"):
        apply_kernels(torch.nn.Linear(2, 2), "reference")


@pytest.mark.gpu
@pytest.mark.parametrize("rope_from_coords", [True, False])
def test_cuda_provider_on_a_two_layer_2b_width_model(rope_from_coords):
    model = ltx_transformer("ltx-2b", num_layers=2, device="cuda", dtype=torch.bfloat16)
    inputs = ltx_inputs(model, "cuda", torch.bfloat16, frames=3, height=8, width=12)
    with torch.no_grad():
        expected = model(**inputs)[0].float()
        with apply_kernels(model, "cuda", rope_from_coords=rope_from_coords):
            got = model(**inputs)[0].float()
            compiled = torch.compile(model)(**inputs)[0].float()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0).item()
    assert cos >= 0.999, cos
    assert torch.nn.functional.cosine_similarity(compiled.flatten(), got.flatten(), dim=0).item() >= 0.999


@pytest.mark.gpu
@pytest.mark.parametrize("cross_attention", [True, False])
def test_cuda_provider_in_fp32_is_the_unpatched_math(cross_attention):
    """In fp32 (no TF32 anywhere: cuBLASLt and torch's matmuls both run full fp32) the cuda kernels compute what the
    unpatched model does to rounding, so an error the bf16 cosine checks cannot see (a wrong eps moves the output
    by ~3e-6, a dropped gate or a swapped shift by O(1)) fails here."""
    model = ltx_transformer(num_layers=2, device="cuda", dtype=torch.float32)
    inputs = ltx_inputs(model, "cuda", torch.float32, frames=3, height=8, width=12)
    assert not torch.backends.cuda.matmul.allow_tf32
    with torch.no_grad():
        expected = model(**inputs)[0]
        with apply_kernels(model, "cuda", cross_attention=cross_attention) as report:
            assert report.rules[ATTN2_RULES[cross_attention]] == 2
            got = model(**inputs)[0]
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
def test_full_2b_random_pipeline_latents_after_10_steps_and_decoded_frames_match_unpatched():
    """Issue numerics check: LTX-2B, random weights, bf16, 512x768, 49 frames, CFG, 10 steps, cuda provider:
    latents cosine >= 0.999 against the unpatched pipeline, and the PSNR of the VAE-decoded frames."""
    from ltxbench.models.ltx_build import build_pipeline
    from ltxbench.models.ltx_run import decode as _decode

    pipe = build_pipeline("ltx-2b", "random", "cuda", "bf16")
    pipe.set_progress_bar_config(disable=True)

    def latents_and_frames():
        out = pipe("a red fox running through fresh snow", negative_prompt="blurry", num_frames=49, height=512,
                   width=768, num_inference_steps=10, guidance_scale=3.0, output_type="latent",
                   generator=torch.Generator("cuda").manual_seed(42))
        video = _decode(pipe, out.frames, 49, 512, 768, torch.Generator("cuda").manual_seed(7))
        return out.frames.float(), (video.float().clamp(-1, 1) + 1) / 2  # frames in [0, 1], as postprocessing

    with torch.no_grad():
        expected, expected_frames = latents_and_frames()
        with apply_kernels(pipe, "cuda"):
            got, got_frames = latents_and_frames()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0).item()
    mse = (got_frames - expected_frames).pow(2).mean().item()
    psnr = 10 * math.log10(1.0 / mse) if mse > 0 else math.inf
    print(f"2B latents after 10 steps: cosine {cos:.6f}, max abs diff {(got - expected).abs().max().item():.4g}; "
          f"decoded frames PSNR {psnr:.2f} dB")
    assert cos >= 0.999, cos
    assert psnr >= 30.0, psnr


def test_injection_stays_active_under_accelerate_offload_hooks(monkeypatch):
    """enable_model_cpu_offload wraps the transformer's forward with an accelerate hook after injection;
    the hook must call through to the fused forward, not to the class's original one."""
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    from ltxbench.ops import reference

    calls = []
    original = reference.add_rms_norm_modulate
    monkeypatch.setattr(reference, "add_rms_norm_modulate", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
        with apply_kernels(model, "reference"):
            add_hook_to_module(model, ModelHook())
            got = model(**inputs)[0]
            remove_hook_from_module(model)
        assert len(calls) == len(model.transformer_blocks) - 1  # the chained ff residuals (attn2's in its GEMM)
        assert "forward" not in vars(model) and not any(ORIGINAL_CLASS in vars(type(m)) for m in model.modules())
        calls.clear()
        after = model(**inputs)[0]
    assert not calls and torch.equal(after, expected)  # reverted: the unpatched model again
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_a_second_injection_is_refused_and_one_revert_restores_the_model():
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
        first = apply_kernels(model, "reference")
        second = apply_kernels(model, "reference")
        assert first.active and not second.rules and not second.as_dict()["applied"]
        assert any("patched by ltxbench already" in reason for _, reason in second.skipped)
        second.revert()
        first.revert()
        assert not any(ORIGINAL_CLASS in vars(type(m)) for m in model.modules())
        assert not any(isinstance(b.attn1.processor, FusedLTXAttnProcessor) for b in model.transformer_blocks)
        assert CACHE_ATTR not in vars(model) and PAIRED_ATTR not in vars(model)
        assert torch.equal(model(**inputs)[0], expected)


def test_linear_gelu_tanh_refuses_cpu_tensors_and_mismatched_shapes():
    from ltxbench import ops

    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        ops.linear_gelu_tanh(torch.randn(2, 4), torch.randn(3, 4), torch.randn(3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_gelu_tanh_is_the_tanh_gelu_of_the_projection(dtype):
    """The cuBLASLt epilogue must be GELU-tanh (LTX's), not the erf GELU; odd sizes, a strided input."""
    from ltxbench import ops

    g = torch.Generator("cuda").manual_seed(0)
    x = (2 * torch.randn(7, 83, 2 * 72, device="cuda", generator=g))[..., ::2].to(dtype)  # last-dim strided
    w = (torch.randn(769, 72, device="cuda", generator=g) / 8).to(dtype)
    b = torch.randn(769, device="cuda", generator=g).to(dtype)
    pre = x.double() @ w.double().t() + b.double()
    got = ops.linear_gelu_tanh(x, w, b).double()
    eager = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh").double()
    tanh_err = (got - torch.nn.functional.gelu(pre, approximate="tanh")).abs().max().item()
    eager_err = (eager - torch.nn.functional.gelu(pre, approximate="tanh")).abs().max().item()
    erf_gap = (got - torch.nn.functional.gelu(pre)).abs().max().item()
    assert got.shape == (7, 83, 769)
    assert tanh_err <= 2 * eager_err + 1e-5, (tanh_err, eager_err)
    if dtype == torch.float32:
        assert tanh_err < 1e-4 < erf_gap, (tanh_err, erf_gap)


@pytest.mark.parametrize("compiling", [False, True])
def test_linear_gelu_tanh_is_an_op_with_a_fake_for_compile_and_a_direct_call_outside(monkeypatch, compiling):
    """Inside torch.compile the op (opaque to inductor, with its fake); outside, torch's binding directly (the custom
    op's Python dispatch was host time the eager LTX step could not spare)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ltxbench import ops
    from ltxbench.ops import gemm

    through_op = []
    real_op = gemm._linear_gelu_tanh
    monkeypatch.setattr(gemm, "_linear_gelu_tanh", lambda *a: through_op.append(1) or real_op(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    with FakeTensorMode():
        x = torch.empty(2, 5, 8, device="cuda", dtype=torch.bfloat16)
        w, b = torch.empty(24, 8, device="cuda", dtype=torch.bfloat16), torch.empty(24, device="cuda",
                                                                                   dtype=torch.bfloat16)
        out = ops.linear_gelu_tanh(x, w, b)
        by_op = torch.ops.ltxbench.linear_gelu_tanh(x, w, b)  # the fake, whatever the mode
    assert bool(through_op) == compiling
    for t in (out, by_op):
        assert t.shape == (2, 5, 24) and t.dtype == torch.bfloat16 and t.device.type == "cuda"


@pytest.mark.gpu
def test_linear_gelu_tanh_opcheck():
    from ltxbench import ops

    g = torch.Generator("cuda").manual_seed(0)
    x, w, b = (torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)
               for shape in ((3, 7, 64), (96, 64), (96,)))
    torch.library.opcheck(torch.ops.ltxbench.linear_gelu_tanh.default, (x, w, b))
    compiled = torch.compile(ops.linear_gelu_tanh, fullgraph=True)(x, w, b)
    torch.testing.assert_close(compiled, ops.linear_gelu_tanh(x, w, b))


@pytest.mark.parametrize("layer", ["attn1.to_q", "ff.net.0.proj"])
def test_a_hook_put_on_a_projection_after_the_injection_runs(layer):
    """The fused q/k/v GEMM and the up-projection + GELU epilogue read the projections' weights: a forward hook put on
    one of them after the injection (a probe, an adapter's hook) must still run, so that call takes the layer itself."""
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    proj = model.transformer_blocks[0].get_submodule(layer)

    def call():
        with torch.no_grad():
            return with_shifted_output(proj, lambda: model(**inputs)[0])

    expected = call()
    with apply_kernels(model, "reference"):
        got = call()
    with torch.no_grad():
        unhooked = model(**inputs)[0]
    assert (expected - unhooked).abs().max() > 1e-2  # the hook matters
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_hook_on_the_out_projection_keeps_the_residual_out_of_its_gemm():
    """attn2's out-projection adds the residual in its GEMM (beta = 1) only while nothing observes the layer."""
    from ltxbench.inject.ltx.attention import takes_residual

    model = ltx_transformer()
    attn2 = model.transformer_blocks[0].attn2
    with apply_kernels(model, "reference"):
        assert takes_residual(attn2)
        handle = attn2.to_out[0].register_forward_hook(lambda module, args, out: out)
        assert not takes_residual(attn2)
        handle.remove()
        assert takes_residual(attn2)
