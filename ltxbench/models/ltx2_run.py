"""What an LTX-2 run does (ltxbench.models.ltx2 declares the family): the timed generation (Gemma encode, the
pipeline's denoising loop, video and audio decode), the stg-off peer and its same-video check, the ltx-core peer's
checks, and the context-parallel plan. Imported by the family's methods when an LTX-2 run needs it, so that editing
it leaves the other families' stored results current (their runs never load it). Only the standard library at top
level.
"""

from __future__ import annotations

from ltxbench.configurations import Configuration
from ltxbench.models.ltx2 import (
    GUIDANCE,
    LTX_CORE,
    MAX_SEQUENCE_LENGTH,
    NEGATIVE_PROMPT,
    PROMPT,
    STG_OFF,
    STG_OFF_RULE,
    LTX2Settings,
    without_stg_pass,
)


class _StgPassOff:
    """The report of the stg-off configuration: it patches nothing (settings_for drops the STG pass's scales)."""

    def revert(self) -> None:
        pass

    def as_dict(self) -> dict:
        return {"applied": True, "provider": "diffusers", "rules": {STG_OFF_RULE: 1}, "skipped": []}


def validate_ltx_core(config: Configuration, settings: LTX2Settings) -> None:
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


def peers() -> dict:
    """LTX-2's own peers: the pipeline without its STG pass (stg-off) and Lightricks' ltx-core on the same weights."""
    from ltxbench.models.family import PeerConfig
    from ltxbench.models.ltx2_core import apply_ltx_core

    return {STG_OFF: PeerConfig(STG_OFF, stg_pass_off), LTX_CORE: PeerConfig(LTX_CORE, apply_ltx_core)}


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
        embeds = encode(pipe, settings, device)
        latents = [denoise(pipe, embeds, run, torch.Generator("cpu").manual_seed(settings.seed), None)
                   for run in (settings, without_stg_pass(settings))]
    streams = {}
    for name, with_pass, without in zip(("video", "audio"), *latents, strict=True):
        diff = (without.float() - with_pass.float())
        streams[name] = {"max_abs_diff": diff.abs().max().item(),
                         "rel_l2": (diff.norm() / with_pass.float().norm().clamp_min(1e-30)).item()}
    worst = max(s["max_abs_diff"] for s in streams.values())
    return {"max_abs_diff": worst, "bit_identical": worst == 0.0, "steps": settings.steps, **streams}


def context_plan(transformer) -> dict:
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


def guided(settings: LTX2Settings) -> bool:
    """The pipeline runs the negative prompt when either stream's guidance scale is above 1."""
    return settings.guidance_scale > 1.0 or settings.audio_guidance_scale > 1.0


def encode(pipe, settings: LTX2Settings, device):
    return pipe.encode_prompt(prompt=settings.prompt or PROMPT,
                              negative_prompt=settings.negative_prompt if settings.prompt else NEGATIVE_PROMPT,
                              do_classifier_free_guidance=guided(settings), num_videos_per_prompt=settings.batch_size,
                              max_sequence_length=MAX_SEQUENCE_LENGTH, device=device)


def denoise(pipe, embeds, settings: LTX2Settings, generator, on_step_end, image=None):
    """The pipeline's loop on the given embeddings (image-to-video: from `image`, the first frame, re-compressed
    already: _first_frame); (video latents, audio latents), denormalised and unpacked."""
    first_frame = {} if image is None else {"image": image, "image_crf": 0}
    return pipe(**first_frame, prompt_embeds=embeds[0], prompt_attention_mask=embeds[1],
                negative_prompt_embeds=embeds[2], negative_prompt_attention_mask=embeds[3],
                num_frames=settings.num_frames, height=settings.height, width=settings.width,
                frame_rate=settings.frame_rate, num_inference_steps=settings.steps,
                **{name: getattr(settings, name) for name in GUIDANCE}, generator=generator, output_type="latent",
                return_dict=False, callback_on_step_end=on_step_end)


def decode_video(pipe, latents, generator):
    """What LTX2Pipeline does to the video latents for output_type != "latent" (2.0: no timestep conditioning)."""
    video_latents = latents[0].to(pipe.vae.dtype)
    timestep = None
    if pipe.vae.config.timestep_conditioning:  # later checkpoints: the pipeline's decode_timestep default, 0
        import torch

        timestep = torch.zeros(video_latents.shape[0], device=video_latents.device, dtype=video_latents.dtype)
    return pipe.vae.decode(video_latents, timestep, return_dict=False)[0]


def decode_audio(pipe, latents, _generator):
    """Audio latents → mel spectrogram (audio VAE) → waveform (vocoder), as the pipeline does."""
    mel = pipe.audio_vae.decode(latents[1].to(pipe.audio_vae.dtype), return_dict=False)[0]
    return pipe.vocoder(mel)


def run_once(pipe, settings: LTX2Settings, embeds=None, phase=None, on_step=None):
    """One generation timed per phase: (timings, {"vae_decode": video, "audio_decode": waveform} or {})."""
    from ltxbench.models.video_phases import timed_generation

    device = pipe._execution_device
    image = first_frame(pipe, settings.image)  # untimed, read once
    return timed_generation(
        device, settings.seed, lambda: encode(pipe, settings, device),
        lambda prompt, generator, on_step_end: denoise(pipe, prompt, settings, generator, on_step_end, image),
        [("vae_decode", lambda latents, gen: decode_video(pipe, latents, gen)),
         ("audio_decode", lambda latents, gen: decode_audio(pipe, latents, gen))],
        embeds, phase, on_step)


def first_frame(pipe, path: str | None):
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
