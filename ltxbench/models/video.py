"""What the video families (LTX-Video, LTX-2) share: one generation timed per phase, encode → denoise → decode(s).

Phases run back to back and never overlap: text encode (skipped when the prompt embeddings are given: the
`--phase transformer` runs), the denoising loop (step i ends at the pipeline's step-end callback; step 0 also holds
the pipeline's set-up before its loop and, under compile, the compilation), then each decode the family names
(video VAE; audio VAE + vocoder). Postprocessing is outside all of them. Only the standard library at top level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable


def timed_generation(device, seed: int, encode: Callable, denoise: Callable, decodes, embeds=None, phase=None,
                     on_step=None) -> tuple[dict, dict]:
    """(timings, {decode name: output}) of one generation. encode() → prompt embeddings; denoise(embeds, generator,
    on_step_end) → latents; decodes: [(name, fn(latents, generator))], each timed as `<name>_ms`. With `embeds`
    given, the denoising loop alone. `phase(name)`: a context manager around each phase (profiler ranges);
    `on_step()`: called at each step's end (a progress bar). The CPU generator is seeded with `seed`."""
    import torch

    from ltxbench.bench.timing import PhaseClock

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
