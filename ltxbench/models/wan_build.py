"""Wan 2.1 / 2.2 pipelines (diffusers' WanPipeline: WanTransformer3DModel, AutoencoderKLWan, the UMT5 text encoder)
built for a run: real weights (hub id or directory) or random weights from the package's configs (configs/wan/,
provenance in its README.md).

Only the standard library at top level: `validate_video_args` must run before torch/diffusers are imported.
Random weights are allocated directly on the target device in the target dtype (ltx_build.allocate_on), each
component initialised by its class's own init from its own seed; the transformer's modules that diffusers keeps in
fp32 when it loads a checkpoint in a lower precision (its `_keep_in_fp32_modules`: the modulation tables, the time
embedder, the block norms) are then made fp32, so that random and loaded weights have the same dtypes and the same
arithmetic. The tokenizer for random weights is built in memory (`build_tokenizer`): UMT5's tokenizer class on a
small vocabulary of ours.
"""

from __future__ import annotations

import json
from pathlib import Path

from ltxbench.errors import UsageError
from ltxbench.models.family import torch_dtype
from ltxbench.models.hub import pretrained_source
from ltxbench.models.ltx_build import seeded
from ltxbench.models.wan import PRESETS, TOKENIZER_MAX_LENGTH
from ltxbench.resources import configs_dir

CONFIGS = configs_dir("wan")  # configs/wan/ of the checkout, or the installed package's copy
# Wan 2.2 5B's pipeline gives every video token its own timestep (WanPipeline's expand_timesteps); its image-to-video
# (TI2V) is the same transformer with the image's latents as the first latent frame, at timestep 0
EXPAND_TIMESTEPS = {"wan2.2-5b", "wan-tiny-ti2v"}
COMPONENTS = ("transformer", "vae", "text_encoder", "scheduler")
# Wan 2.2 A14B's low-noise expert, the pipeline's own config (its boundary_ratio: where the experts switch) and Wan 2.1
# I2V's CLIP image encoder (its transformer takes the image's CLIP features beside the text: image_dim)
OPTIONAL = ("transformer_2", "pipeline", "image_encoder")
MODEL_FORMS = f"a preset ({', '.join(PRESETS)}), a hub id (owner/name) or a Wan pipeline directory"
FRAME_MULTIPLE = 4          # the VAE's temporal compression: frames are 4k+1
# Pixels per transformer patch side (VAE x patch): 16 for Wan 2.1's x8 VAE, 32 for Wan 2.2's x16 one
SIDE_MULTIPLES = {"wan2.2-5b": 32}
SIDE_MULTIPLE = 16
# Pieces of the in-memory tokenizer beyond the single characters: word starts and frequent English bigrams, so that
# prompts take fewer tokens than one per character.
_PIECES = [f"▁{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + (
    "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me de hi ri ro "
    "ic ne ea ra ce li ch ll be ma si om ur").split()


def side_multiple(model: str) -> int:
    """What H and W must be multiples of for `model` (a preset's; 16, Wan 2.1's, for any other)."""
    return SIDE_MULTIPLES.get(model, SIDE_MULTIPLE)


def validate_video_args(num_frames: int, height: int, width: int, steps: int, multiple: int = SIDE_MULTIPLE) -> None:
    """Wan needs frames = 4k+1, H and W positive multiples of `multiple` (VAE compression x patch), at least one
    step. WanPipeline would round other values down with a warning, and the run would then time another video than
    the one asked for (UsageError naming the value)."""
    if num_frames < 1 or (num_frames - 1) % FRAME_MULTIPLE:
        lo = max(1, (num_frames - 1) // FRAME_MULTIPLE * FRAME_MULTIPLE + 1)
        raise UsageError(f"--num-frames {num_frames} is not of the form 4k+1 (Wan)",
                         hint=f"try {lo} or {lo + FRAME_MULTIPLE}")
    for flag, value in (("--height", height), ("--width", width)):
        if value < multiple or value % multiple:
            lo = max(multiple, value // multiple * multiple)
            raise UsageError(f"{flag} {value} is not a positive multiple of {multiple} (Wan)",
                             hint=f"try {lo} or {lo + multiple}")
    if steps < 1:
        raise UsageError(f"--steps {steps} must be at least 1")


def _config_file(component: str) -> str:
    return "scheduler_config.json" if component == "scheduler" else "config.json"


def component_configs(model: str) -> dict[str, dict]:
    """The four component configs of a preset, a local directory (configs/ or diffusers layout) or a hub id."""
    model = next((name for name, (_, hub) in PRESETS.items() if hub == model), model)
    from ltxbench.models.hub import directory_component_configs, hub_component_configs, packaged_component_configs

    if model in PRESETS:
        return packaged_component_configs(CONFIGS, (PRESETS[model][0],), COMPONENTS, model, OPTIONAL)
    root = Path(model).expanduser()
    if root.is_dir():
        configs = directory_component_configs(root, model, COMPONENTS, _config_file)
        for path in (root / "transformer_2.json", root / "transformer_2" / "config.json"):
            if path.is_file():  # a two-expert pipeline (Wan 2.2 A14B)
                configs["transformer_2"] = json.loads(path.read_text())
                break
        for path in (root / "image_encoder.json", root / "image_encoder" / "config.json"):
            if path.is_file():  # Wan 2.1 I2V
                configs["image_encoder"] = json.loads(path.read_text())
                break
        for path in (root / "pipeline.json", root / "model_index.json"):
            if path.is_file() and "boundary_ratio" in (config := json.loads(path.read_text())):
                configs["pipeline"] = {"boundary_ratio": config["boundary_ratio"]}
                break
        return configs
    return hub_component_configs(model, COMPONENTS, _config_file, MODEL_FORMS)


def ensure_pipeline_fits(configs: dict[str, dict], model: str, device, dtype) -> None:
    """The weights (counted on the meta device) against what `device` has free: exit 4 before allocating any."""
    from ltxbench.memory.fit import ensure_fits, module_bytes

    modules = [part for part in build_components(configs, "meta", dtype).values() if hasattr(part, "parameters")]
    ensure_fits(module_bytes(*modules), device, model, dtype, budgeted=True)


def keep_in_fp32(model) -> None:
    """The parameters of `model`'s modules named in its `_keep_in_fp32_modules` made fp32, as from_pretrained
    leaves them (matched against the components of each parameter's dotted name, as diffusers matches them)."""
    import torch

    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, param in model.named_parameters():
        if keep.intersection(name.split(".")) and param.dtype != torch.float32:
            param.data = param.data.float()


def build_components(configs: dict[str, dict], device, dtype, seed: int = 0) -> dict:
    """Transformer (and a second expert, `transformer_2`, where the configs have one), VAE, UMT5 encoder, CLIP's
    vision tower where the configs have an `image_encoder` (random, seeded, eval mode, no gradients) and the
    scheduler, from their config dicts."""
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

    makers = {"transformer": lambda: WanTransformer3DModel.from_config(configs["transformer"]),
              "vae": lambda: AutoencoderKLWan.from_config(configs["vae"]),
              "text_encoder": lambda: UMT5EncoderModel(UMT5Config.from_dict(configs["text_encoder"]))}
    if "transformer_2" in configs:  # last: the other components keep their seeds
        makers["transformer_2"] = lambda: WanTransformer3DModel.from_config(configs["transformer_2"])
    if "image_encoder" in configs:
        makers["image_encoder"] = lambda: CLIPVisionModel(CLIPVisionConfig(**configs["image_encoder"]))
    device = torch.device(device)
    built = {"scheduler": UniPCMultistepScheduler.from_config(configs["scheduler"])}
    for offset, (name, make) in enumerate(makers.items()):  # a seed per component: one's size leaves others alone
        with seeded(device, dtype, seed + offset):
            built[name] = make().eval().requires_grad_(False)
    for name in ("transformer", "transformer_2"):
        if name in built:
            keep_in_fp32(built[name])
    if dtype == torch.float16:  # as from_pretrained does: UMT5's FF output projection overflows in fp16
        keep_in_fp32(built["text_encoder"])
    return built


def build_tokenizer(max_length: int = TOKENIZER_MAX_LENGTH):
    """UMT5's tokenizer class (a sentencepiece-style Unigram model: <pad> 0, </s> 1, <unk> 2, as google/umt5-xxl's)
    on a small vocabulary built here, without files or the hub: the special tokens, "▁" (the space), printable ASCII
    and a few word starts and bigrams (ids < 512). It is NOT UMT5's vocabulary: the ids of a prompt and their number
    differ from the real tokenizer's; the pipeline pads every prompt to `max_length`, so the shapes the text encoder
    and the transformer see are the real ones."""
    from transformers import T5Tokenizer

    pieces = ["▁", *map(chr, range(33, 127)), *_PIECES]
    # Unigram scores: longer pieces score higher, so that a word start or a bigram wins over its two characters
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(p, -10.0 + len(p)) for p in pieces]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=max_length)


def build_pipeline(model: str, weights: str, device, dtype, seed: int = 0):
    """WanPipeline on `device` in `dtype`: `pretrained` loads weights; `random` builds from configs (seeded)."""
    if isinstance(dtype, str):
        dtype = torch_dtype(dtype)
    if weights == "random":
        configs = component_configs(model)
        ensure_pipeline_fits(configs, model, device, dtype)
        parts = build_components(configs, device, dtype, seed)
        settings = {"boundary_ratio": configs.get("pipeline", {}).get("boundary_ratio"),
                    "expand_timesteps": _expands_timesteps(model, configs)}
        if "image_encoder" in parts:  # Wan 2.1 I2V: CLIP's features of the image beside its latents
            parts["image_processor"] = image_processor(configs["image_encoder"]["image_size"])
        return pipeline_class(_conditions_on_an_image(configs))(tokenizer=build_tokenizer(), **parts, **settings)
    if weights != "pretrained":
        raise UsageError(f"--weights {weights!r} is not one of pretrained, random")
    source = pretrained_source(model, PRESETS, MODEL_FORMS)
    if source in {hub for _, hub in PRESETS.values()} or Path(source).expanduser().is_dir():
        # the configs are at hand (a hub id's would need the hub): the size is known before loading
        ensure_pipeline_fits(component_configs(source), model, device, dtype)
    from ltxbench.models.hub import load_ltx_pipeline

    return load_ltx_pipeline(source, dtype, pipeline_class(needs_an_image(source)), MODEL_FORMS).to(device)


def pipeline_class(image_to_video: bool):
    """diffusers' WanImageToVideoPipeline for the I2V models, else WanPipeline (imported only where used: the I2V
    module brings CLIP's image processor, which warns without torchvision)."""
    if image_to_video:
        from diffusers import WanImageToVideoPipeline

        return WanImageToVideoPipeline
    from diffusers import WanPipeline

    return WanPipeline


def image_processor(size: int):
    """CLIP's image processor for images of `size` pixels (resize the short side, centre crop, CLIP's mean/std): what
    the released Wan 2.1 I2V pipelines ship, at 224."""
    import transformers

    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor  # no torchvision
    return cls(size={"shortest_edge": size}, crop_size={"height": size, "width": size})


def two_experts(model: str) -> bool:
    """Whether `model` is Wan 2.2 A14B-like (a low-noise expert transformer_2): a preset, or a hub id naming A14B.
    Read before torch loads."""
    return "a14b" in model.lower()  # the presets wan2.2-a14b, wan-tiny-a14b and Wan-AI/Wan2.2-*-A14B-*


def takes_an_image(model: str) -> bool:
    """Whether `model` runs image-to-video with --image: a TI2V model (a preset with per-token timesteps, or a hub id
    or directory naming TI2V) or an I2V one (needs_an_image). Read before torch loads."""
    return model in EXPAND_TIMESTEPS or "ti2v" in model.lower() or needs_an_image(model)


def needs_an_image(model: str) -> bool:
    """Whether `model` is an I2V model (Wan 2.1 I2V 14B, Wan 2.2 I2V A14B), which runs only image-to-video: a preset
    whose transformer takes the image's condition channels beside the latents, a hub id naming I2V, or a directory
    whose pipeline is Wan's image-to-video one. Read before torch loads."""
    if model in PRESETS:
        folder = CONFIGS / PRESETS[model][0]
        return _conditions_on_an_image({"transformer": json.loads((folder / "transformer.json").read_text())})
    root = Path(model).expanduser()
    if root.is_dir():
        index = root / "model_index.json"
        return index.is_file() and '"WanImageToVideoPipeline"' in index.read_text()
    return "-i2v-" in model.lower()


def _conditions_on_an_image(configs: dict[str, dict]) -> bool:
    """The I2V transformers take more input channels than they give out: the latents, then the first frame's mask
    and latents (Wan 2.1 I2V, Wan 2.2 I2V A14B: 16 + 4 + 16 in, 16 out); TI2V-5B takes its image as latents (48/48)."""
    transformer = configs["transformer"]
    return transformer["in_channels"] != transformer["out_channels"]


def _expands_timesteps(model: str, configs: dict[str, dict]) -> bool:
    """Per-token timesteps (Wan 2.2 5B), by preset, else by the VAE (the 5B model is the one with Wan 2.2's x16
    VAE)."""
    return model in EXPAND_TIMESTEPS or configs["vae"].get("scale_factor_spatial") == 16

