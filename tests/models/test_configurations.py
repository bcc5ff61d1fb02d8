"""The run vocabulary (ltxbench.configurations): every configuration name parsed once into patch, precision and
compiled; names built back from the parts; nothing else in the package takes a name apart."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from ltxbench.configurations import STANDARD, Configuration, added_by, precision_label, with_attention
from ltxbench.models import families

PARTS = {
    "baseline": ("none", "bf16", False), "compile": ("none", "bf16", True),
    "optimized": ("ours", "bf16", False), "optimized+compile": ("ours", "bf16", True),
    "optimized-fp8": ("ours", "fp8", False), "optimized-fp8+compile": ("ours", "fp8", True),
    "optimized-fp8-attention": ("ours", "fp8-attention", False),
    "optimized-fp8-attention+compile": ("ours", "fp8-attention", True),
    "liger": ("liger", "bf16", False), "liger+compile": ("liger", "bf16", True),
    "stg-off+compile": ("stg-off", "bf16", True),
}


@pytest.mark.parametrize("name", PARTS)
def test_a_name_parses_into_its_parts_and_back(name):
    config = Configuration(name)
    assert (config.patch, config.precision, config.compiled) == PARTS[name]
    assert config == name and config.name == name and isinstance(config, str)
    assert Configuration.of(*PARTS[name]) == name
    assert config.ours == (config.patch == "ours") and config.peer == (None if config.patch in ("none", "ours")
                                                                       else config.patch)
    assert config.standard == (name in STANDARD)
    again = pickle.loads(pickle.dumps(config))
    assert (again, again.patch, again.precision, again.compiled) == (name, *PARTS[name])


@pytest.mark.parametrize("name", ["compile@fa3", "baseline@fa3", "optimized@fa3", "optimized-fp8+compile@fa3"])
def test_an_attention_of_its_own_is_one_more_part(name):
    config = Configuration(name)
    bare = Configuration(name.partition("@")[0])
    assert config.attention == "fa3" and bare.attention is None
    assert (config.patch, config.precision, config.compiled) == (bare.patch, bare.precision, bare.compiled)
    assert Configuration.of(bare.patch, bare.precision, bare.compiled, "fa3") == name
    assert not config.standard and config.peer is None
    assert pickle.loads(pickle.dumps(config)).attention == "fa3"


def test_with_attention_takes_ours_and_the_unpatched_model_but_fp8_attention_and_peers_not_named():
    assert with_attention(["baseline", "optimized+compile", "optimized-fp8-attention", "liger", "compile@fa3"],
                          "fa3") == ("baseline@fa3", "optimized+compile@fa3")
    assert with_attention(["stg-off+compile", "ltx-core", "compile"], "fa3", ("stg-off",)) == (
        "stg-off+compile@fa3", "compile@fa3")
    config = Configuration("stg-off+compile@fa3")
    assert (config.peer, config.compiled, config.attention) == ("stg-off", True, "fa3")


def test_the_video_families_take_configurations_with_fa3_the_llms_do_not():
    from ltxbench.models import family_of
    from ltxbench.models.family import parse_configs

    video, llm = family_of("ltx-tiny").config_names(), family_of("llama-tiny").config_names()
    assert {"compile@fa3", "optimized+compile@fa3", "optimized-fp8+compile@fa3"} <= set(video)
    assert "optimized-fp8-attention@fa3" not in video and not any(c.attention for c in llm)
    ltx2 = set(family_of("ltx2-tiny").config_names())
    assert {"stg-off@fa3", "stg-off+compile@fa3"} <= ltx2  # LTX-2's peer of its own attention, not ltx-core's
    assert not {"ltx-core@fa3", "group-offload@fa3"} & ltx2 and "stg-off@fa3" not in video
    assert not any(c.attention for c in parse_configs("all", video))  # "all" needs no package


@pytest.mark.parametrize("name", ["", "+compile", "baseline+compile", "compile+compile", "optimized-fp16",
                                  "optimized-bf16", "optimized+compile+compile", "liger+x", "compile@", "compile@fa2",
                                  "optimized-fp8-attention@fa3", "compile@fa3@fa3"])
def test_what_is_not_a_configuration_is_refused(name):
    with pytest.raises(ValueError, match="not a configuration"):
        Configuration(name)


def test_precision_adds_ours_in_that_precision_eager_and_compiled():
    assert added_by("bf16") == () and added_by("unknown") == ()
    assert added_by("fp8") == ("optimized-fp8", "optimized-fp8+compile")
    assert added_by("fp8-attention") == ("optimized-fp8", "optimized-fp8+compile", "optimized-fp8-attention",
                                         "optimized-fp8-attention+compile")


def test_every_familys_configurations_parse():
    for family in families():
        for name in family.config_names():
            assert isinstance(name, Configuration) and Configuration(name) == name


def test_precision_label():
    assert precision_label({"dtype": "bf16"}) == "bf16"
    assert precision_label({"dtype": "fp8", "params": {"fp8_accumulation": "fast"}}) == "fp8, fast accumulation"


def test_no_module_but_the_vocabulary_takes_a_name_apart():
    """A grep for the name's parts outside ltxbench/configurations.py finds none (help texts may name them)."""
    root = Path(__file__).resolve().parents[2] / "ltxbench"
    parsing = re.compile(r"""(endswith|startswith|removesuffix|removeprefix)\(\s*"""
                         r"""["'](\+?compile|optimized|liger)["'+-]""")
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "configurations.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if parsing.search(line)]
    assert found == []
