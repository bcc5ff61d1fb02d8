"""The LLM family (decoder-only: Llama 3, Mistral, Qwen2/3, SmolLM2): prefill latency per prompt length and decode
tokens/s per configuration, on ONE model built once (ltxbench.models.llm_build). Peer configurations: Liger-Kernel's
(`liger`, `liger+compile`; ltxbench.models.llm_peers).

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
import importlib.util
import statistics
from dataclasses import dataclass

from ltxbench.configurations import COMPILE_MODES, Configuration
from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.models.family import ModelFamily, Option, PeerConfig, RunSettings, positive_ints
from ltxbench.models.llm_build import LLM_PRESETS, build_llm, is_llm

# The prompt text of the packaged presets: plain English, so that a trained model reads what it was trained on.
PASSAGE = ("The river left its banks in early spring, as it does most years, and the farmers along the valley moved "
           "their animals to the higher fields before the water came. By the end of April the ground had dried, the "
           "roads were open again, and the market in the old town square filled with bread, cheese, wool and the "
           "first green vegetables of the season. Children ran between the stalls while their parents argued about "
           "prices, the weather, and whether the new bridge would ever be finished.")
DECODE_COMPILE_DEFAULT = "reduce-overhead"  # transformers' CompileConfig default for static-cache decoding


@dataclass(kw_only=True)
class LLMSettings(RunSettings):
    prompt_lengths: list[int] | None = None   # bench e2e: prefill lengths; decode starts from the first
    prompt_length: int | None = None          # profile: the one prefill length
    new_tokens: int = 128
    decode_compile_mode: str | None = None    # bench e2e, profile: how generate() compiles the decode step
    tuned_gemm: bool | None = None


OPTIONS = (
    Option("prompt_lengths", ("--prompt-lengths",), str, "512,2048", "LLM prefill prompt lengths (comma-separated).",
           ("bench e2e",)),
    Option("prompt_length", ("--prompt-length",), int, 512, "LLM prefill length.", ("profile",)),
    Option("new_tokens", ("--new-tokens",), int, 128, "LLM decode: tokens generated (min = max).",
           ("bench e2e", "profile"), defaults={"profile": 8},
           helps={"profile": "LLM decode steps profiled."}),
    Option("decode_compile_mode", ("--decode-compile-mode",), str, DECODE_COMPILE_DEFAULT, "LLM compile configs: "
           "mode of the decode step that generate() compiles itself (transformers' CompileConfig; its default).",
           ("bench e2e", "profile"), choices=COMPILE_MODES),
    Option("tuned_gemm", ("--tuned-gemm/--no-tuned-gemm",), bool, True, "LLM optimized configs: a prompt's "
           "projections on cuBLASLt with the algorithm per shape chosen by timing (first call), or torch's linear.",
           ("bench e2e",)),
)


class LLMFamily(ModelFamily):
    name, title = "llm", "LLM"
    presets = LLM_PRESETS
    settings_class = LLMSettings
    options = OPTIONS

    def claims(self, model: str) -> bool:
        return is_llm(model)

    def settings(self, command: str, **values) -> LLMSettings:
        if isinstance(values.get("prompt_lengths"), str):
            values["prompt_lengths"] = positive_ints("--prompt-lengths", values["prompt_lengths"])
        return super().settings(command, **values)

    def validate(self, settings: LLMSettings, command: str) -> None:
        for flag, value in (("--new-tokens", settings.new_tokens), ("--prompt-length", settings.prompt_length)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} {value} must be at least 1")
        peers = sorted({c.peer for c in map(Configuration, settings.configs or ()) if c.peer is not None})
        if peers and settings.device != "cuda":  # before the model is built, not after the other configurations ran
            raise UsageError(f"--configs {peers[0]} needs --device cuda: Liger-Kernel's kernels are Triton GPU kernels",
                             hint="leave the liger configurations out on the CPU")
        if peers and importlib.util.find_spec("liger_kernel") is None:
            raise EnvironmentProblem("the liger configurations need Liger-Kernel, which is not installed",
                                     hint="pip install 'ltxbench[liger]' (or liger-kernel)")
        if settings.compile_scope == "regional":
            raise UsageError("--compile-scope regional is for diffusers models (their repeated blocks); LLMs compile "
                             "whole", hint="leave --compile-scope out, or pass --compile-scope model")

    def peers(self) -> dict[str, PeerConfig]:
        from ltxbench.models import llm_peers

        return {"liger": PeerConfig("liger", llm_peers.apply_liger)}  # its instance patch: RMSNorm, RoPE, SwiGLU

    def build(self, settings: LLMSettings):
        from ltxbench.models.family import torch_dtype

        return build_llm(settings.model, settings.weights, settings.device, torch_dtype(settings.dtype),
                         settings.seed)

    def inject(self, model, settings: LLMSettings):
        from ltxbench.inject.llm import apply_kernels

        return apply_kernels(model, settings.kernel_provider, tuned_gemm=settings.tuned_gemm is not False)

    def bench(self, model, settings: LLMSettings, log) -> dict:
        """The configurations timed; each result also carries the weight bytes a decode step reads and the GPU
        (decode_weights: the decode records' floor, flops.hbm_floor)."""
        import torch

        from ltxbench.bench import flops
        from ltxbench.bench.e2e import run_configs

        ids = {n: row.to(model.device) for n, row in prompt_ids(settings, model.config.vocab_size).items()}
        weights = {"bytes": flops.decode_weight_bytes(model),  # before the injection, which keeps the bytes
                   "gpu": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else None}
        searched = _search_gemms(model, settings, ids, lambda: self.apply_config(model, settings, "optimized"), log)
        try:
            results = run_configs(model, settings.configs, lambda c: self.apply_config(model, settings, c),
                                  lambda config: run_once(model, settings, ids,
                                                          compiled=Configuration(config).compiled,
                                                          fullgraph=Configuration(config).peer is None),
                                  settings.warmup, settings.repeats, model.device, log, settings.compile_mode,
                                  settings.rounds, compile_scope=settings.compile_scope,
                                  unit_flops=lambda _timings, calls: flops.llm_units(settings.prompt_lengths, calls))
        finally:
            vars(model).pop("_compiled_call", None)  # generate()'s compiled step (transformers caches it here)
        chosen = searched() if searched is not None else {}  # process-wide: every configuration's GEMMs
        for name, res in results.items():
            res["decode_weights"] = weights
            if Configuration(name).ours:
                res["injection"].update(chosen)
        return results

    def records(self, results: dict, params: dict, settings: LLMSettings) -> list[dict]:
        return build_records(results, params, settings.dtype, settings.prompt_lengths, settings.new_tokens,
                             settings.decode_compile_mode or DECODE_COMPILE_DEFAULT)

    def plot_parts(self, records) -> list[str]:
        lengths = dict.fromkeys(r["params"]["prompt_len"] for r in records if r["name"] == "prefill")
        return [*(f"prefill@{n}" for n in lengths), "generate"]

    def profile(self, model, settings: LLMSettings, traces: dict, log) -> dict:
        import torch

        from ltxbench.bench.profile import profile_configs

        gen = torch.Generator("cpu").manual_seed(settings.seed)
        ids = torch.randint(3, model.config.vocab_size, (settings.batch_size, settings.prompt_length), generator=gen)
        ids, device = ids.to(model.device), torch.device(model.device)
        mode = settings.decode_compile_mode or DECODE_COMPILE_DEFAULT
        now: dict = {}  # the configuration being profiled: whether generate() compiles the decode step

        def apply(config: str):
            now["config"] = Configuration(config)
            return self.apply_config(model, settings, config)

        def iteration():
            config = now["config"]
            profiled_iteration(model, ids, settings.new_tokens, device.type == "cuda", config.compiled, mode,
                               fullgraph=config.peer is None)

        try:
            return profile_configs(model, settings.configs, apply, iteration, device, traces, settings.top, log,
                                   settings.compile_mode, compile_scope=settings.compile_scope)
        finally:
            vars(model).pop("_compiled_call", None)  # generate()'s compiled step (transformers caches it here)

    def bench_argv(self, settings: LLMSettings) -> list[str]:
        return ["--prompt-lengths", str(settings.prompt_length), "--new-tokens", str(settings.new_tokens)]


def _search_gemms(model, settings: LLMSettings, ids: dict, inject, log):
    """With our kernels among the configurations on the GPU and tuned_gemm on: one untimed prefill per prompt length
    of the patched model (inject(): the optimized configs' injection), eager, before any configuration, so that
    ops.linear's algorithm search (or the load of stored choices) is not counted in a configuration's first call
    (compile time). Returns a function giving what ops.linear chose per shape (process-wide, read after the
    configurations ran) and the search's seconds; None when nothing is searched."""
    import time

    import torch

    if (settings.tuned_gemm is False or settings.kernel_provider != "cuda" or model.device.type != "cuda"
            or not any(Configuration(name).ours for name in settings.configs)):
        return None
    from ltxbench import ops

    log("optimized: choosing the GEMM algorithms (untimed, one prefill per prompt length)")
    start = time.perf_counter()
    with inject(), torch.no_grad():
        for length in settings.prompt_lengths:
            model(input_ids=ids[length], use_cache=False, logits_to_keep=1)
    torch.cuda.synchronize(model.device)
    seconds = time.perf_counter() - start
    return lambda: {"gemm_choices": ops.gemm_choices(), "gemm_search_s": seconds}


def profiled_iteration(model, ids, new_tokens: int, cuda: bool, compiled: bool = False,
                       decode_mode: str = DECODE_COMPILE_DEFAULT, fullgraph: bool = True) -> None:
    """What `bench e2e` times (run_once), at one prompt length: the prefill of `ids` (no cache, last logits only),
    then generate() of `new_tokens` from them with a static cache, its decode step compiled by transformers
    (`decode_mode`, CUDA graphs by default) when the configuration compiles (`compiled`)."""
    import torch

    from ltxbench.bench.profile import phase

    with torch.no_grad():
        with phase("prefill", cuda):
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        with phase("generate", cuda):
            generate(model, ids, new_tokens, compiled, decode_mode, fullgraph)


def generate(model, prompt, new_tokens: int, compiled: bool, decode_mode: str, fullgraph: bool = True,
             **extra) -> None:
    """generate() of exactly `new_tokens` greedy tokens from `prompt` with a static cache, as `bench e2e` and
    `profile` run it: its decode step compiled by transformers (decode_kwargs) when `compiled`, the module-level
    compile set aside for the call; `extra`: more generate() keywords (run_once's logits processor)."""
    import torch

    with module_compile_set_aside(model) if compiled else contextlib.nullcontext():
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), cache_implementation="static",
                       min_new_tokens=new_tokens, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                       **decode_kwargs(compiled, decode_mode, fullgraph), **extra)


def decode_kwargs(compiled: bool, mode: str, fullgraph: bool = True) -> dict:
    """generate() keywords for the decode loop: eager (transformers' auto-compile off), or compiled by
    transformers itself (fullgraph for ours and torch's: a graph break in the patched model is an error, not a
    silent slowdown; a peer library's breaks are its own, and its configuration runs with them)."""
    if not compiled:
        return {"disable_compile": True}
    from transformers.generation.configuration_utils import CompileConfig

    return {"disable_compile": False, "compile_config": CompileConfig(fullgraph=fullgraph, mode=mode)}


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


def run_once(model, settings: LLMSettings, ids: dict, compiled: bool = False, fullgraph: bool = True) -> dict:
    """Prefill at every prompt length, then one generate() of N tokens at the shortest length (decoded by
    transformers' compiled step when `compiled`)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    from ltxbench.bench.timing import PhaseClock

    clock = PhaseClock(model.device)
    marks: list = []

    class Mark(LogitsProcessor):
        def __call__(self, input_ids, scores):
            marks.append(clock.mark())
            return scores

    out = {}
    with torch.no_grad():
        start = clock.mark()
        bounds = [start]
        for length in settings.prompt_lengths:
            model(input_ids=ids[length], use_cache=False, logits_to_keep=1)
            bounds.append(clock.mark())
        gen_start = clock.mark()
        generate(model, ids[settings.prompt_lengths[0]], settings.new_tokens, compiled,
                 settings.decode_compile_mode or DECODE_COMPILE_DEFAULT, fullgraph,
                 logits_processor=LogitsProcessorList([Mark()]))
        end = clock.mark()
    clock.finish()
    for length, (a, b) in zip(settings.prompt_lengths, zip(bounds[:-1], bounds[1:], strict=True), strict=True):
        out[f"prefill_{length}_ms"] = clock.ms(a, b)
    out["generate_prefill_ms"] = clock.ms(gen_start, marks[0])
    out["step_ms"] = [clock.ms(a, b) for a, b in zip(marks[:-1], marks[1:], strict=True)]
    out["generate_ms"] = clock.ms(gen_start, end)
    out["total_ms"] = clock.ms(start, end)
    return out


def prompt_ids(settings: LLMSettings, vocab_size: int) -> dict:
    """{length: (batch_size, length) token ids}: PASSAGE and a blank line through the model's own tokenizer, repeated
    to each length, for a packaged preset with its pretrained weights; seeded random ids (no special tokens) else."""
    import torch

    from ltxbench.models import llm_weights

    lengths, batch = settings.prompt_lengths, settings.batch_size
    if settings.weights == "pretrained" and settings.model in llm_weights.PACKAGED:
        tokenizer = llm_weights.load_tokenizer(settings.model)
        text = tokenizer(PASSAGE + "\n\n", add_special_tokens=False, return_tensors="pt").input_ids[0]
        row = text.repeat(-(-max(lengths) // len(text)))
        return {n: row[:n].expand(batch, n).contiguous() for n in lengths}
    gen = torch.Generator("cpu").manual_seed(settings.seed)
    return {n: torch.randint(3, vocab_size, (batch, n), generator=gen) for n in lengths}


def build_records(results: dict, params: dict, dtype: str, prompt_lengths: list[int], new_tokens: int,
                  decode_compile_mode: str = DECODE_COMPILE_DEFAULT) -> list[dict]:
    """prefill (one per prompt length), decode_step (tokens/s derived), generate, compile records per config.
    The decode records of the compile configs carry decode_compile_mode (how generate() compiled the step)."""
    from ltxbench.bench.e2e_report import compile_derived, flop_rates, speedups
    from ltxbench.bench.flops import hbm_floor
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
                                       derived={**common, **speedups(results, name, key),
                                                **flop_rates(res, key, dtype, params)}))
        decode_params = {**params, "prompt_len": prompt_lengths[0], "new_tokens": new_tokens}
        if Configuration(name).compiled:
            decode_params["decode_compile_mode"] = decode_compile_mode
            if Configuration(name).peer is not None:  # a peer's decode step compiles with its graph breaks
                decode_params["decode_fullgraph"] = False
        if res["step_ms"]:
            median = statistics.median(res["step_ms"])
            weights = res.get("decode_weights") or {}
            derived = {**common, **speedups(results, name, "step_ms"), **flop_rates(res, "step_ms", dtype, params),
                       "tokens_per_s": 1e3 * params.get("batch_size", 1) / median if median > 0 else None}
            if params.get("batch_size", 1) == 1:  # the floor of a batch-1 step: every weight read once
                derived.update(hbm_floor(weights.get("bytes"), median, weights.get("gpu")))
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
