"""What a Wan run does (ltxbench.models.wan declares the family): the timed generation (text encode, the pipeline's
denoising loop, VAE decode), the prompt's encoding through WanPipeline's, and the split over several GPUs. Imported
by the family's methods when a Wan run needs it, so that editing it leaves other families' stored results current
(their runs never load it). Only the standard library at top level.
"""

from __future__ import annotations

from ltxbench.models.wan import NEGATIVE_PROMPT, PROMPT, TOKENIZER_MAX_LENGTH, WanSettings


class ParallelReports:
    """The split of each denoiser, reverted and described as one."""

    def __init__(self, reports: list):
        self.reports = reports

    def revert(self) -> None:
        for report in reversed(self.reports):
            report.revert()

    def as_dict(self) -> dict:
        return {**self.reports[0].as_dict(), "denoisers": len(self.reports)}


def context_plan(transformer) -> dict:
    """diffusers' context-parallel plan of WanTransformer3DModel below the root (its root entry, the timestep, is
    the split hook's, which also splits the batch)."""
    return {name: entry for name, entry in type(transformer)._cp_plan.items() if name}


def latent_tokens(transformer):
    """The video token count of a call from its latents (B, C, F, H, W): F·H·W over the patch volume."""
    patch = transformer.config.patch_size

    def count(latents) -> int:
        return (latents.size(2) // patch[0]) * (latents.size(3) // patch[1]) * (latents.size(4) // patch[2])

    return count


def encode(pipe, settings: WanSettings, device):
    """(prompt embeddings, negative prompt embeddings or None), each (B, 512, text dim), rows past the prompt zero.
    Through WanPipeline's encode_prompt for both pipelines: the image-to-video pipeline's cleans the text with ftfy
    unconditionally (a NameError without it); the text-to-video one uses it where installed, the same otherwise."""
    from diffusers import WanPipeline

    return WanPipeline.encode_prompt(text_side(pipe), prompt=settings.prompt or PROMPT,
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


def text_side(pipe):
    from diffusers import WanPipeline

    return pipe if isinstance(pipe, WanPipeline) else _TextSide(pipe)


def denoise(pipe, embeds, settings: WanSettings, generator, on_step_end, image=None):
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
        device, settings.seed, lambda: encode(pipe, settings, device),
        lambda prompt, generator, on_step_end: denoise(pipe, prompt, settings, generator, on_step_end, image),
        [("vae_decode", lambda latents, generator: decode(pipe, latents, generator))],
        embeds, phase, on_step)
