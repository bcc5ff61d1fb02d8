"""LTX-Video pipelines built for a run: real weights (hub id or directory) or random weights from the package's configs.

Only the standard library at top level: `validate_video_args` must run before torch/diffusers are imported.
Random weights are allocated directly on the target device in the target dtype (default dtype + device
context), initialised by each class's own init from a fixed seed (T5's scaled normal init, nn.Linear/Conv's
kaiming-uniform), which keeps activations finite in bf16. The tokenizer for random weights is transformers'
file-less ByT5Tokenizer (bytes → ids < 384 < T5's vocab): the file-less T5Tokenizer() maps every word to <unk>.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ltxbench.errors import UsageError
from ltxbench.models.family import torch_dtype
from ltxbench.models.hub import looks_like_path
from ltxbench.resources import configs_dir

CONFIGS = configs_dir("ltx")  # configs/ltx/ of the checkout, or the installed package's copy
DEFAULT_HUB_ID = "Lightricks/LTX-Video"
# preset -> (config dirs, later ones override per component; hub id for --weights pretrained)
PRESETS = {
    "ltx-2b": (("ltx-video-2b",), DEFAULT_HUB_ID),
    "ltx-13b": (("ltx-video-2b", "ltx-video-13b"), "Lightricks/LTX-Video-0.9.7-dev"),
    "ltx-tiny": (("ltx-tiny",), None),
}
COMPONENTS = ("transformer", "vae", "text_encoder", "scheduler")
# Diffusers layout of a pipeline directory: component -> config file inside its subfolder.
_DIFFUSERS_FILES = {"transformer": "config.json", "vae": "config.json", "text_encoder": "config.json",
                    "scheduler": "scheduler_config.json"}
TOKENIZER_MAX_LENGTH = 128


def validate_video_args(num_frames: int, height: int, width: int, steps: int) -> None:
    """LTX needs frames = 8k+1, H and W multiples of 32, at least two steps (UsageError naming the value)."""
    if num_frames < 1 or (num_frames - 1) % 8:
        lo = max(1, (num_frames - 1) // 8 * 8 + 1)
        raise UsageError(f"--num-frames {num_frames} is not of the form 8k+1", hint=f"try {lo} or {lo + 8}")
    for flag, value in (("--height", height), ("--width", width)):
        if value < 32 or value % 32:
            lo = max(32, value // 32 * 32)
            raise UsageError(f"{flag} {value} is not a positive multiple of 32", hint=f"try {lo} or {lo + 32}")
    if steps < 2:  # at one step diffusers' flow-match scheduler indexes past its sigmas (IndexError, diffusers 0.42)
        raise UsageError(f"--steps {steps} must be at least 2 (the LTX pipelines' flow-match scheduler needs two)")


def component_configs(model: str) -> dict[str, dict]:
    """The four component configs of a preset, a local directory (configs/ or diffusers layout) or a hub id."""
    if model == DEFAULT_HUB_ID:
        model = "ltx-2b"
    from ltxbench.models.hub import (
        MODEL_FORMS,
        directory_component_configs,
        hub_component_configs,
        packaged_component_configs,
    )

    if model in PRESETS:
        return packaged_component_configs(CONFIGS, PRESETS[model][0], COMPONENTS, model)
    root = Path(model).expanduser()
    if root.is_dir():
        return directory_component_configs(root, model, COMPONENTS, _DIFFUSERS_FILES.get)
    return hub_component_configs(model, _DIFFUSERS_FILES, _DIFFUSERS_FILES.get, MODEL_FORMS)


def ensure_pipeline_fits(configs: dict[str, dict], model: str, device, dtype) -> None:
    """Refuse (exit 4) a pipeline whose weights alone exceed what `device` has free, before allocating any."""
    from ltxbench.memory.fit import ensure_fits, module_bytes

    parts = build_components(configs, "meta", dtype)
    nbytes = module_bytes(*(part for part in parts.values() if hasattr(part, "parameters")))
    ensure_fits(nbytes, device, model, dtype, budgeted=True)


@contextlib.contextmanager
def allocate_on(device, dtype):
    """New tensors go straight to `device` in `dtype` (no fp32 CPU copy of a 7 B-parameter pipeline)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def seeded(device, dtype, seed: int):
    """Random init from `seed` without disturbing the caller's generators, tensors made on `device` in `dtype`."""
    import torch

    cuda = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), allocate_on(device, dtype):
        torch.manual_seed(seed)
        yield


def build_components(configs: dict[str, dict], device, dtype, seed: int = 0) -> dict:
    """Transformer, VAE, T5 encoder (random, seeded, eval mode) and scheduler from their config dicts."""
    import torch
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    device = torch.device(device)
    built = {"scheduler": FlowMatchEulerDiscreteScheduler.from_config(configs["scheduler"])}
    makers = {
        "transformer": lambda: LTXVideoTransformer3DModel.from_config(configs["transformer"]),
        "vae": lambda: AutoencoderKLLTXVideo.from_config(configs["vae"]),
        "text_encoder": lambda: T5EncoderModel(T5Config.from_dict(configs["text_encoder"])),
    }
    forked = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    for offset, (name, make) in enumerate(makers.items()):
        with torch.random.fork_rng(devices=forked):
            torch.manual_seed(seed + offset)
            with allocate_on(device, dtype):
                built[name] = make().eval().requires_grad_(False)
    if dtype == torch.float16:  # as from_pretrained does: T5's FF output projection overflows in fp16
        keep = getattr(built["text_encoder"], "_keep_in_fp32_modules", None) or ()
        for name, module in built["text_encoder"].named_modules():
            if any(k in name.split(".") for k in keep):
                module.float()
    return built


def build_pipeline(model: str, weights: str, device, dtype, seed: int = 0):
    """LTXPipeline on `device` in `dtype`: `pretrained` loads weights; `random` builds from configs (seeded)."""

    if isinstance(dtype, str):
        dtype = torch_dtype(dtype)
    if weights == "random":
        from diffusers import LTXPipeline
        from transformers import ByT5Tokenizer

        configs = component_configs(model)
        ensure_pipeline_fits(configs, model, device, dtype)
        parts = build_components(configs, device, dtype, seed)
        tokenizer = ByT5Tokenizer(model_max_length=TOKENIZER_MAX_LENGTH)
        return LTXPipeline(tokenizer=tokenizer, **parts)
    if weights != "pretrained":
        raise UsageError(f"--weights {weights!r} is not one of pretrained, random")
    if model in PRESETS or model == DEFAULT_HUB_ID or Path(model).expanduser().is_dir():
        # the configs are at hand (a hub id's would need the hub): the size is known before loading
        ensure_pipeline_fits(component_configs(model), model, device, dtype)
    return _load_pretrained(model, dtype).to(device)


def _load_pretrained(model: str, dtype):
    from ltxbench.models.hub import load_ltx_pipeline, no_such_directory

    if model in PRESETS:
        if PRESETS[model][1] is None:
            raise UsageError(f"--model {model} has no pretrained weights", hint="use --weights random")
        model = PRESETS[model][1]
    if not Path(model).expanduser().is_dir() and looks_like_path(model):
        raise no_such_directory(model)
    return load_ltx_pipeline(model, dtype)
