"""`bench e2e` for decoder-only LLMs (Llama 3, Mistral, Qwen2/3): prefill latency per prompt length and decode
tokens/s, per configuration, on ONE model built once (random weights from configs/llm/ or pretrained; the
trained weights of `smollm2-135m` come from an installed package, ltxbench.models.llm_weights).

Prefill: one forward over `L` token ids, logits of the last position only, no cache. The ids are text where the
model's tokenizer is at hand (the packaged presets: PASSAGE through it, repeated to the length), else random ids
from the seed.
Decode: `generate(..., cache_implementation="static", min_new_tokens=N, max_new_tokens=N, do_sample=False)` at
the shortest prompt length; a logits processor marks each generated token (CUDA events, no sync), so the first
mark ends the prefill and the N-1 intervals after it are the decode steps. The eager configurations run it with
transformers' auto-compile off (`disable_compile=True`). The compile configurations decode as transformers
users do with a static cache: generate() compiles the single-token step itself with
`CompileConfig(fullgraph=True, mode=decode_compile_mode)` — "reduce-overhead" (CUDA graphs) by default, the
strongest fair baseline — while the module-level compile of the prompt forwards is set aside for that call.
Only the standard library at top level.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from importlib import resources
from pathlib import Path

from ltxbench.errors import EnvironmentProblem, UsageError

LLM_CONFIGS = resources.files("ltxbench") / "configs" / "llm"
# preset -> hub id for --weights pretrained (None: random only); the presets of llm_weights.PACKAGED load from an
# installed package instead (the id says which model its file holds)
LLM_PRESETS = {"llama-3-8b": "meta-llama/Meta-Llama-3-8B", "mistral-7b": "mistralai/Mistral-7B-v0.1",
               "qwen2-7b": "Qwen/Qwen2-7B", "qwen3-8b": "Qwen/Qwen3-8B", "llama-tiny": None,
               "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
_LLM_WORDS = ("llama", "mistral", "qwen", "gemma", "phi", "gpt", "opt", "falcon", "smollm")
# The prompt text of the packaged presets: plain English, so that a trained model reads what it was trained on.
PASSAGE = ("The river left its banks in early spring, as it does most years, and the farmers along the valley moved "
           "their animals to the higher fields before the water came. By the end of April the ground had dried, the "
           "roads were open again, and the market in the old town square filled with bread, cheese, wool and the "
           "first green vegetables of the season. Children ran between the stalls while their parents argued about "
           "prices, the weather, and whether the new bridge would ever be finished.")
DECODE_COMPILE_DEFAULT = "reduce-overhead"  # transformers' CompileConfig default for static-cache decoding


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
    from ltxbench.models.memory import ensure_fits, module_bytes

    with torch.device("meta"):  # the size first: a model too large is refused before any allocation
        ensure_fits(module_bytes(AutoModelForCausalLM.from_config(cfg, dtype=dtype)), device, model, dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return net.eval().requires_grad_(False)


def _inject(model, provider):
    from ltxbench.inject.llm import apply_kernels

    return apply_kernels(model, provider)


def decode_kwargs(compiled: bool, mode: str) -> dict:
    """generate() keywords for the decode loop: eager (transformers' auto-compile off), or compiled by
    transformers itself (fullgraph: a graph break in the patched model is an error, not a silent slowdown)."""
    if not compiled:
        return {"disable_compile": True}
    from transformers.generation.configuration_utils import CompileConfig

    return {"disable_compile": False, "compile_config": CompileConfig(fullgraph=True, mode=mode)}


@contextlib.contextmanager
def module_compile_set_aside(model):
    """generate() compiles `model.__call__` itself; a module-level compile (nn.Module.compile) would sit under it
    and run generate()'s prompt forward too. Set it aside for the call, restore it after."""
    impl = getattr(model, "_compiled_call_impl", None)
    model._compiled_call_impl = None
    try:
        yield
    finally:
        model._compiled_call_impl = impl


def run_once(model, args: dict, ids: dict, compiled: bool = False) -> dict:
    """Prefill at every prompt length, then one generate() of N tokens at the shortest length (decoded by
    transformers' compiled step when `compiled`)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    from ltxbench.models.ltx import _Clock

    clock = _Clock(model.device)
    marks: list = []

    class Mark(LogitsProcessor):
        def __call__(self, input_ids, scores):
            marks.append(clock.mark())
            return scores

    out = {}
    with torch.no_grad():
        start = clock.mark()
        bounds = [start]
        for length in args["prompt_lengths"]:
            model(input_ids=ids[length], use_cache=False, logits_to_keep=1)
            bounds.append(clock.mark())
        gen_start = clock.mark()
        n, prompt = args["new_tokens"], ids[args["prompt_lengths"][0]]
        decode = decode_kwargs(compiled, args.get("decode_compile_mode", DECODE_COMPILE_DEFAULT))
        with module_compile_set_aside(model) if compiled else contextlib.nullcontext():
            model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), cache_implementation="static",
                           min_new_tokens=n, max_new_tokens=n, do_sample=False, pad_token_id=0,
                           logits_processor=LogitsProcessorList([Mark()]), **decode)
        end = clock.mark()
    clock.finish()
    for length, (a, b) in zip(args["prompt_lengths"], zip(bounds[:-1], bounds[1:], strict=True), strict=True):
        out[f"prefill_{length}_ms"] = clock.ms(a, b)
    out["generate_prefill_ms"] = clock.ms(gen_start, marks[0])
    out["step_ms"] = [clock.ms(a, b) for a, b in zip(marks[:-1], marks[1:], strict=True)]
    out["generate_ms"] = clock.ms(gen_start, end)
    out["total_ms"] = clock.ms(start, end)
    return out


def prompt_ids(args: dict, vocab_size: int) -> dict:
    """{length: (batch_size, length) token ids}: PASSAGE and a blank line through the model's own tokenizer, repeated
    to each length, for a packaged preset with its pretrained weights; seeded random ids (no special tokens) else."""
    import torch

    from ltxbench.models import llm_weights

    lengths, batch = args["prompt_lengths"], args["batch_size"]
    if args.get("weights") == "pretrained" and args.get("model") in llm_weights.PACKAGED:
        tokenizer = llm_weights.load_tokenizer(args["model"])
        text = tokenizer(PASSAGE + "\n\n", add_special_tokens=False, return_tensors="pt").input_ids[0]
        row = text.repeat(-(-max(lengths) // len(text)))
        return {n: row[:n].expand(batch, n).contiguous() for n in lengths}
    gen = torch.Generator("cpu").manual_seed(args["seed"])
    return {n: torch.randint(3, vocab_size, (batch, n), generator=gen) for n in lengths}


def run_llm(model, configs: list[str], args: dict, provider: str, log=lambda s: None) -> dict:
    from ltxbench.bench.e2e import run_configs

    device = model.device
    ids = {n: row.to(device) for n, row in prompt_ids(args, model.config.vocab_size).items()}
    try:
        return run_configs(model, configs, lambda: _inject(model, provider),
                           lambda config: run_once(model, args, ids, compiled=config.endswith("compile")),
                           args["warmup"], args["repeats"], device, log, args.get("compile_mode", "default"),
                           args.get("rounds", 1))
    finally:
        vars(model).pop("_compiled_call", None)  # generate()'s compiled step (transformers caches it here)


def build_records(results: dict, params: dict, dtype: str, prompt_lengths: list[int], new_tokens: int,
                  decode_compile_mode: str = DECODE_COMPILE_DEFAULT) -> list[dict]:
    """prefill (one per prompt length), decode_step (tokens/s derived), generate, compile records per config.
    The decode records of the compile configs carry decode_compile_mode (how generate() compiled the step)."""
    from ltxbench.bench.e2e_report import compile_derived, speedups
    from ltxbench.bench.gpu_monitor import summarize as gpu_summary
    from ltxbench.results.schema import make_record, stats_from_samples

    records = []
    for name, res in results.items():
        common = {"peak_memory_bytes": res["peak_memory_bytes"], "compile_s": res["compile_s"],
                  **gpu_summary(res.get("gpu_samples"), len(res["generate_ms"]))}
        for length in prompt_lengths:
            key = f"prefill_{length}_ms"
            records.append(make_record("prefill", name, dtype, {**params, "prompt_len": length}, "time", "ms",
                                       "lower", stats_from_samples(res[key]),
                                       derived={**common, **speedups(results, name, key)}))
        decode_params = {**params, "prompt_len": prompt_lengths[0], "new_tokens": new_tokens}
        if name.endswith("compile"):
            decode_params["decode_compile_mode"] = decode_compile_mode
        if res["step_ms"]:
            median = statistics.median(res["step_ms"])
            derived = {**common, **speedups(results, name, "step_ms"),
                       "tokens_per_s": 1e3 * params.get("batch_size", 1) / median if median > 0 else None}
            records.append(make_record("decode_step", name, dtype, decode_params, "time", "ms", "lower",
                                       stats_from_samples(res["step_ms"]), derived=derived))
        records.append(make_record("generate", name, dtype, decode_params, "time", "ms", "lower",
                                   stats_from_samples(res["generate_ms"]),
                                   derived={**common, **speedups(results, name, "generate_ms")}))
        if res["compile_s"] is not None:
            records.append(make_record("compile", name, dtype, params, "time", "s", "lower",
                                       stats_from_samples([res["compile_s"]]),
                                       derived=compile_derived(res)))
    return records
