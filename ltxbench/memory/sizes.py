"""What a memory plan is made of, for a video family's run: every component counted on the meta device (no memory,
no init; memory.fit.module_bytes), split into the layer stacks that can stream (the family's `memory_stacks`), what
runs outside them, what stays on the host unused (`memory_host_only`), and the activation estimates of the run's shapes
(plan.activation_bytes, plan.decode_bytes)."""

from __future__ import annotations

import functools

from ltxbench.configurations import Configuration
from ltxbench.memory.plan import EXPERTS, Footprint, Stack, activation_bytes, decode_bytes

TILE_FRAMES, TILE_SIDE = 17, 512  # a VAE decode tile with tiling on (diffusers' LTX VAEs: 16 frames, 512 pixels)


def at(module, path: str):
    """The submodule of `module` at the dotted `path`."""
    return functools.reduce(getattr, path.split("."), module)


def fp8_saving(block) -> int:
    """Bytes FP8 saves on `block`: each nn.Linear weight at one byte per value, plus a float32 scale per row."""
    import torch

    return sum(m.weight.numel() * (m.weight.element_size() - 1) - 4 * m.out_features
               for m in block.modules() if type(m) is torch.nn.Linear)


def stack_of(component: str, module, path: str, host_only: tuple[str, ...] = (), fp8: bool = False) -> Stack:
    """`module`'s stack at `path` (its largest block, FP8-sized when `fp8`) and the bytes outside it that run on the
    GPU (not `host_only`)."""
    from ltxbench.memory.fit import module_bytes

    blocks = list(at(module, path))
    sizes = [module_bytes(b) - (fp8_saving(b) if fp8 else 0) for b in blocks]
    outside = module_bytes(module) - sum(module_bytes(b) for b in blocks) - module_bytes(
        *(at(module, p) for p in host_only))
    return Stack(component, len(blocks), max(sizes), outside)


def _video_tokens(transformer, vae, settings) -> int:
    """The transformer's video tokens, from the configs (as models.video_phases.video_tokens from a built pipeline): the
    VAE's compression (LTX: *_compression_ratio, 32 x 8 where the config leaves it to the class; Wan:
    scale_factor_*) over the transformer's patch (LTX: patch_size, patch_size_t; Wan: a (t, h, w) patch_size)."""
    spatial = getattr(vae, "spatial_compression_ratio", None) or getattr(vae, "scale_factor_spatial", None) or 32
    temporal = getattr(vae, "temporal_compression_ratio", None) or getattr(vae, "scale_factor_temporal", None) or 8
    patch = transformer.patch_size
    if isinstance(patch, (tuple, list)):
        patch_t, patch = patch[0], patch[1]
    else:
        patch_t = getattr(transformer, "patch_size_t", None) or 1
    frames = (settings.num_frames - 1) // temporal + 1
    return (frames // patch_t) * (settings.height // spatial // patch) * (settings.width // spatial // patch)


def text_kv_bytes(family, transformer, samples: int, guided: bool, element_size: int = 2) -> int:
    """The text keys and values our kernels keep through a generation (ltxbench.inject: every block's text
    cross-attentions, computed once): blocks x (key + value widths) x prompt tokens x the prompt rows kept, which are
    the guidance batch's and, guided, the family's extra ones."""
    blocks = list(at(transformer, family.memory_stacks["transformer"]))
    widths = sum(getattr(blocks[0], name).to_k.out_features + getattr(blocks[0], name).to_v.out_features
                 for name in family.text_attentions if hasattr(blocks[0], name))
    rows = samples + (family.text_kv_extra_rows if guided else 0)
    return len(blocks) * widths * family.text_tokens * rows * element_size


def _host_only(family, component: str) -> tuple[str, ...]:
    prefix = f"{component}."
    return tuple(p.removeprefix(prefix) for p in family.memory_host_only if p.startswith(prefix))


def _fp8_block_bytes(family, parts: dict) -> int:
    """The transformer's largest block in FP8 (its FP8 copy's bytes)."""
    path = family.memory_stacks["transformer"]
    return stack_of("transformer", parts["transformer"], path, _host_only(family, "transformer"), True).block_bytes


def footprint(family, settings, parts: dict) -> Footprint:
    """The Footprint of `settings`' run of `family` whose components (on the meta device) are `parts`. Experts beyond
    the first (Wan 2.2 A14B's `transformer_2`, the transformer's config) are counted as the transformer."""
    from ltxbench.memory.fit import module_bytes

    # the precisions the run's configurations take (generate: --precision's): the plan holds FP8 blocks only where
    # every configuration runs them; the FP8 copies are made on the host where any does
    precisions = {Configuration(c).precision for c in getattr(settings, "configs", None) or ()} or {settings.precision}
    fp8, fp8_copies = "bf16" not in precisions, precisions != {"bf16"}
    stacks = {name: stack_of(name, parts[name], path, _host_only(family, name), fp8 and name == "transformer")
              for name, path in family.memory_stacks.items()}
    transformer, text_encoder = stacks["transformer"], stacks["text_encoder"]
    experts = sum(name in parts for name in EXPERTS)
    others = tuple((name, module_bytes(part)) for name, part in parts.items()
                   if name not in stacks and name not in EXPERTS and hasattr(part, "parameters"))
    built = module_bytes(*(p for p in parts.values() if hasattr(p, "parameters")))
    # the FP8 copies are made on the host beside the bf16 weights (kept there for revert), after the build
    copies = experts * transformer.blocks * _fp8_block_bytes(family, parts) if fp8_copies else 0
    config, vae = parts["transformer"].config, parts["vae"].config
    tokens = _video_tokens(config, vae, settings)
    guided = any(getattr(settings, name, 0) > 1 for name in ("guidance_scale", "audio_guidance_scale"))
    samples = settings.batch_size * (2 if guided else 1)
    hidden = config.num_attention_heads * config.attention_head_dim
    encoder = parts["text_encoder"]
    text = encoder.config.get_text_config()
    width = getattr(text, "hidden_size", None) or text.d_model
    head = getattr(encoder, "lm_head", None)
    # one prompt's embeddings, every layer's hidden states (LTX-2 reads them all): the encode holds the prompts before
    # the current one and the current one's twice (the layers' outputs and their stack); the pipeline keeps the
    # guidance batch's (and, guided, the negative prompt's own) until it returns
    prompt = (text_encoder.blocks + 1) * family.text_tokens * width * 2
    kept = prompt * (samples + (1 if guided else 0))
    encode = (activation_bytes(family.text_tokens, width, 1, vocab=head.out_features if head is not None else 0)
              + prompt * (samples + 1))
    # the decoder's width at full resolution: LTX's VAEs name it; Wan's is its base width (dim_mult starts at 1)
    channels = (getattr(vae, "decoder_block_out_channels", None) or getattr(vae, "block_out_channels", None)
                or [vae.base_dim])[0]
    patch = getattr(vae, "patch_size", None) or 1
    denoise = activation_bytes(tokens, hidden, samples) + text_kv_bytes(family, parts["transformer"], samples,
                                                                         guided) + kept
    return Footprint(transformer, text_encoder, others, built, denoise, encode,
                     kept + decode_bytes(min(settings.num_frames, family.decode_frames or settings.num_frames),
                                         settings.height, settings.width, channels, patch),
                     kept + decode_bytes(min(settings.num_frames, TILE_FRAMES), min(settings.height, TILE_SIDE),
                                         min(settings.width, TILE_SIDE), channels, patch), experts, copies)
