"""The LTX-Video family (LTX-Video 0.9: 2B, 13B, and a tiny one for tests): settings, options, the timed
iteration with its phases, and what `generate`, `bench e2e` and `profile` ask of a family.

One iteration is one generation: text encode (prompt [+ negative] through T5), denoising (step i ends at the
pipeline's step-end callback; step 0 also holds latent/timestep set-up and, under compile, compilation), VAE
decode (unpack, denormalise, decode). Postprocessing is outside all of them. `--phase transformer` times the
denoising loop alone on prompt embeddings computed once. `--image` runs image-to-video (LTXImageToVideoPipeline on
the same components): the image's VAE encode is in step 0, and every token gets its own timestep (zero on the
first frame's). Phases are timed with ltxbench.bench.timing.PhaseClock.
Only the standard library at top level.
"""

from __future__ import annotations

from dataclasses import dataclass

from ltxbench.configurations import Configuration
from ltxbench.models.family import Option, RunSettings
from ltxbench.models.ltx_build import DEFAULT_HUB_ID, PRESETS, TOKENIZER_MAX_LENGTH
from ltxbench.models.video import VideoFamily
from ltxbench.models.video_image import IMAGE_OPTION
from ltxbench.models.video_phases import MAX_FRAMES, MAX_SIDE, video_options

PROMPT = "a red fox trotting through fresh snow at golden hour, cinematic, shallow depth of field"
NEGATIVE_PROMPT = "worst quality, blurry, jittery, distorted"
# LTX 0.9.1+ VAEs are timestep-conditioned; these are the decode settings Lightricks recommends for them.
DECODE_TIMESTEP, DECODE_NOISE_SCALE = 0.05, 0.025


@dataclass(kw_only=True)
class LTXSettings(RunSettings):
    num_frames: int = 161
    height: int = 512
    width: int = 768
    steps: int = 50
    phase: str | None = None          # bench e2e, profile: all | transformer
    guidance_scale: float = 3.0
    frame_rate: int = 25              # LTX's RoPE conditioning (and the mp4's, in generate)
    cross_kv_cache: bool | None = None   # bench e2e: the optimized configurations' variants
    tuned_gemm: bool | None = None
    pair_cfg_halves: bool | None = None
    prompt: str | None = None         # generate (bench e2e and profile use PROMPT)
    negative_prompt: str | None = None
    image: str | None = None          # image-to-video: the first frame's file (recorded only when given)
    attention_backend: str | None = None  # a diffusers backend, or fa3 (ltxbench.inject.attention_backend)


_BENCH = ("bench e2e",)
OPTIONS = (
    *video_options(frames=161, steps=50, frame_rate=25, max_frames=MAX_FRAMES, max_side=MAX_SIDE, min_side=32,
                   frame_multiple=8, side_multiple=32,
                   frame_rate_help="Frame rate: LTX's RoPE conditioning, and the mp4's."),
    Option("cross_kv_cache", ("--cross-kv-cache/--no-cross-kv-cache",), bool, True, "LTX optimized configs: attn2's "
           "keys/values once per generation (exact), or every step as the model does.", _BENCH),
    Option("tuned_gemm", ("--tuned-gemm/--no-tuned-gemm",), bool, True, "LTX optimized configs: the blocks' "
           "projections on cuBLASLt with the algorithm per shape chosen by timing (first call), or torch's linear.",
           _BENCH),
    Option("pair_cfg_halves", ("--pair-cfg-halves/--no-pair-cfg-halves",), bool, True, "LTX optimized configs: "
           "block 0's attn1 once for classifier-free guidance's two identical halves (exact; checked every step), "
           "or on both.", _BENCH),
    IMAGE_OPTION,
)


class LTXVideoFamily(VideoFamily):
    name, title = "ltx", "LTX-Video"
    precisions = ("bf16", "fp8", "fp8-attention")
    presets = {name: hub for name, (_, hub) in PRESETS.items()}
    settings_class = LTXSettings
    options = OPTIONS
    image_to_video = "LTXImageToVideoPipeline"
    builder_module, run_module = "ltxbench.models.ltx_build", "ltxbench.models.ltx_run"
    memory_stacks = {"transformer": "transformer_blocks", "text_encoder": "encoder.block"}  # --memory-budget: T5's
    text_tokens = TOKENIZER_MAX_LENGTH

    def validate(self, settings, command: str) -> None:
        """The video families' checks, and no regional compile of our configurations: the patched forward runs its
        blocks inline (one graph for the step), so compiling the blocks on their own would leave them eager."""
        from ltxbench.errors import UsageError

        ours = [c for c in map(Configuration, settings.configs or ()) if c.ours and c.compiled]
        if settings.compile_scope == "regional" and ours:
            raise UsageError(f"--compile-scope regional with --configs {ours[0]}: LTX-Video's patched forward runs "
                             "its blocks inline, so with our kernels the whole model compiles",
                             hint="leave --compile-scope out (model), or drop the optimized configurations")
        super().validate(settings, command)

    def claims(self, model: str) -> bool:
        from pathlib import Path

        path = Path(model).expanduser()
        return model == DEFAULT_HUB_ID or "ltx" in model.lower() or (path / "model_index.json").is_file()

    def inject(self, pipe, settings: LTXSettings):
        from ltxbench.inject.ltx import apply_kernels

        return apply_kernels(pipe, settings.kernel_provider, cross_kv_cache=settings.cross_kv_cache is not False,
                             tuned_gemm=settings.tuned_gemm is not False,
                             pair_cfg_halves=settings.pair_cfg_halves is not False, precision=settings.precision,
                             fp8_accumulation=settings.fp8_accumulation or "fast")

    def parallel_plan(self):
        from ltxbench.parallel.plan import ParallelPlan

        return ParallelPlan(sequence_inputs={"hidden_states": 1, "timestep": 1}, below_root=self.runs.context_plan,
                            local_attentions=lambda model: [block.attn2 for block in model.transformer_blocks])

    def encode(self, pipe, settings: LTXSettings, device):
        return self.runs.encode(pipe, settings, device)

    def iteration(self, pipe, settings: LTXSettings, embeds=None, phase=None, on_step=None):
        return self.runs.run_once(pipe, settings, embeds, phase, on_step)

    def before_configs(self, pipe, settings: LTXSettings, embeds, log):
        """With our kernels among the configurations, the GEMM algorithm search (untimed); after them, the optimized
        configurations report what ops.linear chose per shape, with the heuristic's time beside each (process-wide:
        every configuration's GEMMs)."""
        tuned = settings.kernel_provider == "cuda" and settings.tuned_gemm is not False
        if not tuned or not any(Configuration(name).ours for name in settings.configs):
            return None
        from ltxbench import ops

        # the optimized configuration as it will run (a parallel run's split too: the search then meets the shapes
        # of this rank's share of each call)
        def optimized():  # the injection the search runs under
            return self.apply_config(pipe, settings, "optimized")

        search_s = self.runs.search_gemms(pipe, settings, embeds, optimized, log)
        return lambda: {"gemm_choices": ops.gemm_choices(), "gemm_search_s": search_s}
