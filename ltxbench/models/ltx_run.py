"""What an LTX-Video run does (ltxbench.models.ltx declares the family): the timed generation (T5 encode, the
pipeline's denoising loop, VAE decode), the GEMM algorithm search before the configurations, and the
context-parallel plan. Imported by the family's methods when an LTX-Video run needs it, so that editing it leaves
the other families' stored results current (their runs never load it). Only the standard library at top level.
"""

from __future__ import annotations

from ltxbench.models.ltx import (
    DECODE_NOISE_SCALE,
    DECODE_TIMESTEP,
    NEGATIVE_PROMPT,
    PROMPT,
    TOKENIZER_MAX_LENGTH,
    LTXSettings,
)


def context_plan(transformer) -> dict:
    """diffusers' context-parallel plan below the root: RoPE's output split along the tokens (our RoPE returns the
    token grid and a per-model frequency vector, which every rank keeps whole), proj_out's output gathered. The
    prompt is not split (diffusers' own plan splits it): attn2 then runs locally, without communication."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    from ltxbench.inject import original_class

    tokens = ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)
    ours = original_class(transformer.rope) is not type(transformer.rope)
    return {"rope": {0: tokens} if ours else {0: tokens, 1: tokens},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def encode(pipe, settings: LTXSettings, device):
    return pipe.encode_prompt(prompt=settings.prompt or PROMPT,
                              negative_prompt=settings.negative_prompt if settings.prompt else NEGATIVE_PROMPT,
                              do_classifier_free_guidance=settings.guidance_scale > 1.0,
                              num_videos_per_prompt=settings.batch_size, max_sequence_length=TOKENIZER_MAX_LENGTH,
                              device=device)


def denoise(pipe, embeds, settings: LTXSettings, generator, on_step_end, image=None):
    """The pipeline's loop on the given embeddings (image-to-video: from `image`, the first frame): packed latents."""
    first_frame = {} if image is None else {"image": image}  # the text-to-video pipeline takes no image argument
    return pipe(**first_frame, prompt_embeds=embeds[0], prompt_attention_mask=embeds[1],
                negative_prompt_embeds=embeds[2], negative_prompt_attention_mask=embeds[3],
                num_frames=settings.num_frames, height=settings.height, width=settings.width,
                frame_rate=settings.frame_rate, num_inference_steps=settings.steps,
                guidance_scale=settings.guidance_scale, generator=generator, output_type="latent",
                return_dict=False, callback_on_step_end=on_step_end)[0]


def decode(pipe, latents, num_frames: int, height: int, width: int, generator):
    """What LTXPipeline does after the loop for output_type != "latent", up to (not incl.) postprocessing."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    vae = pipe.vae
    latents = pipe._unpack_latents(
        latents, (num_frames - 1) // pipe.vae_temporal_compression_ratio + 1,
        height // pipe.vae_spatial_compression_ratio, width // pipe.vae_spatial_compression_ratio,
        pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size)
    latents = pipe._denormalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    latents = latents.to(pipe.transformer.dtype)
    timestep = None
    if vae.config.timestep_conditioning:
        noise = randn_tensor(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
        timestep = torch.full((latents.shape[0],), DECODE_TIMESTEP, device=latents.device, dtype=latents.dtype)
        latents = (1 - DECODE_NOISE_SCALE) * latents + DECODE_NOISE_SCALE * noise
    return vae.decode(latents.to(vae.dtype), timestep, return_dict=False)[0]


def run_once(pipe, settings: LTXSettings, embeds=None, phase=None, on_step=None):
    """One generation, timed per phase (video_phases.timed_generation): (timings, {"vae_decode": video} or {})."""
    from ltxbench.inject.ltx import new_generation
    from ltxbench.models.video_image import conditioning_image
    from ltxbench.models.video_phases import timed_generation

    new_generation(pipe)  # each iteration is one generation: nothing kept from the last one (the patched configs)
    device = pipe._execution_device
    image = None if settings.image is None else conditioning_image(settings.image)  # untimed, read once
    return timed_generation(
        device, settings.seed, lambda: encode(pipe, settings, device),
        lambda prompt, generator, on_step_end: denoise(pipe, prompt, settings, generator, on_step_end, image),
        [("vae_decode", lambda latents, generator: decode(pipe, latents, settings.num_frames, settings.height,
                                                          settings.width, generator))],
        embeds, phase, on_step)


def search_gemms(pipe, settings: LTXSettings, embeds, inject, log) -> float:
    """Two untimed denoising steps of the patched model (inject(): the optimized configs' injection), eager, before
    any configuration: ops.linear's algorithm search (or the load of stored choices) happens here, not in a
    configuration's first warmup, where it would be counted as compile time. Returns its seconds."""
    import dataclasses
    import time

    log("optimized: choosing the GEMM algorithms (untimed, two steps)")
    start = time.perf_counter()
    with inject():
        # the flow-match scheduler fails at 1 step (diffusers 0.42)
        run_once(pipe, dataclasses.replace(settings, steps=2), embeds)
    return time.perf_counter() - start
