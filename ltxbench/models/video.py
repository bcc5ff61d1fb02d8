"""What the video families (LTX-Video, LTX-2) share: one generation timed per phase, encode → denoise → decode(s).

Phases run back to back and never overlap: text encode (skipped when the prompt embeddings are given: the
`--phase transformer` runs), the denoising loop (step i ends at the pipeline's step-end callback; step 0 also holds
the pipeline's set-up before its loop and, under compile, the compilation), then each decode the family names
(video VAE; audio VAE + vocoder). Postprocessing is outside all of them. With --image (image-to-video) the family
runs diffusers' image-to-video pipeline on the same components: the image is read once, outside the phases; its VAE
encode is part of the pipeline's set-up (step 0). Only the standard library at top level.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

from ltxbench.models.family import Option


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


# --- image-to-video (--image): the first frame given, the pipeline continues it ---------------------------------
IMAGE_OPTION = Option("image", ("--image",), str, None, "Image-to-video: the first frame (a PNG/JPEG path); the "
                      "video continues it.", ("generate", "bench e2e", "profile"))


def validate_image(path: str | None) -> None:
    """--image names a file PIL can decode (UsageError naming it otherwise), checked before torch loads."""
    from pathlib import Path

    from ltxbench.errors import UsageError

    if path is None:
        return
    file = Path(path).expanduser()
    if not file.exists():
        raise UsageError(f"--image {path} does not exist")
    if not file.is_file():
        raise UsageError(f"--image {path} is not a file")
    from PIL import Image

    try:
        with Image.open(file) as image:
            image.load()  # the whole decode: a truncated file fails here, not in the run
    except (OSError, SyntaxError, ValueError) as exc:  # PIL's errors for unknown, truncated or corrupt files
        raise UsageError(f"--image {path} is not an image PIL can read") from exc


@functools.lru_cache(maxsize=4)
def conditioning_image(path: str, crf: int = 0):
    """The --image file as an RGB PIL image, read once per process: every iteration of a run reuses it, outside the
    timed phases. crf > 0: re-compressed first as one H.264 frame at that CRF, as LTX-2's pipeline does (PyAV)."""
    from pathlib import Path

    from PIL import Image

    with Image.open(Path(path).expanduser()) as file:
        image = file.convert("RGB")
    if crf:
        import numpy as np
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf

        image = Image.fromarray(apply_image_conditioning_crf(np.array(image), crf))
    return image


def to_image_to_video(pipe, class_name: str):
    """The image-to-video pipeline `class_name` (diffusers') on the same components as the text-to-video `pipe`:
    the same modules, weights and device, random or pretrained; the injection patches them after this."""
    import diffusers

    return getattr(diffusers, class_name)(**pipe.components)
