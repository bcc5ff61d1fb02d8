"""What an LLM run does (ltxbench.models.llm declares the family): the configurations timed (prefill per prompt
length, then generate() of the decode), profiled, and recorded. Imported by the family's methods when an LLM run
needs it, so that editing it leaves the video families' stored results current (their runs never load it). Only the
standard library at top level.
"""

from __future__ import annotations

import contextlib
import statistics

from ltxbench.configurations import Configuration
from ltxbench.models.llm import DECODE_COMPILE_DEFAULT, PASSAGE, LLMSettings


def bench(family, model, settings: LLMSettings, log) -> dict:
    """`family`'s configurations timed (LLMFamily.bench); each result also carries the weight bytes a decode step
    reads and the GPU (decode_weights: the decode records' floor, flops.hbm_floor)."""
    import torch

    from ltxbench.bench import flops
    from ltxbench.bench.e2e import run_configs

    ids = {n: row.to(model.device) for n, row in prompt_ids(settings, model.config.vocab_size).items()}
    weights = {"bytes": flops.decode_weight_bytes(model),  # before the injection, which keeps the bytes
               "gpu": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else None}
    searched = _search_gemms(model, settings, ids, lambda: family.apply_config(model, settings, "optimized"), log)
    try:
        results = run_configs(model, settings.configs, lambda c: family.apply_config(model, settings, c),
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


def profile(family, model, settings: LLMSettings, traces: dict, log) -> dict:
    """`family`'s configurations profiled (LLMFamily.profile): each one's iteration as bench e2e times it."""
    import torch

    from ltxbench.bench.profile import profile_configs

    gen = torch.Generator("cpu").manual_seed(settings.seed)
    ids = torch.randint(3, model.config.vocab_size, (settings.batch_size, settings.prompt_length), generator=gen)
    ids, device = ids.to(model.device), torch.device(model.device)
    mode = settings.decode_compile_mode or DECODE_COMPILE_DEFAULT
    now: dict = {}  # the configuration being profiled: whether generate() compiles the decode step

    def apply(config: str):
        now["config"] = Configuration(config)
        return family.apply_config(model, settings, config)

    def iteration():
        config = now["config"]
        profiled_iteration(model, ids, settings.new_tokens, device.type == "cuda", config.compiled, mode,
                           fullgraph=config.peer is None, stop_check=settings.stop_check)

    try:
        return profile_configs(model, settings.configs, apply, iteration, device, traces, settings.top, log,
                               settings.compile_mode, compile_scope=settings.compile_scope)
    finally:
        vars(model).pop("_compiled_call", None)  # generate()'s compiled step (transformers caches it here)


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
                       decode_mode: str = DECODE_COMPILE_DEFAULT, fullgraph: bool = True,
                       stop_check: str = "per-token") -> None:
    """What `bench e2e` times (run_once), at one prompt length: the prefill of `ids` (no cache, last logits only),
    then generate() of `new_tokens` from them with a static cache, its decode step compiled by transformers
    (`decode_mode`, CUDA graphs by default) when the configuration compiles (`compiled`)."""
    import torch

    from ltxbench.bench.profile import phase

    with torch.no_grad():
        with phase("prefill", cuda):
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        with phase("generate", cuda):
            generate(model, ids, new_tokens, compiled, decode_mode, fullgraph, stop_check=stop_check)


def generate(model, prompt, new_tokens: int, compiled: bool, decode_mode: str, fullgraph: bool = True,
             stop_check: str = "per-token", **extra) -> None:
    """generate() of exactly `new_tokens` greedy tokens from `prompt` with a static cache, as `bench e2e` and
    `profile` run it: its decode step compiled by transformers (decode_kwargs) when `compiled`, the module-level
    compile set aside for the call, its stop flag read as `stop_check` says (deferred_stop_check); `extra`: more
    generate() keywords (run_once's logits processor)."""
    import torch

    deferred = stop_check == "deferred"
    with (module_compile_set_aside(model) if compiled else contextlib.nullcontext(),
          deferred_stop_check() if deferred else contextlib.nullcontext() as decisions):
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), cache_implementation="static",
                       min_new_tokens=new_tokens, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                       **decode_kwargs(compiled, decode_mode, fullgraph), **extra)
    if deferred and model.device.type == "cuda" and not any(decisions):
        from ltxbench.errors import EnvironmentProblem

        raise EnvironmentProblem("--stop-check deferred: this transformers' generate() kept its per-token stop check",
                                 hint="leave --stop-check out (per-token), or use transformers 5.17 or later")


@contextlib.contextmanager
def deferred_stop_check():
    """Within it, transformers' generate() reads its stop flag one step late on CUDA too, as it does on Apple GPUs:
    `DeferredStopCheck` copies the flag to pinned host memory without waiting and reads the previous step's, so the
    host queues the next step while the GPU runs this one, instead of idling the GPU for the whole host loop of every
    token. transformers enables it on "mps" only, "for cuda if we observe perf gains"; the tokens are the same (a
    sequence that ends early costs one extra step, which generate() drops). Yields the list of its decisions
    (True: deferred), one per generate() call, so that a caller can tell it took effect."""
    import torch
    from transformers.generation import utils

    from ltxbench.errors import EnvironmentProblem

    stop_check = getattr(utils, "DeferredStopCheck", None)
    if stop_check is None or not isinstance(stop_check.__dict__.get("is_supported"), staticmethod):
        raise EnvironmentProblem("--stop-check deferred needs transformers' DeferredStopCheck, which this version "
                                 "lacks", hint="use transformers 5.17 or later, or leave --stop-check out")
    original = stop_check.__dict__["is_supported"]
    decisions: list[bool] = []

    def is_supported(device, *args, **kwargs):
        device = torch.device(device)
        decision = original.__func__(torch.device("mps") if device.type == "cuda" else device, *args, **kwargs)
        decisions.append(bool(decision))
        return decision

    stop_check.is_supported = staticmethod(is_supported)
    try:
        yield decisions
    finally:
        stop_check.is_supported = original


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
                 settings.decode_compile_mode or DECODE_COMPILE_DEFAULT, fullgraph, settings.stop_check,
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
