"""What the test modules of several areas share: the tiny models and inputs they patch, the generations they compare,
the error measures, the command lines of the tiny runs, and the programs they launch as processes (tests/workers/).
Test modules import from here, never from one another (tests/test_layout.py checks it); fixtures are in conftest.py.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import json
import os
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "workers"  # the ranks torch's launcher starts, the compute-sanitizer workload

# the provenance of a clean checkout, as ltxbench.results.provenance reports it (the manifest's tests)
CLEAN_HEAD = {"sha": "a" * 40, "dirty": False, "diff_sha256": None, "code": "c" * 64, "source": "git"}
REQUIRE_GPU_MESSAGE = "make test-gpu needs an NVIDIA GPU: none is visible (torch.cuda.is_available() is False)"

# The tiny LTX-Video run on the CPU: generate's options, and bench e2e's command with the reference ops.
LTX_TINY = ["--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
            "--width", "64", "--steps", "2"]
BENCH_E2E_LTX_TINY = ["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--num-frames",
                      "9", "--height", "64", "--width", "64", "--steps", "2", "--warmup-iterations", "1", "--repeats",
                      "2", "--kernel-provider", "reference"]


def without_flash_attention_3(monkeypatch) -> None:
    """Neither FlashAttention-3 package imports (a None in sys.modules makes an import raise ImportError)."""
    from ltxbench.inject.attention_backend import FA3_MODULES

    for name in FA3_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


# --- error measures ----------------------------------------------------------------------------------------------

def count_calls(monkeypatch, modules) -> Counter:
    """Calls of each (key, module) in `modules`, counted under its key from nn.Module's call path rather than by a
    hook: a hook would itself make a GEMM standing for its layer step aside (ltxbench.inject.fuse.unobserved)."""
    keys = {id(module): key for key, module in modules}
    counts: Counter = Counter()
    call = torch.nn.Module._call_impl

    def counted(self, *args, **kwargs):
        if id(self) in keys:
            counts[keys[id(self)]] += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "_call_impl", counted)
    return counts


def with_shifted_output(module, run):
    """run() while a forward hook adds 0.5 to `module`'s output (a probe or an adapter's hook put on after an
    injection; a shift, not a scale: a q projection goes through an RMSNorm next, which a scale would not move)."""
    handle = module.register_forward_hook(lambda _module, _args, out: out + 0.5)
    try:
        return run()
    finally:
        handle.remove()


def _pairs(got, expected):
    """(got, expected) of one tensor, or of each pair of tensors (an LTX-2 call's video and audio)."""
    if torch.is_tensor(got):
        return [(got, expected)]
    return list(zip(got, expected, strict=True))


def max_abs_error(got, expected) -> float:
    """max |got - expected|, the largest over the pairs of tensors."""
    return max((g - e).abs().max().item() for g, e in _pairs(got, expected))


def max_rel_error(got, expected) -> float:
    """max |got - expected| / max |expected|, the largest over the pairs of tensors."""
    return max(((g - e).abs().max() / e.abs().max()).item() for g, e in _pairs(got, expected))


# --- LTX-Video -------------------------------------------------------------------------------------------------

def ltx_transformer(model="ltx-tiny", num_layers=None, device="cpu", dtype=torch.float32):
    """An LTX-Video transformer of a preset's config (seed 0) with non-trivial modulation tables and norm weights."""
    from diffusers import LTXVideoTransformer3DModel

    from ltxbench.models.ltx_build import component_configs

    cfg = {k: v for k, v in component_configs(model)["transformer"].items() if not k.startswith("_")}
    if num_layers:
        cfg["num_layers"] = num_layers
    torch.manual_seed(0)
    with torch.device(device):
        model = LTXVideoTransformer3DModel(**cfg).to(dtype).eval()
    with torch.no_grad():  # non-trivial modulation tables and norm weights (the defaults are ones/zeros-ish)
        for name, p in model.named_parameters():
            if "scale_shift_table" in name or "norm_q" in name or "norm_k" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def ltx_inputs(model, device="cpu", dtype=torch.float32, frames=3, height=4, width=6, batch=2, text=7):
    """One LTX-Video transformer call's keyword arguments: a guidance pair, the first prompt padded."""
    g = torch.Generator().manual_seed(1)
    cfg = model.config
    s = frames * height * width

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    mask = torch.ones(batch, text, device=device)
    mask[0, -2:] = 0  # a padded prompt: attn2 gets a real additive mask
    return {"hidden_states": rand(batch, s, cfg.in_channels),
            "encoder_hidden_states": rand(batch, text, cfg.caption_channels),
            "timestep": torch.tensor([500.0, 20.0], device=device), "encoder_attention_mask": mask,
            "num_frames": frames, "height": height, "width": width, "rope_interpolation_scale": (8 / 25, 32, 32),
            "return_dict": False}


def ltx_pipeline():
    """The ltx-tiny pipeline (random weights, CPU, fp32) with modulation of the size trained models carry."""
    from ltxbench.models.ltx_build import build_pipeline

    pipe = build_pipeline("ltx-tiny", "random", "cpu", "fp32")
    pipe.set_progress_bar_config(disable=True)
    model = pipe.transformer
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # modulation of the size trained models carry (test_inject_mutations says why)
        for table in [b.scale_shift_table for b in model.transformer_blocks] + [model.scale_shift_table]:
            table.copy_(0.3 * torch.randn(table.shape, generator=g))
        temb, _ = model.time_embed(torch.tensor([1000.0]), batch_size=1, hidden_dtype=torch.float32)
        model.time_embed.linear.weight.mul_(0.5 / temb.std())
    return pipe


def ltx_embeddings(pipe):
    """Prompt embeddings and their mask for ltx_generate: one prompt of 8 tokens, the last two padding."""
    channels = pipe.transformer.config.caption_channels
    embeds = torch.randn(1, 8, channels, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 8)
    mask[:, -2:] = 0  # a padded prompt
    return embeds, mask


def ltx_generate(pipe, embeddings, guidance: float, **kwargs):
    """The latents of a 3-step generation from the prompt embeddings (or, with embeddings None, from text)."""
    if embeddings is None:
        prompts = {"prompt": "a red fox in fresh snow", "negative_prompt": "blurry"}
    else:
        embeds, mask = embeddings
        prompts = {"prompt_embeds": embeds, "prompt_attention_mask": mask}
        if guidance > 1:
            prompts.update(negative_prompt_embeds=-embeds, negative_prompt_attention_mask=mask)
    with torch.no_grad():
        return pipe(**prompts, num_frames=9, height=64, width=64, num_inference_steps=3, guidance_scale=guidance,
                    generator=torch.Generator().manual_seed(0), output_type="latent", **kwargs).frames


def ltx_2b_two_blocks():
    """LTX-2B's width and heads cut to 2 blocks, with trained-model modulation magnitudes, and a guidance pair of
    inputs at 49 frames 512x768: (model, inputs). On the GPU, bf16."""
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):  # LTX-2B's width and heads, 2 blocks; trained-model modulation magnitudes
        model = LTXVideoTransformer3DModel(num_layers=2).to(torch.bfloat16).eval().requires_grad_(False)
    with torch.no_grad():
        for block in model.transformer_blocks:
            block.scale_shift_table.normal_(0, 0.3)
    gen = torch.Generator("cuda").manual_seed(1)
    frames, height, width = 7, 16, 24  # 49 frames 512x768
    inputs = dict(hidden_states=torch.randn(2, frames * height * width, 128, device="cuda", generator=gen),
                  encoder_hidden_states=torch.randn(2, 128, 4096, device="cuda", generator=gen),
                  timestep=torch.full((2,), 900.0, device="cuda"),
                  encoder_attention_mask=torch.ones(2, 128, device="cuda"),
                  num_frames=frames, height=height, width=width, return_dict=False)
    inputs = {k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v
              for k, v in inputs.items()}
    return model, inputs


# --- LTX-2 -----------------------------------------------------------------------------------------------------

LTX2_GENERATE = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=9, height=64, width=64,
                     num_inference_steps=2, output_type="latent", return_dict=False)


def realistic_modulation(transformer, scale: float = 0.7, seed: int = 1) -> None:
    """Random weights at init scale damp every error (LTX-2's modulation tables start at 1/sqrt(D)): give the tables
    the O(1) magnitudes of a trained model's scales, shifts and gates, so that a wrong formula shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if "scale_shift_table" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)


def build_ltx2_tiny():
    """A fresh ltx2-tiny pipeline (random weights, seed 0; CPU, fp32) with realistic modulation tables."""
    from ltxbench.models import ltx2_build

    pipe = ltx2_build.build_pipeline("ltx2-tiny", "random", "cpu", torch.float32, seed=0)
    realistic_modulation(pipe.transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ltx2_generate(pipe, **overrides):
    """The (video, audio) latents of LTX2_GENERATE's 2-step generation, with `overrides`."""
    with torch.no_grad():
        return pipe(**{**LTX2_GENERATE, **overrides}, generator=torch.Generator("cpu").manual_seed(3))


def ltx2_transformer(num_layers: int = 6):
    """ltx2-tiny's transformer with `num_layers` blocks (seed 0; CPU, fp32), realistic modulation tables."""
    from diffusers import LTX2VideoTransformer3DModel

    from ltxbench.models.ltx2_build import component_configs

    torch.manual_seed(0)
    config = {**component_configs("ltx2-tiny")["transformer"], "num_layers": num_layers}
    model = LTX2VideoTransformer3DModel.from_config(config).eval().requires_grad_(False)
    realistic_modulation(model)
    return model


def ltx2_inputs(transformer, batch=2, per_token=False):
    """One transformer call's inputs at 9 frames 64x64 (3 latent frames, 2x2 tokens each) and 16 text tokens."""
    gen = torch.Generator().manual_seed(5)
    config = transformer.config
    video_tokens, audio_tokens = 3 * 2 * 2, 5
    timestep = torch.rand(batch, generator=gen) * 1000
    if per_token:  # image-to-video: frame 0's tokens conditioned (timestep 0)
        timestep = timestep[:, None].repeat(1, video_tokens)
        timestep[:, :4] = 0
    return dict(
        hidden_states=torch.randn(batch, video_tokens, config.in_channels, generator=gen),
        audio_hidden_states=torch.randn(batch, audio_tokens, config.audio_in_channels, generator=gen),
        encoder_hidden_states=torch.randn(batch, 16, config.caption_channels, generator=gen),
        audio_encoder_hidden_states=torch.randn(batch, 16, config.caption_channels, generator=gen),
        encoder_attention_mask=torch.ones(batch, 16), audio_encoder_attention_mask=torch.ones(batch, 16),
        timestep=timestep, audio_timestep=timestep if not per_token else timestep[:, 0],
        num_frames=3, height=2, width=2, fps=24.0, audio_num_frames=audio_tokens, return_dict=False)


def ltx2_call(transformer, **overrides):
    """One transformer call on ltx2_inputs, with `overrides`."""
    with torch.no_grad():
        return transformer(**{**ltx2_inputs(transformer), **overrides})


def ltx2_cuda_transformer(model: str, dtype, num_layers: int = 2):
    """A preset's LTX-2 transformer cut to `num_layers` blocks, on the GPU, with trained-model modulation."""
    from diffusers import LTX2VideoTransformer3DModel

    from ltxbench.models.ltx2_build import component_configs

    config = {**component_configs(model)["transformer"], "num_layers": num_layers}
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LTX2VideoTransformer3DModel.from_config(config).to(dtype).eval().requires_grad_(False)
    gen = torch.Generator("cuda").manual_seed(1)
    with torch.no_grad():  # trained-model magnitudes for the modulation (init's 1/sqrt(D) would damp every error)
        for name, param in model.named_parameters():
            if "scale_shift_table" in name:
                param.copy_(torch.randn(param.shape, device="cuda", generator=gen) * 0.7)
    return model


def ltx2_cuda_inputs(model, case: str, frames: int = 16, height: int = 16, width: int = 24, text: int = 1024,
                     audio: int = 126):
    """Latent sizes (121 frames 512x768 by default: 16 x 16 x 24), fp32 inputs; batch 2 (a guidance pair) except
    for the isolated pass, which the pipeline runs on the positive half."""
    config = model.config
    gen = torch.Generator("cuda").manual_seed(2)
    batch = 1 if case == "isolated" else 2
    tokens = frames * height * width

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    timestep = torch.full((batch,), 700.0, device="cuda")
    video_timestep = timestep
    if case == "i2v":  # the image's latent frame conditioned: its tokens at timestep 0
        video_timestep = timestep[:, None].repeat(1, tokens)
        video_timestep[:, : height * width] = 0
    return dict(hidden_states=randn(batch, tokens, config.in_channels),
                audio_hidden_states=randn(batch, audio, config.audio_in_channels),
                encoder_hidden_states=randn(batch, text, config.caption_channels),
                audio_encoder_hidden_states=randn(batch, text, config.caption_channels),
                encoder_attention_mask=torch.ones(batch, text, device="cuda"),
                audio_encoder_attention_mask=torch.ones(batch, text, device="cuda"),
                timestep=video_timestep, audio_timestep=timestep, num_frames=frames, height=height, width=width,
                fps=24.0, audio_num_frames=audio, isolate_modalities=case == "isolated", return_dict=False)


def cast_floats(inputs: dict, dtype) -> dict:
    """The floating-point tensors of `inputs` in `dtype`, the timesteps left as they are."""
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() and "timestep" not in k else v
            for k, v in inputs.items()}


# --- LLMs ------------------------------------------------------------------------------------------------------

# rms_norm_eps 1e-5, not the ops' default 1e-6: a rule that dropped the model's eps would be seen
LLM_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
                tie_word_embeddings=False)
LLM_FAMILY_EXTRA = {
    "llama": {},
    "mistral": {"sliding_window": 6},  # shorter than the prompt: the window matters
    "qwen2": {},
    "qwen3": {"head_dim": 16},
}


def llm_build(model_type: str, dtype=torch.float32, device="cpu", **overrides):
    """A tiny causal LM of `model_type` (LLM_TINY's sizes, seed 0) with non-trivial norm weights, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **{**LLM_TINY, **LLM_FAMILY_EXTRA.get(model_type, {}), **overrides})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():  # non-trivial norm weights, so a dropped or misplaced weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return model.eval()


def gemma_build(dtype=torch.float32, device="cpu"):
    """The gemma-3-tiny preset (3 layers: sliding, global, sliding; window 8) with norm weights of a trained model's
    size: Gemma scales by `1 + weight`, so the zeros it is initialized with would hide a dropped `1 +`."""
    from ltxbench.models.llm_build import build_llm

    model = build_llm("gemma-3-tiny", "random", device, dtype, seed=0)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1 + 1.5 * torch.randn(p.shape, generator=g)).to(p.dtype))
    return model


def llm_prompt(batch=2, length=12):
    """Token ids for llm_build's models (seed 1)."""
    return torch.randint(0, LLM_TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


# --- parallel configs -------------------------------------------------------------------------------------------

def llm_decode_steps(model, compiled: bool, device="cpu", count: int = 3, mode: str | None = None):
    """The logits of `count` decode steps after a 6-token prompt (batch 2) on a StaticCache of 12, the steps compiled
    with fullgraph=True (as generate() compiles them; `mode`: torch.compile's, "reduce-overhead" replays CUDA graphs)
    or eager; and each layer's (keys, values, length)."""
    from transformers import StaticCache

    ids = llm_prompt(batch=2, length=6).to(device)
    cache = StaticCache(config=model.config, max_cache_len=12)
    # the cache's keyword: `cache` since transformers 5.24 (`past_key_values` deprecated there), before that the old one
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    steps = []
    with torch.no_grad():
        token = model(ids, **{name: cache}, use_cache=True).logits[:, -1:].argmax(-1)
        step = torch.compile(model, fullgraph=True, mode=mode) if compiled else model
        for i in range(count):
            position = torch.tensor([6 + i], device=device)
            if mode == "reduce-overhead":  # a new step: the graphs' outputs of the last one may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            logits = step(token, **{name: cache}, use_cache=True, cache_position=position).logits
            steps.append(logits.clone())
            token = logits[:, -1:].argmax(-1)
    return torch.stack(steps), [(layer.keys, layer.values, int(layer.cumulative_length)) for layer in cache.layers]


def parallel_config(ring_degree=1, ulysses_degree=1, ulysses_anything=False, ring_anything=False):
    """What ltxbench.parallel.attend reads of a processor's `_parallel_config` (diffusers' ParallelConfig), without a
    process group: for the choice of a strategy, not for running one."""
    from types import SimpleNamespace

    return SimpleNamespace(context_parallel_config=SimpleNamespace(
        ring_degree=ring_degree, ulysses_degree=ulysses_degree, ulysses_anything=ulysses_anything,
        ring_anything=ring_anything))


# --- processes -------------------------------------------------------------------------------------------------

def run_ranks(tmp_path, spec: dict, nproc: int = 2, fails: bool = False):
    """tests/workers/parallel_latents.py on `nproc` processes; its JSON (or, with fails, the failed run's stderr)."""
    out = tmp_path / "result.json"
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(WORKERS / "parallel_latents.py"), str(out), json.dumps(spec)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if fails:
        assert done.returncode != 0
        return done.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def tiny_memory_plan(pipe, family, tiling=False, phased=False, stays=()):
    """A MemoryPlan of a tiny pipeline: 4 of the transformer's 5 blocks streamed through 2 slots, the text encoder's
    2 layers through 2."""
    from ltxbench.memory.plan import GIB, MemoryPlan, Streaming

    def stack(name, streamed):
        return Streaming(name, 5 if name == "transformer" else 2, 0, streamed, 2)

    whole = tuple((name, 0) for name in ("connectors", "vae", "audio_vae", "vocoder") if hasattr(pipe, name))
    return MemoryPlan(GIB, stack("transformer", (0, 1, 3, 4)), stack("text_encoder", (0, 1)), whole, 0, 0, tiling,
                      (("encode", 0), ("denoise", 0), ("decode", 0)), 0, phased=phased, transformer_stays=stays)


# --- Wan ---------------------------------------------------------------------------------------------------------

def wan_transformer(device="cpu", dtype="bf16", preset="wan-tiny"):
    """wan-tiny's transformer with modulation tables, time projection and norm weights of a trained model's size (the
    random init's are near zero or one, where an error in a scale or shift would hardly show)."""
    from ltxbench.models import wan_build

    model = wan_build.build_pipeline(preset, "random", device, dtype).transformer
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for table in [b.scale_shift_table for b in model.blocks] + [model.scale_shift_table]:
            table.copy_(0.3 * torch.randn(table.shape, generator=g))
        model.condition_embedder.time_proj.weight.mul_(6.0)  # timestep_proj std about 0.5
        for block in model.blocks:
            for norm in (block.attn1.norm_q, block.attn1.norm_k, block.attn2.norm_q, block.attn2.norm_k, block.norm2):
                norm.weight.copy_(1 + 0.2 * torch.randn(norm.weight.shape, generator=g))
    return model


def wan_inputs(model, per_token=False, device="cpu"):
    """A guidance-sized batch of 2 at two timesteps (or per token, as Wan 2.2 5B's pipeline gives them)."""
    g = torch.Generator().manual_seed(1)
    dtype = model.blocks[0].attn1.to_q.weight.dtype
    latents = torch.randn(2, model.config.in_channels, 3, 4, 6, generator=g).to(device, dtype)
    text = torch.randn(2, 512, model.config.text_dim, generator=g).to(device, dtype)
    timestep = torch.tensor([900.0, 100.0], device=device)
    if per_token:  # 3 x 2 x 3 tokens; the first frame's at 0, as image-to-video conditions it
        timestep = timestep[:, None].repeat(1, 18)
        timestep[:, :6] = 0
    inputs = {"hidden_states": latents, "timestep": timestep, "encoder_hidden_states": text, "return_dict": False}
    if model.config.image_dim:  # Wan 2.1 I2V: CLIP's features of the first frame (its penultimate layer's scale)
        image = 3 * torch.randn(2, 5, model.config.image_dim, generator=g)
        inputs["encoder_hidden_states_image"] = image.to(device, dtype)
    return inputs


# --- FP8 ---------------------------------------------------------------------------------------------------------

def fake_fp8(x):
    """x rounded to e4m3 per row (ops.reference.quantize_fp8) and back, in x's dtype."""
    from ltxbench.ops import reference

    data, scale = reference.quantize_fp8(x)
    return (data.float() * scale).to(x.dtype)


def simulated_fp8(layers, run):
    """run() on the unpatched model with each of `layers`' weight and input rounded to FP8 per row (per output
    channel, per token): what an FP8 path must compute. The weights are restored after."""
    handles, saved = [], []
    with torch.no_grad():
        for layer in layers:
            saved.append((layer, layer.weight.detach().clone()))
            layer.weight.copy_(fake_fp8(layer.weight))
            handles.append(layer.register_forward_pre_hook(lambda _m, args: (fake_fp8(args[0]),)))
    try:
        return run()
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for layer, weight in saved:
                layer.weight.copy_(weight)


# ---- FlashAttention-3 stood in for on the CPU (tests of --attention-backend fa3 and auto) ----

def attention_math(q, k, v, softmax_scale=None, scale_error=1.0):
    """softmax(q kᵀ · scale) v per (batch, head) in fp32 on (B, S, H, D), and its log-sum-exp (B, H, S)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.float()) * scale_error
    return out.to(q.dtype).contiguous(), scores.logsumexp(-1)  # contiguous (B, S, H, D), as the kernel writes it


class StandIn:
    """FlashAttention-3's flash_attn_func as math, counting its calls; `scale_error` 1.01 is a 1% wrong kernel."""

    def __init__(self, scale_error: float = 1.0):
        self.calls, self.scale_error = [], scale_error

    def __call__(self, q, k, v, softmax_scale=None, causal=False, return_attn_probs=False, **_):
        assert not causal
        self.calls.append(tuple(q.shape))
        out, lse = attention_math(q, k, v, softmax_scale, self.scale_error)
        return (out, lse) if return_attn_probs else out


def stand_in_module(name: str, func) -> types.ModuleType:
    """A package named `name` whose flash_attn_func is `func`."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.flash_attn_func = func
    return module


def attention_backends(model) -> dict:
    """{module name: its processor's backend} of every module with a processor."""
    return {name: getattr(m.processor, "_attention_backend", None) for name, m in model.named_modules()
            if hasattr(m, "processor")}


def ltx_call(model):
    with torch.no_grad():
        return model(**ltx_inputs(model))[0]


def wan_call(model):
    with torch.no_grad():
        return model(**wan_inputs(model))[0]


def ltx2_first(model):
    """The video output of one LTX-2 transformer call."""
    return ltx2_call(model)[0]


ATTENTION_CASES = {  # family: (model, one call, our injection)
    "ltx": (ltx_transformer, ltx_call, "ltxbench.inject.ltx"),
    "ltx2": (lambda: ltx2_transformer(2), ltx2_first, "ltxbench.inject.ltx2"),
    "wan": (lambda: wan_transformer(dtype="fp32"), wan_call, "ltxbench.inject.wan"),
}


LTX_TINY_CUDA = ["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", "--device", "cuda", "--num-frames",
                 "9", "--height", "64", "--width", "64", "--steps", "2"]
