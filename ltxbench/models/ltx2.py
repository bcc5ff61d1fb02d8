"""The LTX-2 family (Lightricks' 19B audio + video model, diffusers' LTX2Pipeline; a tiny one for tests): settings,
options with the pipeline's own defaults, the timed generation and what `generate`, `bench e2e` and `profile` ask of
a family.

One iteration is one generation: text encode (Gemma 3, prompt and negative), denoising (the pipeline's loop: with its
default guidance, three transformer calls per step: the CFG pair, the STG pass and the modality-isolated pass; the
text connectors run in step 0), video decode (VAE) and audio decode (audio VAE, then the vocoder: a 24 kHz stereo
waveform), each timed on its own (models.video_phases.timed_generation). `--image` runs image-to-video
(LTX2ImageToVideoPipeline on the same components): the video tokens get per-token timesteps, zero on the first
frame's. Only the standard library at top level.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ltxbench.configurations import Configuration
from ltxbench.models.family import Option, PeerConfig, RunSettings
from ltxbench.models.video import VideoFamily
from ltxbench.models.video_image import IMAGE_OPTION
from ltxbench.models.video_phases import MAX_FRAMES, MAX_SIDE, video_options

DEFAULT_HUB_ID = "Lightricks/LTX-2"
# preset -> (config dirs, later ones override per component; hub id for --weights pretrained)
PRESETS = {"ltx2-19b": (("ltx2-19b",), DEFAULT_HUB_ID), "ltx2-tiny": (("ltx2-tiny",), None)}
LTX_CORE = "ltx-core"  # the Lightricks ltx-core peer configuration's name (models/ltx2_core.py)
PROMPT = "a red fox trotting through fresh snow at golden hour, its paws crunching, wind in the pines, cinematic"
NEGATIVE_PROMPT = "worst quality, blurry, jittery, distorted, noise, muffled audio"
MAX_SEQUENCE_LENGTH = 1024  # the pipeline's default: Gemma's prompt length, padded
CUDA_GRAPHS_REFUSED = ("LTX-2's whole-model compile under CUDA graphs is not tested (the STG pass keeps the guidance "
                       "pair's outputs across calls); use --compile-scope regional (the default) or --compile-mode "
                       "default")


@dataclass(kw_only=True)
class LTX2Settings(RunSettings):
    num_frames: int = 121
    height: int = 512
    width: int = 768
    steps: int = 30
    phase: str | None = None
    frame_rate: int = 24
    guidance_scale: float = 3.0
    stg_scale: float = 1.0
    modality_scale: float = 3.0
    guidance_rescale: float = 0.7
    audio_guidance_scale: float = 7.0
    audio_stg_scale: float = 1.0
    audio_modality_scale: float = 3.0
    prompt: str | None = None
    negative_prompt: str | None = None
    image: str | None = None          # image-to-video: the first frame's file (recorded only when given)
    attention_backend: str | None = None  # a diffusers backend, or fa3 (ltxbench.inject.attention_backend)
    # the 48-block transformer compiled whole took longer than 7 minutes on an H100 (docs/performance.md, LTX-2)
    compile_scope: str = "regional"


def _scale(name: str, default: float, text: str) -> Option:
    return Option(name, (f"--{name.replace('_', '-')}",), float, default, f"LTX-2: {text} (the pipeline's default).")


OPTIONS = (
    # at least 64 pixels: the video VAE's decoder needs two latent pixels a side
    *video_options(frames=121, steps=30, frame_rate=24, max_frames=MAX_FRAMES, max_side=MAX_SIDE, min_side=64,
                   frame_multiple=8, side_multiple=32,
                   frame_rate_help="Frame rate: LTX's RoPE conditioning, and the mp4's."),
    _scale("stg_scale", 1.0, "spatio-temporal guidance scale (0, with --audio-stg-scale 0: no STG pass)"),
    _scale("modality_scale", 3.0, "audio/video modality guidance scale (1, with --audio-modality-scale 1: no "
           "modality-isolated pass)"),
    _scale("guidance_rescale", 0.7, "guidance rescale"),
    _scale("audio_guidance_scale", 7.0, "classifier-free guidance scale of the audio stream"),
    _scale("audio_stg_scale", 1.0, "spatio-temporal guidance scale of the audio stream"),
    _scale("audio_modality_scale", 3.0, "modality guidance scale of the audio stream"),
    IMAGE_OPTION,
)
STG_OFF = "stg-off"  # the peer configuration: the pipeline as users can run it, without the STG pass
STG_OFF_RULE = ("pipeline: stg_scale=0 and audio_stg_scale=0, the STG pass not run (no block has perturbed attention: "
                "the same video up to the rounding of a batch of 1 against 2, measured in the run: same_video)")
GUIDANCE = ("guidance_scale", "stg_scale", "modality_scale", "guidance_rescale", "audio_guidance_scale",
             "audio_stg_scale", "audio_modality_scale")


class LTX2Family(VideoFamily):
    name, title = "ltx2", "LTX-2"
    precisions = ("bf16", "fp8", "fp8-attention")
    attention_peers = (STG_OFF,)  # stg-off+compile@fa3: the pipeline without its STG pass, on FlashAttention-3
    # not cfg+ring: built for LTX-Video's self-attention (our ring attention), untested on LTX-2's streams
    parallel_splits = ("cfg", "ulysses", "ring", "cfg+ulysses", "hybrid")
    two_gpu_split = "hybrid"  # 1.79x against cfg's 1.44x on LTX-2 19B (docs/parallel.md#measured)
    presets = {name: hub for name, (_, hub) in PRESETS.items()}
    settings_class = LTX2Settings
    options = OPTIONS
    decodes = ("vae_decode", "audio_decode")
    image_to_video = "LTX2ImageToVideoPipeline"
    builder_module, run_module = "ltxbench.models.ltx2_build", "ltxbench.models.ltx2_run"
    guidance = GUIDANCE
    # --memory-budget: Gemma 3's decoder layers stream like the blocks; its image tower stays on the host (unused)
    memory_stacks = {"transformer": "transformer_blocks", "text_encoder": "model.language_model.layers"}
    memory_host_only = ("text_encoder.model.vision_tower", "text_encoder.model.multi_modal_projector")
    text_tokens = MAX_SEQUENCE_LENGTH
    text_attentions = ("attn2", "audio_attn2")
    text_kv_extra_rows = 1

    def claims(self, model: str) -> bool:
        from pathlib import Path

        low = model.lower()
        index = Path(model).expanduser() / "model_index.json"
        return "ltx-2" in low or "ltx2" in low or (index.is_file() and "LTX2" in index.read_text())

    def validate(self, settings: LTX2Settings, command: str) -> None:
        from ltxbench.models.family import refuse_cuda_graphs

        super().validate(settings, command)
        refuse_cuda_graphs(settings.compile_mode, CUDA_GRAPHS_REFUSED if settings.compile_scope == "model" else None)
        core = [c for c in map(Configuration, settings.configs or ()) if c.peer == LTX_CORE]
        if core:
            self.runs.validate_ltx_core(core[0], settings)

    def peers(self) -> dict[str, PeerConfig]:
        return {**super().peers(), **self.runs.peers()}

    def settings_for(self, settings: LTX2Settings, config: str) -> LTX2Settings:
        """stg-off and ltx-core run the pipeline without its STG pass."""
        return without_stg_pass(settings) if Configuration(config).peer in (STG_OFF, LTX_CORE) else settings

    def bench(self, pipe, settings: LTX2Settings, log) -> dict:
        """The configurations timed; with stg-off among them, its video checked against the default's (untimed,
        after them) and the check recorded in its injection entry."""
        results = super().bench(pipe, settings, log)
        off = [name for name in results if Configuration(name).peer == STG_OFF]
        if off:
            check = self.runs.stg_pass_check(pipe, settings)
            log(f"{STG_OFF}: the final latents without the STG pass against the default's: video rel-L2 "
                f"{check['video']['rel_l2']:.3g} (max |diff| {check['video']['max_abs_diff']:.3g}), audio rel-L2 "
                f"{check['audio']['rel_l2']:.3g} (max |diff| {check['audio']['max_abs_diff']:.3g})")
            for name in off:
                results[name]["injection"]["same_video"] = check
        return results

    def inject(self, pipe, settings: LTX2Settings):
        from ltxbench.inject.ltx2 import apply_kernels

        return apply_kernels(pipe, settings.kernel_provider, precision=settings.precision,
                             fp8_accumulation=settings.fp8_accumulation or "fast")

    def parallel_plan(self):
        from ltxbench.parallel.plan import ParallelPlan

        def blocks_attention(*names):
            return lambda model: [getattr(block, name) for block in model.transformer_blocks for name in names]

        return ParallelPlan(sequence_inputs={"hidden_states": 1, "timestep": 1, "video_keyframes_mask": 1},
                            below_root=self.runs.context_plan,
                            local_attentions=blocks_attention("attn2", "audio_attn1", "audio_attn2",
                                                              "audio_to_video_attn"))

    def encode(self, pipe, settings: LTX2Settings, device):
        return self.runs.encode(pipe, settings, device)

    def iteration(self, pipe, settings: LTX2Settings, embeds=None, phase=None, on_step=None):
        return self.runs.run_once(pipe, settings, embeds, phase, on_step)

    def audio(self, pipe, outputs: dict):
        """The first video's waveform (channels, n) at the vocoder's rate (24 kHz for the released model)."""
        return outputs["audio_decode"][0].float().cpu().numpy(), pipe.vocoder.config.output_sampling_rate


def without_stg_pass(settings: LTX2Settings) -> LTX2Settings:
    """The run settings of the pipeline without its STG pass: both streams' STG scales 0."""
    return dataclasses.replace(settings, stg_scale=0.0, audio_stg_scale=0.0)
