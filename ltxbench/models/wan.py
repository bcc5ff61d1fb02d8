"""The Wan family (Wan 2.1 1.3B and 14B, Wan 2.2 5B and A14B text-to-video; diffusers' WanPipeline; tiny ones for
tests): settings, options with the pipeline's own defaults, the timed generation and what `generate`, `bench e2e`
and `profile` ask of a family.

One iteration is one generation: text encode (UMT5, prompt and negative, each padded to 512 tokens), denoising (the
pipeline's loop: with guidance two transformer calls per step, the conditional then the unconditional one, each of
batch 1; the optimized configurations make them one call of batch 2, `--no-pair-guidance` leaves them two; Wan 2.2
A14B: the high-noise expert `transformer` at the timesteps from boundary_ratio x 1000 up, the low-noise
`transformer_2` below, both compiled, patched and counted: `denoisers`), VAE decode (the latents de-normalised, then
decoded), each timed on its own (models.video_phases.timed_generation). Wan 2.2 5B gives every video token its own
timestep. The optimized configurations run the rules of ltxbench.inject.wan (the modulated norms and gated
residuals, the q/k norms, the feed-forward's GELU: exact; the guidance pair: exact but where a GEMM rounds twice the
rows otherwise). Only the standard library at top level.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ltxbench.models import wan_build
from ltxbench.models.family import Option, RunSettings
from ltxbench.models.ltx_build import MAX_FRAMES, MAX_SIDE
from ltxbench.models.video import VideoFamily
from ltxbench.models.video_image import IMAGE_OPTION
from ltxbench.models.video_phases import video_options
from ltxbench.models.wan_build import PRESETS, TOKENIZER_MAX_LENGTH

PROMPT = "a red fox trotting through fresh snow at golden hour, cinematic, shallow depth of field"
NEGATIVE_PROMPT = "worst quality, blurry, jittery, distorted, static"


@dataclass(kw_only=True)
class WanSettings(RunSettings):
    num_frames: int = 81
    height: int = 480
    width: int = 832
    steps: int = 50
    phase: str | None = None
    frame_rate: int = 16
    guidance_scale: float = 5.0
    prompt: str | None = None
    negative_prompt: str | None = None
    image: str | None = None  # image-to-video (TI2V wan2.2-5b, I2V wan2.1-i2v-14b): the first frame's file
    attention_backend: str | None = None  # a diffusers backend, or fa3 (ltxbench.inject.attention_backend)
    pair_guidance: bool | None = None  # bench e2e: the optimized configurations' variant


def _with_default(option, default):
    return dataclasses.replace(option, default=default)


# WanPipeline's defaults: 81 frames of 480 x 832, 50 steps, guidance 5; Wan 2.1's 16 frames per second (the mp4's
# rate only: Wan's RoPE takes integer latent positions, no frame rate)
OPTIONS = (
    *(_with_default(option, {"height": 480, "width": 832, "guidance_scale": 5.0}[option.name])
      if option.name in ("height", "width", "guidance_scale") else option
      for option in video_options(frames=81, steps=50, frame_rate=16, max_frames=MAX_FRAMES, max_side=MAX_SIDE,
                                  min_side=16, frame_multiple=4, side_multiple=16,
                                  frame_rate_help="Frame rate: the mp4's (Wan 2.1: 16, Wan 2.2: 24).")),
    Option("pair_guidance", ("--pair-guidance/--no-pair-guidance",), bool, True, "Wan optimized configs: the "
           "guidance pair's two batch-1 calls as one call of batch 2 (the same work, fewer kernels), or two calls as "
           "the pipeline makes them.", ("bench e2e",)),
    dataclasses.replace(IMAGE_OPTION, help="Image-to-video (Wan 2.2 5B TI2V; Wan 2.1 I2V 14B, which needs it): the "
                                           "first frame (a PNG/JPEG path); the video continues it."),
)


class WanFamily(VideoFamily):
    name, title = "wan", "Wan"
    precisions = ("bf16", "fp8", "fp8-attention")
    presets = {name: hub for name, (_, hub) in PRESETS.items()}
    # The tiny presets are for the CPU: at the pipeline's 81 frames of 480 x 832 their VAE decode alone takes about
    # 2 minutes on 2 cores (a four-configuration bench e2e, an hour); 9 frames of 64 x 64 take seconds.
    preset_defaults = {name: {"num_frames": 9, "height": 64, "width": 64} for name in PRESETS if "tiny" in name}
    settings_class = WanSettings
    options = OPTIONS
    image_to_video = "WanImageToVideoPipeline"
    builder = wan_build
    text_tokens = TOKENIZER_MAX_LENGTH
    # --gpus 2: the guidance pair's samples on two ranks; the pair is one call of batch 2 where the optimized
    # configurations pair it (inject/wan/pair.py), otherwise each batch-1 call runs whole on every rank. ulysses splits
    # every call's video tokens (batch 1 or the pair); ring is not offered: no run of it on Wan has been checked
    parallel_splits = ("cfg", "ulysses", "cfg+ulysses")
    two_gpu_split = "cfg"
    # --memory-budget: the blocks and UMT5's layers stream; our Wan rules keep no text keys/values across calls
    memory_stacks = {"transformer": "blocks", "text_encoder": "encoder.block"}
    text_attentions = ()
    decode_frames = 4  # Wan's causal VAE decodes a latent frame (4 frames) at a time, its cache carried between

    def claims(self, model: str) -> bool:
        import re
        from pathlib import Path

        root = Path(model).expanduser()
        if root.is_dir():  # a directory is Wan's by its pipeline class, whatever its name
            index = root / "model_index.json"
            return index.is_file() and any(f'"{cls}"' in index.read_text()
                                           for cls in ("WanPipeline", "WanImageToVideoPipeline"))
        return bool(re.search(r"(^|[/_-])wan", model.lower()))  # Wan-AI/Wan2.1-..., not "swan"

    def validate_shape(self, settings: WanSettings) -> None:
        self.builder.validate_video_args(settings.num_frames, settings.height, settings.width, settings.steps,
                                         wan_build.side_multiple(settings.model))

    def validate(self, settings: WanSettings, command: str) -> None:
        """The video families' checks, after Wan's own: --image on the TI2V and I2V models only, and always on I2V."""
        from ltxbench.errors import UsageError

        if settings.image is not None and not wan_build.takes_an_image(settings.model):
            raise UsageError(f"--image: Wan's image-to-video runs on the TI2V model (wan2.2-5b) or the I2V one "
                             f"(wan2.1-i2v-14b), not {settings.model}")
        if settings.image is None and wan_build.needs_an_image(settings.model):
            raise UsageError(f"--model {settings.model} is an image-to-video model: give the first frame with --image")
        super().validate(settings, command)

    def denoisers(self, pipe) -> list:
        """The transformer, and Wan 2.2 A14B's low-noise expert `transformer_2` where the pipeline has one."""
        from ltxbench.inject.wan import experts

        return [module for _, module in experts(pipe)]

    def parallel_plan(self):
        """The root takes latents (B, C, F, H, W): it splits the batch (cfg) and a per-token timestep (Wan 2.2 5B);
        the tokens split below it, as diffusers' own Wan plan splits them (RoPE's tables, block 0's input; proj_out
        gathered). The prompt (and I2V's image tokens) stay whole on every rank: attn2 runs locally."""
        from ltxbench.parallel import ParallelPlan

        return ParallelPlan(sequence_inputs={"timestep": 1}, below_root=_context_plan,
                            local_attentions=lambda model: [block.attn2 for block in model.blocks],
                            token_count=_latent_tokens)

    def parallelize(self, pipe, settings):
        """The run's split on every denoiser (both of Wan 2.2 A14B's experts), one report."""
        from ltxbench.parallel import parallelize
        from ltxbench.parallel.launch import current_world

        world, plan, tokens = current_world(), self.parallel_plan(), self.tokens(pipe, settings)
        return ParallelReports([parallelize(module, world, plan, tokens) for module in self.denoisers(pipe)])

    def inject(self, pipe, settings: WanSettings):
        from ltxbench.inject.wan import apply_kernels

        return apply_kernels(pipe, settings.kernel_provider, pair_guidance=settings.pair_guidance is not False,
                             precision=settings.precision, fp8_accumulation=settings.fp8_accumulation or "fast")

    def encode(self, pipe, settings: WanSettings, device):
        return _encode(pipe, settings, device)

    def iteration(self, pipe, settings: WanSettings, embeds=None, phase=None, on_step=None):
        return run_once(pipe, settings, embeds, phase, on_step)


class ParallelReports:
    """The split of each denoiser, reverted and described as one."""

    def __init__(self, reports: list):
        self.reports = reports

    def revert(self) -> None:
        for report in reversed(self.reports):
            report.revert()

    def as_dict(self) -> dict:
        return {**self.reports[0].as_dict(), "denoisers": len(self.reports)}


def _context_plan(transformer) -> dict:
    """diffusers' context-parallel plan of WanTransformer3DModel below the root (its root entry, the timestep, is
    the split hook's, which also splits the batch)."""
    return {name: entry for name, entry in type(transformer)._cp_plan.items() if name}


def _latent_tokens(transformer):
    """The video token count of a call from its latents (B, C, F, H, W): F·H·W over the patch volume."""
    patch = transformer.config.patch_size

    def count(latents) -> int:
        return (latents.size(2) // patch[0]) * (latents.size(3) // patch[1]) * (latents.size(4) // patch[2])

    return count


def _encode(pipe, settings: WanSettings, device):
    """(prompt embeddings, negative prompt embeddings or None), each (B, 512, text dim), rows past the prompt zero.
    Through WanPipeline's encode_prompt for both pipelines: the image-to-video pipeline's cleans the text with ftfy
    unconditionally (a NameError without it); the text-to-video one uses it where installed, the same otherwise."""
    from diffusers import WanPipeline

    return WanPipeline.encode_prompt(_text_side(pipe), prompt=settings.prompt or PROMPT,
                              negative_prompt=settings.negative_prompt if settings.prompt else NEGATIVE_PROMPT,
                              do_classifier_free_guidance=settings.guidance_scale > 1.0,
                              num_videos_per_prompt=settings.batch_size, max_sequence_length=TOKENIZER_MAX_LENGTH,
                              device=device)


class _TextSide:
    """What WanPipeline.encode_prompt reads of its pipeline: the tokenizer, the text encoder, the execution device,
    and its own T5 prompt encoding (WanPipeline's, whatever `pipe` is)."""

    def __init__(self, pipe):
        self.pipe = pipe

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def _get_t5_prompt_embeds(self, *args, **kwargs):
        from diffusers import WanPipeline

        return WanPipeline._get_t5_prompt_embeds(self, *args, **kwargs)


def _text_side(pipe):
    from diffusers import WanPipeline

    return pipe if isinstance(pipe, WanPipeline) else _TextSide(pipe)


def _denoise(pipe, embeds, settings: WanSettings, generator, on_step_end, image=None):
    """The pipeline's loop on the given embeddings (and the first frame, image-to-video): the final latents
    (B, C, F', H', W'), fp32, normalised."""
    return pipe(**({} if image is None else {"image": image}), prompt_embeds=embeds[0],
                negative_prompt_embeds=embeds[1], num_frames=settings.num_frames,
                height=settings.height, width=settings.width, num_inference_steps=settings.steps,
                guidance_scale=settings.guidance_scale, generator=generator, output_type="latent",
                return_dict=False, callback_on_step_end=on_step_end)[0]


def decode(pipe, latents, _generator=None):
    """What WanPipeline does to the latents for output_type != "latent": de-normalised with the VAE's per-channel
    mean and std, then decoded (the video in [-1, 1])."""
    import torch

    vae = pipe.vae
    latents = latents.to(vae.dtype)
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return vae.decode(latents / inv_std + mean, return_dict=False)[0]


def run_once(pipe, settings: WanSettings, embeds=None, phase=None, on_step=None):
    """One generation timed per phase: (timings, {"vae_decode": video} or {})."""
    from ltxbench.models.video_image import conditioning_image
    from ltxbench.models.video_phases import timed_generation

    device = pipe._execution_device
    image = None if settings.image is None else conditioning_image(settings.image)  # untimed, read once
    return timed_generation(
        device, settings.seed, lambda: _encode(pipe, settings, device),
        lambda prompt, generator, on_step_end: _denoise(pipe, prompt, settings, generator, on_step_end, image),
        [("vae_decode", lambda latents, generator: decode(pipe, latents, generator))],
        embeds, phase, on_step)
