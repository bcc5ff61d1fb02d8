"""LTX-2 pipelines (Lightricks' 19B audio+video model, diffusers' LTX2Pipeline) built for a run: real weights (hub id
or directory) or random weights from the package's configs (configs/ltx2/, provenance in its README.md).

Only the standard library at top level: `validate_video_args` must run before torch/diffusers are imported.
Random weights are allocated directly on the target device in the target dtype (ltx_build.allocate_on), each
component initialised by its class's own init from its own seed. No component is kept in fp32: diffusers'
conversion script writes every one in bf16, and none of the classes names modules to keep in fp32. The tokenizer
for random weights is built in memory (`build_tokenizer`): Gemma's tokenizer class on a small vocabulary of ours.
"""

from __future__ import annotations

from pathlib import Path

from ltxbench.errors import UsageError
from ltxbench.models.family import torch_dtype
from ltxbench.models.hub import pretrained_source
from ltxbench.models.ltx2 import DEFAULT_HUB_ID, PRESETS
from ltxbench.models.ltx_build import seeded
from ltxbench.models.ltx_build import validate_video_args as _validate_ltx_video_args
from ltxbench.resources import configs_dir

CONFIGS = configs_dir("ltx2")  # configs/ltx2/ of the checkout, or the installed package's copy
COMPONENTS = ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder", "scheduler")
MODEL_FORMS = f"a preset ({', '.join(PRESETS)}), a hub id (owner/name) or an LTX-2 pipeline directory"
TOKENIZER_MAX_LENGTH = 1024  # LTX2Pipeline pads every prompt to 1024 tokens (its max_sequence_length)
# Merged pairs of the in-memory tokenizer: word starts and frequent English bigrams, so that prompts take fewer
# tokens than one per character (any other text still tokenizes: characters, else UTF-8 bytes).
_MERGES = [("▁", c) for c in "abcdefghijklmnopqrstuvwxyz"] + [
    (p[0], p[1]) for p in "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io "
                          "le ve co me de hi ri ro ic ne ea ra ce li ch ll be ma si om ur".split()]


def validate_video_args(num_frames: int, height: int, width: int, steps: int) -> None:
    """LTX-Video's constraints (frames 8k+1, H and W multiples of 32, at least two steps: at one, the scheduler's
    terminal shift divides by zero and the video is NaN) and LTX-2's own: H and W at least 64, as its VAE decoder
    reflect-pads the latent by one on each side, which needs two latent pixels (UsageError naming the value)."""
    _validate_ltx_video_args(num_frames, height, width, steps)
    for flag, value in (("--height", height), ("--width", width)):
        if value < 64:
            raise UsageError(f"{flag} {value} is below LTX-2's minimum of 64 (its VAE decoder needs two latent "
                             "pixels)", hint="try 64")


def _config_file(component: str) -> str:
    """The file of `component`'s config inside its subfolder of a diffusers pipeline directory."""
    return "scheduler_config.json" if component == "scheduler" else "config.json"


def component_configs(model: str) -> dict[str, dict]:
    """The seven component configs of a preset, a local directory (configs/ or diffusers layout) or a hub id."""
    model = next((name for name, (_, hub) in PRESETS.items() if hub == model), model)
    from ltxbench.models.hub import directory_component_configs, hub_component_configs, packaged_component_configs

    if model in PRESETS:
        return packaged_component_configs(CONFIGS, PRESETS[model][0], COMPONENTS, model)
    root = Path(model).expanduser()
    if root.is_dir():
        return directory_component_configs(root, model, COMPONENTS, _config_file)
    return hub_component_configs(model, COMPONENTS, _config_file, MODEL_FORMS)


def ensure_pipeline_fits(configs: dict[str, dict], model: str, device, dtype) -> None:
    """The weights (counted on the meta device) against what `device` has free: exit 4 before allocating any."""
    from ltxbench.memory.fit import ensure_fits, module_bytes

    modules = [part for part in build_components(configs, "meta", dtype).values() if hasattr(part, "parameters")]
    ensure_fits(module_bytes(*modules), device, model, dtype, budgeted=True)


def build_components(configs: dict[str, dict], device, dtype, seed: int = 0) -> dict:
    """Transformer, connectors, video and audio VAEs, vocoder, Gemma 3 (random, seeded, eval mode, no gradients)
    and the scheduler, from their config dicts. Gemma 3 keeps its vision tower (0.42 B parameters at full size, unused
    for text-to-video): the pipeline expects Gemma3ForConditionalGeneration, and the released checkpoint holds it."""
    import torch
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    classes = {"transformer": LTX2VideoTransformer3DModel, "connectors": LTX2TextConnectors,
               "vae": AutoencoderKLLTX2Video, "audio_vae": AutoencoderKLLTX2Audio, "vocoder": LTX2Vocoder}
    makers = {name: (lambda cls=cls, name=name: cls.from_config(configs[name])) for name, cls in classes.items()}
    makers["text_encoder"] = lambda: Gemma3ForConditionalGeneration(Gemma3Config.from_dict(configs["text_encoder"]))
    device = torch.device(device)
    built = {"scheduler": FlowMatchEulerDiscreteScheduler.from_config(configs["scheduler"])}
    for offset, (name, make) in enumerate(makers.items()):  # a seed per component: one's size leaves others alone
        with seeded(device, dtype, seed + offset):
            built[name] = make().eval().requires_grad_(False)
    return built


def build_tokenizer(max_length: int = TOKENIZER_MAX_LENGTH):
    """Gemma's tokenizer class (BPE with byte fallback, <bos> first, left padding as LTX2Pipeline pads) on a small
    vocabulary built here, without files or the hub: special tokens, the 256 UTF-8 bytes, printable ASCII, "▁" (the
    space) and a few merges, so any text tokenizes (ids < 512). It is NOT Gemma's vocabulary: the ids of a prompt and
    their number differ from the real tokenizer's; only the shapes the text encoder sees are faithful."""
    from transformers import GemmaTokenizer

    vocab = {token: i for i, token in enumerate(("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"))}
    pieces = [f"<0x{byte:02X}>" for byte in range(256)] + ["▁", *map(chr, range(33, 127))]
    for piece in pieces + [a + b for a, b in _MERGES]:
        vocab.setdefault(piece, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=list(_MERGES), add_bos_token=True, model_max_length=max_length,
                          padding_side="left")


def build_pipeline(model: str, weights: str, device, dtype, seed: int = 0):
    """LTX2Pipeline on `device` in `dtype`: `pretrained` loads weights; `random` builds from configs (seeded)."""
    if isinstance(dtype, str):
        dtype = torch_dtype(dtype)
    if weights == "random":
        from diffusers import LTX2Pipeline

        configs = component_configs(model)
        ensure_pipeline_fits(configs, model, device, dtype)
        return LTX2Pipeline(tokenizer=build_tokenizer(), **build_components(configs, device, dtype, seed))
    if weights != "pretrained":
        raise UsageError(f"--weights {weights!r} is not one of pretrained, random")
    source = pretrained_source(model, PRESETS, MODEL_FORMS)
    if source == DEFAULT_HUB_ID or Path(source).expanduser().is_dir():
        # the configs are at hand (a hub id's would need the hub): the size is known before loading
        ensure_pipeline_fits(component_configs(source), model, device, dtype)
    from diffusers import LTX2Pipeline

    from ltxbench.models.hub import load_ltx_pipeline

    return load_ltx_pipeline(source, dtype, LTX2Pipeline, MODEL_FORMS).to(device)

