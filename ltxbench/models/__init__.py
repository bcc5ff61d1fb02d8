"""Model families and the registry that resolves `--model` to one.

Each family is one class implementing `ltxbench.models.family.ModelFamily`; adding a family is one line in
FAMILIES. Importing this package is light (no torch, diffusers or transformers until a family builds a model).
"""

from __future__ import annotations

import functools
import importlib

from ltxbench.models.family import ModelFamily

# "module:class" per family, the more specific claims first (LTX-2's names also contain "ltx"; LTX-Video claims
# every pipeline directory, Wan's included).
FAMILIES = (
    "ltxbench.models.ltx2:LTX2Family",
    "ltxbench.models.wan:WanFamily",
    "ltxbench.models.ltx:LTXVideoFamily",
    "ltxbench.models.llm:LLMFamily",
)
DEFAULT = "ltx"  # the family of a model no family claims (a hub id with no telling name)


@functools.cache
def families() -> tuple[ModelFamily, ...]:
    loaded = []
    for entry in FAMILIES:
        module, name = entry.split(":")
        loaded.append(getattr(importlib.import_module(module), name)())
    return tuple(loaded)


def family_of(model: str) -> ModelFamily:
    """The family of --model: the one whose preset it is, else the first that claims it, else the default."""
    for family in families():
        if model in family.presets:
            return family
    for family in families():
        if family.claims(model):
            return family
    return next(family for family in families() if family.name == DEFAULT)


def presets() -> dict[str, ModelFamily]:
    """Every preset name of every family, in registry order."""
    return {name: family for family in families() for name in family.presets}


__all__ = ["DEFAULT", "FAMILIES", "ModelFamily", "families", "family_of", "presets"]
