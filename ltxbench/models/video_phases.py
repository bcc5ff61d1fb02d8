"""What every video family's run is made of, below the family: its shared options (frames, size, steps, guidance,
phase, attention backend), its token count from the pipeline's own VAE, and one generation timed per phase.

Phases run back to back and never overlap: text encode (skipped when the prompt embeddings are given: the
`--phase transformer` runs), the denoising loop (step i ends at the pipeline's step-end callback; step 0 also holds
the pipeline's set-up before its loop and, under compile, the compilation), then each decode the family names
(video VAE; audio VAE + vocoder). Postprocessing is outside all of them. Only the standard library at top level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ltxbench.models.family import Option

PHASES = ("all", "transformer")  # --phase: the whole generation, or the denoising loop alone


MAX_STEPS = 10_000  # far past any schedule a video model is run with: a typo's 10**11 fails here, not in numpy
# The video families' --num-frames / --height / --width bounds (Option.bounds, checked before torch loads): generous
# (1025 frames are 129 latent frames; 4096 pixels a side is beyond 4K), but a value past them would only end in an
# allocation failure after the model was built.
MAX_FRAMES, MAX_SIDE = 1025, 4096


def video_options(frames: int, steps: int, frame_rate: int, max_frames: int, max_side: int, min_side: int,
                  frame_multiple: int, side_multiple: int, frame_rate_help: str) -> tuple[Option, ...]:
    """The options every video family takes, with the family's defaults and limits: frames (k * frame_multiple + 1,
    the VAE's temporal compression), height and width (multiples of side_multiple), steps, guidance, frame rate, and
    the phase bench e2e and profile time."""
    side = f"a multiple of {side_multiple}, at most {max_side}."
    return (
        Option("num_frames", ("--num-frames",), int, frames,
               f"Frames: {frame_multiple}k+1, at most {max_frames}.", bounds=(1, max_frames)),
        Option("height", ("--height",), int, 512, f"Height in pixels, {side}", bounds=(min_side, max_side)),
        Option("width", ("--width",), int, 768, f"Width in pixels, {side}", bounds=(min_side, max_side)),
        Option("steps", ("--steps",), int, steps, "Denoising steps (at least 2).", defaults={"profile": 2},
               bounds=(1, MAX_STEPS)),
        Option("guidance_scale", ("--guidance-scale",), float, 3.0, "Classifier-free guidance scale (> 1 doubles "
               "the batch)."),
        Option("frame_rate", ("--frame-rate", "--fps"), int, frame_rate, frame_rate_help),
        Option("phase", ("--phase",), str, "all", "all (encode + denoise + decode) | transformer (denoising loop "
               "only).", ("bench e2e", "profile"), choices=PHASES),
        Option("attention_backend", ("--attention-backend",), str, None, "auto: per attention, the backend "
               "measured fastest (and exact) at its shape; fa3: FlashAttention-3 on the "
               "self-attentions (pip install fa3-fwd, or a hopper/ build), torch's SDPA on the rest; or a diffusers "
               "backend for every attention (e.g. _native_cudnn). The same for every configuration of a run "
               "(default: the model's own, torch's SDPA).", ("generate", "bench e2e", "profile")),
    )


def video_tokens(pipe, num_frames: int, height: int, width: int) -> int:
    """The transformer's video tokens for a generation: latent frames x height x width from the pipeline's own VAE
    compression (LTX's pipelines: *_compression_ratio; Wan's: vae_scale_factor_*) over the transformer's patch."""
    temporal = getattr(pipe, "vae_temporal_compression_ratio", None) or pipe.vae_scale_factor_temporal
    spatial = getattr(pipe, "vae_spatial_compression_ratio", None) or pipe.vae_scale_factor_spatial
    patch_t = getattr(pipe, "transformer_temporal_patch_size", None)
    patch = getattr(pipe, "transformer_spatial_patch_size", None)
    if patch is None or patch_t is None:  # a (t, h, w) patch in the transformer's config (Wan)
        patch_t, patch, _ = pipe.transformer.config.patch_size
    frames = (num_frames - 1) // temporal + 1
    return (frames // patch_t) * (height // spatial // patch) * (width // spatial // patch)


def timed_generation(device, seed: int, encode: Callable, denoise: Callable, decodes, embeds=None, phase=None,
                     on_step=None) -> tuple[dict, dict]:
    """(timings, {decode name: output}) of one generation. encode() → prompt embeddings; denoise(embeds, generator,
    on_step_end) → latents; decodes: [(name, fn(latents, generator))], each timed as `<name>_ms`. With `embeds`
    given, the denoising loop alone. `phase(name)`: a context manager around each phase (profiler ranges);
    `on_step()`: called at each step's end (a progress bar). The CPU generator is seeded with `seed`."""
    import torch

    from ltxbench.bench.timing import PhaseClock
    from ltxbench.parallel import launch

    phase = phase or (lambda name: contextlib.nullcontext())
    clock = PhaseClock(device)
    generator = torch.Generator("cpu").manual_seed(seed)
    marks: list = []

    def on_step_end(_pipe, _i, _t, _kwargs):
        marks.append(clock.mark())
        if on_step is not None:
            on_step()
        return {}

    outputs, bounds = {}, {}
    launch.start_together()  # over several GPUs: every rank's clock starts at once
    with torch.no_grad():
        start = clock.mark()
        if embeds is None:
            with phase("text_encode"):
                embeds = encode()
            encoded = clock.mark()
            bounds["text_encode"] = (start, encoded)
            full = True
        else:
            encoded, full = start, False
        with phase("denoise"):
            latents = denoise(embeds, generator, on_step_end)
        for name, decode in decodes if full else ():
            begin = clock.mark()
            with phase(name):
                outputs[name] = decode(latents, generator)
            bounds[name] = (begin, clock.mark())
        end = clock.mark()
    clock.finish()
    timings = {"step_ms": clock.intervals([encoded, *marks]), "total_ms": clock.ms(start, end)}
    timings.update({f"{name}_ms": clock.ms(a, b) for name, (a, b) in bounds.items()})
    return timings, outputs
