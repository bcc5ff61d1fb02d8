"""Lightricks' own LTX-2 transformer (the `ltx-core` package, what LTX-2's reference pipelines and many users run) as
a peer configuration of `bench e2e` for LTX-2: `--configs ltx-core`.

The diffusers pipeline runs as it is; only its transformer call goes to ltx-core's `LTXModel`, built from the
transformer's own config (ltx-core's configurator, on the meta device) and given the diffusers model's weights
themselves (its parameters assigned by diffusers' own key conversion, `convert_ltx2_transformer_to_diffusers`: no copy,
no second 38 GB), with PyTorch's SDPA as its attention (ltx-core's "pytorch" backend; its "default" would take xformers
where installed). Each call's arguments are converted as ltx-core's pipelines give them: the timesteps unscaled
(ltx-core multiplies them by 1000 itself), the text mask as integers, the same RoPE coordinates the diffusers model
would compute, the modality-isolated pass as the A/V cross-attentions skipped in every block. ltx-core's A/V
cross-attention modulation reads the other stream's sigma (diffusers' `use_cross_timestep=True`), which is what
diffusers computes by default when both streams share one timestep per sample: text-to-video. The peer runs the
pipeline without its STG pass (a perturbation ltx-core defines differently, and a no-op on LTX-2.0's blocks in
diffusers: the `stg-off` configuration), and refuses per-token timesteps (image-to-video). Only the standard library at
top level.
"""

from __future__ import annotations

from ltxbench.models.ltx2 import LTX_CORE  # the configuration's name

RULE = ("transformer: ltx-core's LTXModel on the diffusers model's weights (SDPA attention), the pipeline without its "
        "STG pass")
# ltx-core's configurator checks these values (model_configurator.py) and fails on any other: the LTX-2 architecture
FIXED = {"dropout": 0.0, "attention_bias": True, "num_vector_embeds": None, "activation_fn": "gelu-approximate",
         "num_embeds_ada_norm": 1000, "use_linear_projection": False, "only_cross_attention": False,
         "cross_attention_norm": True, "double_self_attention": False, "upcast_attention": False,
         "standardization_norm": "rms_norm", "norm_elementwise_affine": False, "qk_norm": "rms_norm",
         "positional_embedding_type": "rope", "use_audio_video_cross_attention": True, "share_ff": False,
         "av_cross_ada_norm": True, "use_middle_indices_grid": True}


def available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("ltx_core", "einops"))


def require(config: str = LTX_CORE) -> None:
    """EnvironmentProblem (exit 4) naming `config` where the ltx-core package is not installed."""
    from ltxbench.errors import EnvironmentProblem

    if not available():
        raise EnvironmentProblem(f"--configs {config} needs Lightricks' ltx-core package",
                                 hint="pip install ltx-core einops (or pip install 'ltxbench[ltx-core]')")


def core_config(config) -> dict:
    """ltx-core's transformer config for a diffusers LTX2VideoTransformer3DModel config (LTX-2.0 blocks)."""
    return {**FIXED, "num_layers": config["num_layers"], "num_attention_heads": config["num_attention_heads"],
            "attention_head_dim": config["attention_head_dim"], "in_channels": config["in_channels"],
            "out_channels": config["out_channels"], "cross_attention_dim": config["cross_attention_dim"],
            "caption_channels": config["caption_channels"], "norm_eps": config["norm_eps"],
            "attention_type": "pytorch", "positional_embedding_theta": config["rope_theta"],
            "positional_embedding_max_pos": [config["pos_embed_max_pos"], config["base_height"],
                                             config["base_width"]],
            "timestep_scale_multiplier": config["timestep_scale_multiplier"],
            "audio_num_attention_heads": config["audio_num_attention_heads"],
            "audio_attention_head_dim": config["audio_attention_head_dim"],
            "audio_in_channels": config["audio_in_channels"], "audio_out_channels": config["audio_out_channels"],
            "audio_cross_attention_dim": config["audio_cross_attention_dim"],
            "audio_positional_embedding_max_pos": [config["audio_pos_embed_max_pos"]],
            "av_ca_timestep_scale_multiplier": config["cross_attn_timestep_scale_multiplier"],
            "rope_type": config["rope_type"],
            "frequencies_precision": "float64" if config["rope_double_precision"] else "float32",
            "apply_gated_attention": False, "cross_attention_adaln": False}


def core_model(transformer):
    """ltx-core's LTXModel for `transformer` (diffusers' LTX-2 model), its parameters the very tensors of
    `transformer`'s (ValueError where diffusers' key conversion does not account for every one of them)."""
    import torch
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers
    from ltx_core.model.transformer import LTXModelConfigurator

    from ltxbench.errors import UsageError

    config = transformer.config
    if config.get("gated_attn") or config.get("cross_attn_mod") or config.get("perturbed_attn"):
        raise UsageError(f"--configs {LTX_CORE}: the transformer has LTX-2.3 blocks; the peer builds LTX-2.0's")
    with torch.device("meta"):
        model = LTXModelConfigurator.from_config({"transformer": core_config(config)})
    # diffusers' conversion renames ltx-core's keys; run it on placeholders to learn the names, by identity
    placeholders = {key: torch.empty(0, device="meta") for key in model.state_dict()}
    renamed = convert_ltx2_transformer_to_diffusers(dict(placeholders))
    name_of = {id(value): key for key, value in renamed.items()}
    ours = transformer.state_dict(keep_vars=True)
    unmatched = [key for key, value in placeholders.items() if name_of.get(id(value)) not in ours]
    if unmatched or len(renamed) != len(ours):
        raise ValueError(f"ltx-core's {unmatched[:1] or 'weights'} do not map one to one onto diffusers' LTX-2 model")
    model.load_state_dict({key: ours[name_of[id(value)]] for key, value in placeholders.items()}, assign=True,
                          strict=True)
    return model.eval().requires_grad_(False)


class LtxCoreReport:
    """The ltx-core configuration applied: revert() gives the transformer its own forward again."""

    def __init__(self, transformer, model):
        from importlib import metadata

        self.transformer, self.model = transformer, model
        self.library = f"ltx-core {metadata.version('ltx-core')}"
        self.calls = 0

    def revert(self) -> None:
        vars(self.transformer).pop("forward", None)
        self.model = None

    def as_dict(self) -> dict:
        return {"applied": True, "provider": LTX_CORE, "library": self.library, "rules": {RULE: 1}, "skipped": [],
                "settings": {"attention_type": "pytorch"}}


def apply_ltx_core(pipe) -> LtxCoreReport:
    """The ltx-core configuration on `pipe`'s transformer (module docstring)."""
    require()
    transformer = pipe.transformer
    report = LtxCoreReport(transformer, core_model(transformer))

    def forward(**kwargs):
        report.calls += 1
        return _call(report.model, transformer, **kwargs)

    vars(transformer)["forward"] = forward
    return report


def _call(model, transformer, *, hidden_states, audio_hidden_states, encoder_hidden_states,
          audio_encoder_hidden_states, timestep, audio_timestep=None, encoder_attention_mask=None,
          audio_encoder_attention_mask=None, num_frames=None, height=None, width=None, fps=24.0,
          audio_num_frames=None, video_coords=None, audio_coords=None, isolate_modalities=False,
          spatio_temporal_guidance_blocks=None, return_dict=True, sigma=None, audio_sigma=None,
          use_cross_timestep=False, **others):
    """One diffusers-style transformer call answered by ltx-core's model. sigma, audio_sigma (read by LTX-2.3's
    blocks) and use_cross_timestep (the same result for one timestep per sample) change nothing here; any other
    argument given a value (a self-attention mask, keyframes, attention_kwargs) is refused, not dropped."""
    import torch
    from diffusers.models.transformers.transformer_ltx2 import AudioVisualModelOutput
    from ltx_core.guidance.perturbations import (
        BatchedPerturbationConfig,
        Perturbation,
        PerturbationConfig,
        PerturbationType,
    )
    from ltx_core.model.transformer import Modality

    if spatio_temporal_guidance_blocks:
        raise RuntimeError(f"{LTX_CORE}: the pipeline's STG pass reached the peer, which runs without it")
    given = sorted(name for name, value in others.items() if value is not None)
    if given:
        raise RuntimeError(f"{LTX_CORE}: the call passes {given[0]}, which the peer does not feed ltx-core")
    batch = hidden_states.size(0)
    audio_timestep = timestep if audio_timestep is None else audio_timestep
    if video_coords is None:
        video_coords = transformer.rope.prepare_video_coords(batch, num_frames, height, width, hidden_states.device,
                                                             fps=fps)
    if audio_coords is None:
        audio_coords = transformer.audio_rope.prepare_audio_coords(batch, audio_num_frames, audio_hidden_states.device)
    scale = transformer.config.timestep_scale_multiplier

    def modality(latent, steps, coords, context, mask):
        steps = steps.float() / scale
        if steps.dim() == 2 and not torch.equal(steps, steps[:, :1].expand_as(steps)):
            raise RuntimeError(f"{LTX_CORE}: per-token timesteps (image-to-video) are not fed to the peer")
        sigma = steps.reshape(batch, -1)[:, 0]
        return Modality(latent=latent, sigma=sigma, timesteps=sigma[:, None].expand(batch, latent.size(1)),
                        positions=coords, context=context, context_mask=None if mask is None else mask.long())

    video = modality(hidden_states, timestep, video_coords, encoder_hidden_states, encoder_attention_mask)
    audio = modality(audio_hidden_states, audio_timestep, audio_coords, audio_encoder_hidden_states,
                     audio_encoder_attention_mask)
    if isolate_modalities:  # every block without its A/V cross-attentions, for every sample
        skipped = [Perturbation(kind, None) for kind in (PerturbationType.SKIP_A2V_CROSS_ATTN,
                                                          PerturbationType.SKIP_V2A_CROSS_ATTN)]
        perturbations = BatchedPerturbationConfig([PerturbationConfig(skipped) for _ in range(batch)])
    else:
        perturbations = BatchedPerturbationConfig.empty(batch)
    video_out, audio_out = model(video, audio, perturbations)
    if not return_dict:
        return video_out, audio_out
    return AudioVisualModelOutput(sample=video_out, audio_sample=audio_out)
