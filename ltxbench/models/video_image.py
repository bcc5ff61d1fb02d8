"""Image-to-video (--image) for the video families: the option, its check before torch loads, the image read once
per process (outside the timed phases), and diffusers' image-to-video pipeline on a text-to-video pipeline's
components. Only the standard library at top level."""

from __future__ import annotations

import functools

from ltxbench.models.family import Option

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
    the same modules, weights and device, random or pretrained, and the settings of `pipe`'s config that it takes
    too (Wan's boundary_ratio, expand_timesteps); the injection patches them after this."""
    import inspect

    import diffusers

    cls = getattr(diffusers, class_name)
    takes = inspect.signature(cls.__init__).parameters
    settings = {name: value for name, value in pipe.config.items()
                if name in takes and name not in pipe.components and not name.startswith("_")}
    return cls(**pipe.components, **settings)
