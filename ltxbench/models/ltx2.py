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
from ltxbench.models.ltx2_build import PRESETS
from ltxbench.models.ltx2_core import LTX_CORE
from ltxbench.models.video import VideoFamily
from ltxbench.models.video_image import IMAGE_OPTION
from ltxbench.models.video_phases import MAX_FRAMES, MAX_SIDE, video_options

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
_GUIDANCE = ("guidance_scale", "stg_scale", "modality_scale", "guidance_rescale", "audio_guidance_scale",
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
    builder_module = "ltxbench.models.ltx2_build"
    guidance = _GUIDANCE
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
            _validate_ltx_core(core[0], settings)

    def peers(self) -> dict[str, PeerConfig]:
        from ltxbench.models.ltx2_core import apply_ltx_core

        return {**super().peers(), STG_OFF: PeerConfig(STG_OFF, stg_pass_off),
                LTX_CORE: PeerConfig(LTX_CORE, apply_ltx_core)}

    def settings_for(self, settings: LTX2Settings, config: str) -> LTX2Settings:
        """stg-off and ltx-core run the pipeline without its STG pass."""
        return without_stg_pass(settings) if Configuration(config).peer in (STG_OFF, LTX_CORE) else settings

    def bench(self, pipe, settings: LTX2Settings, log) -> dict:
        """The configurations timed; with stg-off among them, its video checked against the default's (untimed,
        after them) and the check recorded in its injection entry."""
        results = super().bench(pipe, settings, log)
        off = [name for name in results if Configuration(name).peer == STG_OFF]
        if off:
            check = stg_pass_check(pipe, settings)
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
        from ltxbench.parallel import ParallelPlan

        def blocks_attention(*names):
            return lambda model: [getattr(block, name) for block in model.transformer_blocks for name in names]

        return ParallelPlan(sequence_inputs={"hidden_states": 1, "timestep": 1, "video_keyframes_mask": 1},
                            below_root=_context_plan,
                            local_attentions=blocks_attention("attn2", "audio_attn1", "audio_attn2",
                                                              "audio_to_video_attn"))

    def encode(self, pipe, settings: LTX2Settings, device):
        return _encode(pipe, settings, device)

    def iteration(self, pipe, settings: LTX2Settings, embeds=None, phase=None, on_step=None):
        return run_once(pipe, settings, embeds, phase, on_step)

    def audio(self, pipe, outputs: dict):
        """The first video's waveform (channels, n) at the vocoder's rate (24 kHz for the released model)."""
        return outputs["audio_decode"][0].float().cpu().numpy(), pipe.vocoder.config.output_sampling_rate


class _StgPassOff:
    """The report of the stg-off configuration: it patches nothing (settings_for drops the STG pass's scales)."""

    def revert(self) -> None:
        pass

    def as_dict(self) -> dict:
        return {"applied": True, "provider": "diffusers", "rules": {STG_OFF_RULE: 1}, "skipped": []}


def _validate_ltx_core(config: Configuration, settings: LTX2Settings) -> None:
    """The ltx-core peer as its users run it: eager, text-to-video, its model whole on one GPU; the package there."""
    from ltxbench.errors import UsageError
    from ltxbench.models.ltx2_core import require

    refused = ("+compile: ltx-core's pipelines do not compile its model" if config.compiled else
               "--image: the peer is fed text-to-video calls (one timestep per sample)" if settings.image else
               "--memory-budget: our streamers load diffusers' blocks, which ltx-core does not call"
               if settings.memory_budget_gib is not None else
               f"--gpus {settings.gpus}: the peer runs on one GPU" if settings.gpus > 1 else None)
    if refused:
        raise UsageError(f"--configs {config}: {refused}", hint=f"run {LTX_CORE} alone, eager, on one GPU")
    require(config)


def without_stg_pass(settings: LTX2Settings) -> LTX2Settings:
    """The run settings of the pipeline without its STG pass: both streams' STG scales 0."""
    return dataclasses.replace(settings, stg_scale=0.0, audio_stg_scale=0.0)


def stg_pass_off(pipe) -> _StgPassOff:
    """The stg-off configuration: LTX-2.0's STG pass recomputes the guidance pair's positive half (no block has
    perturbed attention), so the pipeline gives the same video up to rounding (stg_pass_check measures it) with
    stg_scale=0 and one call fewer per step; the strongest baseline a user can pick. Refused where a block perturbs
    attention (LTX-2.3): the video would differ."""
    from ltxbench.errors import UsageError

    perturbed = [i for i, block in enumerate(pipe.transformer.transformer_blocks)
                 if getattr(block, "perturbed_attn", False)]
    if perturbed:
        raise UsageError(f"--configs {STG_OFF}: block {perturbed[0]} has perturbed attention, so the STG pass changes "
                         "the video and cannot be left out", hint="compare against compile instead")
    return _StgPassOff()


def stg_pass_check(pipe, settings: LTX2Settings) -> dict:
    """The denoising loop of the unpatched model with its STG pass and without (the same seed, prompt embeddings and
    steps): per stream (video, audio) the final latents' largest difference and relative L2 difference. Not zero
    where the batch-1 STG pass rounds otherwise than the batch-2 pair's positive half (bf16 GEMMs choose their
    algorithm by shape); the guidance multiplies that rounding by stg_scale."""
    import torch

    device = pipe._execution_device
    with torch.no_grad():
        embeds = _encode(pipe, settings, device)
        latents = [_denoise(pipe, embeds, run, torch.Generator("cpu").manual_seed(settings.seed), None)
                   for run in (settings, without_stg_pass(settings))]
    streams = {}
    for name, with_pass, without in zip(("video", "audio"), *latents, strict=True):
        diff = (without.float() - with_pass.float())
        streams[name] = {"max_abs_diff": diff.abs().max().item(),
                         "rel_l2": (diff.norm() / with_pass.float().norm().clamp_min(1e-30)).item()}
    worst = max(s["max_abs_diff"] for s in streams.values())
    return {"max_abs_diff": worst, "bit_identical": worst == 0.0, "steps": settings.steps, **streams}


def _context_plan(transformer) -> dict:
    """diffusers' context-parallel plan below the root for LTX-2's video tokens (diffusers' own is LTX-Video's):
    the video RoPE and the video side of the audio<->video RoPE split along the tokens (dim 2 of the split type's
    (B, heads, S, d/2) tables, dim 1 of the interleaved (B, S, D)), proj_out gathered. The audio stream (126 tokens
    at 121 frames) and the prompt stay whole on every rank: their attentions run locally; the video-to-audio
    attention (audio queries, video keys) keeps the parallel config, which answers each rank's copy of the audio
    queries over all the video keys."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    dim = 2 if transformer.config.rope_type == "split" else 1
    tokens = ContextParallelInput(split_dim=dim, expected_dims=dim + 2, split_output=True)
    return {"rope": {0: tokens, 1: tokens}, "cross_attn_rope": {0: tokens, 1: tokens},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _cfg(settings: LTX2Settings) -> bool:
    """The pipeline runs the negative prompt when either stream's guidance scale is above 1."""
    return settings.guidance_scale > 1.0 or settings.audio_guidance_scale > 1.0


def _encode(pipe, settings: LTX2Settings, device):
    return pipe.encode_prompt(prompt=settings.prompt or PROMPT,
                              negative_prompt=settings.negative_prompt if settings.prompt else NEGATIVE_PROMPT,
                              do_classifier_free_guidance=_cfg(settings), num_videos_per_prompt=settings.batch_size,
                              max_sequence_length=MAX_SEQUENCE_LENGTH, device=device)


def _denoise(pipe, embeds, settings: LTX2Settings, generator, on_step_end, image=None):
    """The pipeline's loop on the given embeddings (image-to-video: from `image`, the first frame, re-compressed
    already: _first_frame); (video latents, audio latents), denormalised and unpacked."""
    first_frame = {} if image is None else {"image": image, "image_crf": 0}
    return pipe(**first_frame, prompt_embeds=embeds[0], prompt_attention_mask=embeds[1],
                negative_prompt_embeds=embeds[2], negative_prompt_attention_mask=embeds[3],
                num_frames=settings.num_frames, height=settings.height, width=settings.width,
                frame_rate=settings.frame_rate, num_inference_steps=settings.steps,
                **{name: getattr(settings, name) for name in _GUIDANCE}, generator=generator, output_type="latent",
                return_dict=False, callback_on_step_end=on_step_end)


def _decode_video(pipe, latents, generator):
    """What LTX2Pipeline does to the video latents for output_type != "latent" (2.0: no timestep conditioning)."""
    video_latents = latents[0].to(pipe.vae.dtype)
    timestep = None
    if pipe.vae.config.timestep_conditioning:  # later checkpoints: the pipeline's decode_timestep default, 0
        import torch

        timestep = torch.zeros(video_latents.shape[0], device=video_latents.device, dtype=video_latents.dtype)
    return pipe.vae.decode(video_latents, timestep, return_dict=False)[0]


def _decode_audio(pipe, latents, _generator):
    """Audio latents → mel spectrogram (audio VAE) → waveform (vocoder), as the pipeline does."""
    mel = pipe.audio_vae.decode(latents[1].to(pipe.audio_vae.dtype), return_dict=False)[0]
    return pipe.vocoder(mel)


def run_once(pipe, settings: LTX2Settings, embeds=None, phase=None, on_step=None):
    """One generation timed per phase: (timings, {"vae_decode": video, "audio_decode": waveform} or {})."""
    from ltxbench.models.video_phases import timed_generation

    device = pipe._execution_device
    image = _first_frame(pipe, settings.image)  # untimed, read once
    return timed_generation(
        device, settings.seed, lambda: _encode(pipe, settings, device),
        lambda prompt, generator, on_step_end: _denoise(pipe, prompt, settings, generator, on_step_end, image),
        [("vae_decode", lambda latents, gen: _decode_video(pipe, latents, gen)),
         ("audio_decode", lambda latents, gen: _decode_audio(pipe, latents, gen))],
        embeds, phase, on_step)


def _first_frame(pipe, path: str | None):
    """The --image file as the pipeline conditions on it: re-compressed as one H.264 frame at the CRF of the loaded
    checkpoint's generation (diffusers' default, what LTX-2 was trained on), once, outside the timed phases. Without
    PyAV, which that needs, the image is used as it is: the conditioning differs slightly, the work timed does not."""
    import importlib.util

    from ltxbench.models.video_image import conditioning_image

    if path is None:
        return None
    crf = 0
    if importlib.util.find_spec("av") is not None:
        from diffusers.pipelines.ltx2.utils import resolve_default_image_crf

        crf = resolve_default_image_crf(pipe.text_encoder)
    return conditioning_image(path, crf)
