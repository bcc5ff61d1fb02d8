"""ltxbench.models.llm_peers: Liger-Kernel's instance patch on a tiny Llama, and its exact revert.

Liger's kernels are Triton GPU kernels: on the CPU the tests check the patch and its revert through _apply (which
skips the device check) and run forwards only unpatched or reverted; the GPU test runs the patched model."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch

from ltxbench.errors import EnvironmentProblem
from ltxbench.models import llm_peers

TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "llm" / "llama-tiny.json"
# The kernels Liger's llama patch swaps in, per rule: 2 layers x 2 norms + the final norm, 2 MLPs, one rope function
LLAMA_RULES = {"rms_norm": 5, "swiglu": 2, "rope": 1}


def tiny_llama(dtype=torch.float32, device="cpu", **overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    data = {**json.loads(TINY_CONFIG.read_text()), **overrides}
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # norm weights other than ones, so a norm that dropped its weight would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return model.eval()


def prompt(device="cpu"):
    return torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)


def instance_state(model) -> dict:
    """Every submodule's __dict__ and its parameter/buffer/child tables, as (name, key) -> value."""
    state = {}
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            state[name, key] = value
            if key in ("_parameters", "_buffers", "_modules"):
                state.update({(name, key, k): v for k, v in value.items()})
    return state


def assert_same_objects(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    changed = [key for key in before if after[key] is not before[key]]
    assert not changed, f"not restored: {changed[:5]}"


@pytest.fixture
def modeling_llama():
    """Llama's modeling module; its globals are put back after the test whatever happened, so that a failed revert
    here cannot leak Liger's functions into other tests."""
    from transformers.models.llama import modeling_llama

    saved = dict(vars(modeling_llama))
    yield modeling_llama
    for key in [key for key in vars(modeling_llama) if key not in saved]:
        delattr(modeling_llama, key)
    vars(modeling_llama).update(saved)


def assert_globals_restored(modeling_llama, before: dict) -> None:
    assert_same_objects(before, dict(vars(modeling_llama)))
    # Explicitly too, so that a revert that skipped the module's globals fails here whatever the generic check does
    for name in ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP"):
        assert getattr(modeling_llama, name) is before[name], f"{name} not restored"


def test_refuses_a_model_on_the_cpu():
    with pytest.raises(EnvironmentProblem, match="CUDA device, and it is on cpu") as info:
        llm_peers.apply_liger(tiny_llama())
    assert info.value.exit_code == 4


def test_missing_liger_is_an_environment_problem(monkeypatch):
    real_import = builtins.__import__

    def no_liger(name, *args, **kwargs):
        if name.split(".")[0] == "liger_kernel":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_liger)
    with pytest.raises(EnvironmentProblem, match="need Liger-Kernel, which is not installed") as info:
        llm_peers._apply(tiny_llama())
    assert info.value.exit_code == 4 and info.value.hint == "pip install liger-kernel"


def test_patch_then_revert_restores_every_object(modeling_llama):
    pytest.importorskip("liger_kernel")
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    model = tiny_llama()
    with torch.no_grad():
        expected = model(prompt()).logits
    state, globals_before = instance_state(model), dict(vars(modeling_llama))
    parameters = {name: (p, p.data_ptr(), p.clone()) for name, p in model.named_parameters()}

    report = llm_peers._apply(model)
    assert report.active and report.as_dict() == {"applied": True, "provider": "liger", "rules": LLAMA_RULES,
                                                  "skipped": [], "library": report.library}
    assert report.library.startswith("liger-kernel ")
    layer = model.model.layers[0]
    assert layer.mlp.forward.__func__ is LigerSwiGLUMLP.forward
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
        assert norm.forward.__func__ is LigerRMSNorm.forward
    assert modeling_llama.apply_rotary_pos_emb is liger_rotary_pos_emb
    # Liger writes no parameter or buffer: the tables hold the same tensors, with the same storage and values
    for name, p in model.named_parameters():
        assert p is parameters[name][0] and p.data_ptr() == parameters[name][1]

    report.revert()
    assert not report.active
    assert_same_objects(state, instance_state(model))
    assert_globals_restored(modeling_llama, globals_before)
    assert all(torch.equal(p, parameters[name][2]) for name, p in model.named_parameters())
    with torch.no_grad():
        assert torch.equal(model(prompt()).logits, expected)
    report.revert()  # a second revert does nothing
    assert_same_objects(state, instance_state(model))


def test_a_revert_that_skips_the_globals_is_caught(modeling_llama):
    """The mutation the test above must catch: the instance state restored, the module's globals left patched."""
    pytest.importorskip("liger_kernel")
    model = tiny_llama()
    state, globals_before = instance_state(model), dict(vars(modeling_llama))
    report = llm_peers._apply(model)
    report._changes = [change for change in report._changes if change[0].kind != "globals"]
    report.revert()
    assert_same_objects(state, instance_state(model))
    with pytest.raises(AssertionError, match="not restored"):
        assert_globals_restored(modeling_llama, globals_before)  # the fixture puts the globals back
    assert modeling_llama.apply_rotary_pos_emb is not globals_before["apply_rotary_pos_emb"]


def test_context_manager_reverts_on_exit(modeling_llama):
    pytest.importorskip("liger_kernel")
    model = tiny_llama()
    state, rope = instance_state(model), modeling_llama.apply_rotary_pos_emb
    with pytest.raises(RuntimeError, match="inside"), llm_peers._apply(model) as report:
        assert report.active and modeling_llama.apply_rotary_pos_emb is not rope
        raise RuntimeError("inside")
    assert not report.active and modeling_llama.apply_rotary_pos_emb is rope
    assert_same_objects(state, instance_state(model))


def test_a_family_liger_does_not_patch_is_skipped_not_raised():
    pytest.importorskip("liger_kernel")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32,
                                 bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(config)
    state = instance_state(model)
    report = llm_peers._apply(model)
    result = report.as_dict()
    assert not result["applied"] and not report.active and result["rules"] == {}
    assert result["skipped"][0]["target"] == "gpt2" and "model type 'gpt2'" in result["skipped"][0]["reason"]
    assert_same_objects(state, instance_state(model))


def test_a_forward_already_on_the_instance_is_not_discarded(modeling_llama):
    """An accelerate hook puts the module's forward on the instance; Liger's patch would replace it silently."""
    pytest.importorskip("liger_kernel")
    from accelerate.hooks import ModelHook, add_hook_to_module

    model = tiny_llama()
    add_hook_to_module(model.model.norm, ModelHook())
    state, globals_before = instance_state(model), dict(vars(modeling_llama))
    report = llm_peers._apply(model)
    assert not report.active and not report.as_dict()["applied"]
    assert report.skipped[0][0] == "model.norm" and "forward was already replaced" in report.skipped[0][1]
    assert_same_objects(state, instance_state(model))
    assert_globals_restored(modeling_llama, globals_before)


def test_swiglu_left_alone_for_another_activation(modeling_llama):
    pytest.importorskip("liger_kernel")
    report = llm_peers._apply(tiny_llama(hidden_act="gelu"))
    with report:
        assert report.as_dict()["rules"] == {"rms_norm": 5, "rope": 1}
        assert report.skipped == [("swiglu", "the model's activation is 'gelu', and Liger's SwiGLU computes silu")]


@pytest.mark.gpu
def test_liger_on_cuda_bf16_matches_and_reverts_exactly(modeling_llama):
    pytest.importorskip("liger_kernel")
    model = tiny_llama(torch.bfloat16, "cuda")
    ids = prompt("cuda")
    with torch.no_grad():
        expected = model(ids).logits.float()
        state = instance_state(model)
        with llm_peers.apply_liger(model) as report:
            assert report.as_dict()["rules"] == LLAMA_RULES
            patched = model(ids).logits.float()
        reverted = model(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(patched.flatten(), expected.flatten(), dim=0).item()
    print(f"Liger vs unpatched logits cosine {cosine:.6f}")
    assert cosine >= 0.999
    assert torch.equal(reverted, expected)
    assert_same_objects(state, instance_state(model))
