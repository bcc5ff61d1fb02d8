"""The Gemma 3 presets: gemma-3-12b is the text model LTX-2's text encoder runs, built as Gemma3ForCausalLM."""

from __future__ import annotations

import json

import torch

from ltxbench.models import family_of
from ltxbench.models.llm_build import LLM_CONFIGS, _config, build_llm
from ltxbench.models.ltx2_build import CONFIGS as LTX2_CONFIGS


def test_gemma_3_12b_is_the_ltx2_text_encoders_text_model():
    """Same Gemma3TextConfig as the text_config of configs/ltx2/ltx2-19b/text_encoder.json (Gemma 3 12B's released
    config.json in transformers 4.5x's layout), written in transformers 5's (rope_parameters per layer type)."""
    from transformers import AutoConfig

    text = json.loads((LTX2_CONFIGS / "ltx2-19b" / "text_encoder.json").read_text())["text_config"]
    released = AutoConfig.for_model(text.pop("model_type"), **text)
    ours = _config("gemma-3-12b", "random")
    assert type(ours).__name__ == "Gemma3TextConfig"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "hidden_activation", "rms_norm_eps",
                "max_position_embeddings", "sliding_window", "layer_types", "rope_parameters",
                "attn_logit_softcapping", "final_logit_softcapping", "tie_word_embeddings"):
        assert getattr(ours, key) == getattr(released, key), key
    assert (ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads, ours.num_key_value_heads,
            ours.head_dim, ours.intermediate_size, ours.vocab_size, ours.query_pre_attn_scalar) == (
        3840, 48, 16, 8, 256, 15360, 262208, 256)
    assert ours.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"] and ours.sliding_window == 1024
    assert ours.rope_parameters == {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}


def test_gemma_3_12b_builds_as_gemma3_for_causal_lm_on_meta():
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config("gemma-3-12b", "random"), dtype=torch.bfloat16)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    assert 11.7e9 < params < 11.8e9, params


def test_gemma_3_tiny_has_a_global_and_sliding_layers():
    assert family_of("gemma-3-tiny").name == "llm" and family_of("gemma-3-12b").name == "llm"
    data = json.loads((LLM_CONFIGS / "gemma-3-tiny.json").read_text())
    assert data["model_type"] == "gemma3_text"
    model = build_llm("gemma-3-tiny", "random", "cpu", torch.float32, seed=0)
    assert type(model).__name__ == "Gemma3ForCausalLM" and not model.training
    assert model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [8, None, 8]
