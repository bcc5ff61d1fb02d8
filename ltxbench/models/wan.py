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

from ltxbench.models.family import Option, RunSettings
from ltxbench.models.video import VideoFamily
from ltxbench.models.video_image import IMAGE_OPTION
from ltxbench.models.video_phases import MAX_FRAMES, MAX_SIDE, video_options

PROMPT = "a red fox trotting through fresh snow at golden hour, cinematic, shallow depth of field"
NEGATIVE_PROMPT = "worst quality, blurry, jittery, distorted, static"

# preset -> (config dir, hub id of its diffusers-format weights for --weights pretrained)
PRESETS = {
    "wan2.1-1.3b": ("wan2.1-1.3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),
    "wan2.1-14b": ("wan2.1-14b", "Wan-AI/Wan2.1-T2V-14B-Diffusers"),
    "wan2.2-5b": ("wan2.2-5b", "Wan-AI/Wan2.2-TI2V-5B-Diffusers"),
    "wan2.2-a14b": ("wan2.2-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"),
    "wan-tiny": ("wan-tiny", None),
    "wan-tiny-a14b": ("wan-tiny-a14b", None),
    "wan-tiny-ti2v": ("wan-tiny", None),  # wan-tiny run as Wan 2.2 5B runs: per-token timesteps, --image
    "wan2.1-i2v-14b": ("wan2.1-i2v-14b", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"),
    "wan-tiny-i2v": ("wan-tiny-i2v", None),
    "wan2.2-i2v-a14b": ("wan2.2-i2v-a14b", "Wan-AI/Wan2.2-I2V-A14B-Diffusers"),
    "wan-tiny-i2v-a14b": ("wan-tiny-i2v-a14b", None),
}
TOKENIZER_MAX_LENGTH = 512  # WanPipeline pads every prompt to 512 tokens (its max_sequence_length)


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
    builder_module, run_module = "ltxbench.models.wan_build", "ltxbench.models.wan_run"
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
                                         self.builder.side_multiple(settings.model))

    def validate(self, settings: WanSettings, command: str) -> None:
        """The video families' checks, after Wan's own: --image on the TI2V and I2V models only, and always on I2V."""
        from ltxbench.errors import UsageError

        if settings.image is not None and not self.builder.takes_an_image(settings.model):
            raise UsageError(f"--image: Wan's image-to-video runs on the TI2V model (wan2.2-5b) or the I2V one "
                             f"(wan2.1-i2v-14b), not {settings.model}")
        if settings.image is None and self.builder.needs_an_image(settings.model):
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
        from ltxbench.parallel.plan import ParallelPlan

        return ParallelPlan(sequence_inputs={"timestep": 1}, below_root=self.runs.context_plan,
                            local_attentions=lambda model: [block.attn2 for block in model.blocks],
                            token_count=self.runs.latent_tokens)

    def parallelize(self, pipe, settings):
        """The run's split on every denoiser (both of Wan 2.2 A14B's experts), one report."""
        from ltxbench.parallel.launch import current_world
        from ltxbench.parallel.plan import parallelize

        world, plan, tokens = current_world(), self.parallel_plan(), self.tokens(pipe, settings)
        return self.runs.ParallelReports([parallelize(module, world, plan, tokens) for module in self.denoisers(pipe)])

    def inject(self, pipe, settings: WanSettings):
        from ltxbench.inject.wan import apply_kernels

        return apply_kernels(pipe, settings.kernel_provider, pair_guidance=settings.pair_guidance is not False,
                             precision=settings.precision, fp8_accumulation=settings.fp8_accumulation or "fast")

    def encode(self, pipe, settings: WanSettings, device):
        return self.runs.encode(pipe, settings, device)

    def iteration(self, pipe, settings: WanSettings, embeds=None, phase=None, on_step=None):
        return self.runs.run_once(pipe, settings, embeds, phase, on_step)
