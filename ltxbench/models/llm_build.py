"""LLMs built for a run: random weights from the package's configs (configs/llm/), or pretrained (a hub id or a
directory; the packaged presets of llm_weights from an installed package). Only the standard library at top level."""

from __future__ import annotations

import json
from pathlib import Path

from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.resources import configs_dir

LLM_CONFIGS = configs_dir("llm")  # configs/llm/ of the checkout, or the installed package's copy
# preset -> hub id for --weights pretrained (None: random only); the presets of llm_weights.PACKAGED load from an
# installed package instead (the id says which model its file holds)
LLM_PRESETS = {"llama-3-8b": "meta-llama/Meta-Llama-3-8B", "mistral-7b": "mistralai/Mistral-7B-v0.1",
               "qwen2-7b": "Qwen/Qwen2-7B", "qwen3-8b": "Qwen/Qwen3-8B", "llama-tiny": None,
               "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
               # Gemma 3 12B's text model (LTX-2's text encoder) as Gemma3ForCausalLM: random only (the released
               # checkpoints hold the multimodal Gemma3ForConditionalGeneration)
               "gemma-3-12b": None, "gemma-3-tiny": None}
_LLM_WORDS = ("llama", "mistral", "qwen", "gemma", "phi", "gpt", "opt", "falcon", "smollm")
def is_llm(model: str) -> bool:
    """LLM presets, a config .json, a directory with config.json but no model_index.json, or an LLM-named hub id."""
    if model in LLM_PRESETS:
        return True
    path = Path(model).expanduser()
    if path.suffix == ".json":
        return True
    if path.is_dir():
        return (path / "config.json").is_file() and not (path / "model_index.json").is_file()
    low = model.lower()
    return "ltx" not in low and any(word in low for word in _LLM_WORDS)


def _config(model: str, weights: str):
    from transformers import AutoConfig

    if model in LLM_PRESETS or Path(model).suffix == ".json":
        path = LLM_CONFIGS / f"{model}.json" if model in LLM_PRESETS else Path(model).expanduser()
        data = json.loads(path.read_text())
        return AutoConfig.for_model(data.pop("model_type"), **data)
    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"the config of {model!r} is not available offline ({type(exc).__name__})",
                                 hint=f"use a preset ({', '.join(LLM_PRESETS)})") from exc


def build_llm(model: str, weights: str, device, dtype, seed: int = 0):
    """AutoModelForCausalLM in eval mode on `device` in `dtype`: random (seeded, built on the device) or pretrained."""
    import torch
    from transformers import AutoModelForCausalLM

    if weights == "pretrained":
        from ltxbench.models import llm_weights

        if model in llm_weights.PACKAGED:
            return llm_weights.load_model(model, device, dtype)
        hub = LLM_PRESETS.get(model, model)
        if hub is None:
            raise UsageError(f"--model {model} has no pretrained weights", hint="use --weights random")
        try:
            net = AutoModelForCausalLM.from_pretrained(hub, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise EnvironmentProblem(f"weights for {hub!r} are not available offline ({type(exc).__name__})",
                                     hint="use --weights random") from exc
        return net.to(device).eval().requires_grad_(False)
    cfg = _config(model, weights)
    from ltxbench.memory.fit import ensure_fits, module_bytes

    with torch.device("meta"):  # the size first: a model too large is refused before any allocation
        ensure_fits(module_bytes(AutoModelForCausalLM.from_config(cfg, dtype=dtype)), device, model, dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return net.eval().requires_grad_(False)
