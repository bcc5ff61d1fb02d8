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
generate() reads its stop flag after every token, as transformers does on CUDA, or with `--stop-check deferred` one
token late for every configuration of the run (transformers' DeferredStopCheck; llm_run.deferred_stop_check).
Only the standard library at top level.
"""

from __future__ import annotations

import importlib.util
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
# generate()'s stop decision: read every token (transformers' choice on CUDA), or one step late (its DeferredStopCheck)
STOP_CHECKS = ("per-token", "deferred")


@dataclass(kw_only=True)
class LLMSettings(RunSettings):
    prompt_lengths: list[int] | None = None   # bench e2e: prefill lengths; decode starts from the first
    prompt_length: int | None = None          # profile: the one prefill length
    new_tokens: int = 128
    decode_compile_mode: str | None = None    # bench e2e, profile: how generate() compiles the decode step
    stop_check: str = "per-token"             # bench e2e, profile: when generate() reads its stop flag (STOP_CHECKS)
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
    Option("stop_check", ("--stop-check",), str, "per-token", "LLM decode, every configuration: generate() reads "
           "its stop flag after every token (transformers' default on CUDA: the GPU idles while the host loop runs) "
           "or one token late (deferred: transformers' DeferredStopCheck, the same tokens; docs/llm.md).",
           ("bench e2e", "profile"), choices=STOP_CHECKS),
    Option("tuned_gemm", ("--tuned-gemm/--no-tuned-gemm",), bool, True, "LLM optimized configs: a prompt's "
           "projections on cuBLASLt with the algorithm per shape chosen by timing (first call), or torch's linear.",
           ("bench e2e",)),
)


class LLMFamily(ModelFamily):
    name, title = "llm", "LLM"
    presets = LLM_PRESETS
    settings_class = LLMSettings
    run_module = "ltxbench.models.llm_run"
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
        if settings.stop_check == "deferred" and settings.device != "cuda":
            raise UsageError("--stop-check deferred needs --device cuda: transformers defers the stop check with CUDA "
                             "events", hint="leave --stop-check out on the CPU")
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
        return self.runs.bench(self, model, settings, log)

    def records(self, results: dict, params: dict, settings: LLMSettings) -> list[dict]:
        return self.runs.build_records(results, params, settings.dtype, settings.prompt_lengths, settings.new_tokens,
                                       settings.decode_compile_mode or DECODE_COMPILE_DEFAULT)

    def plot_parts(self, records) -> list[str]:
        lengths = dict.fromkeys(r["params"]["prompt_len"] for r in records if r["name"] == "prefill")
        return [*(f"prefill@{n}" for n in lengths), "generate"]

    def profile(self, model, settings: LLMSettings, traces: dict, log) -> dict:
        return self.runs.profile(self, model, settings, traces, log)

    def bench_argv(self, settings: LLMSettings) -> list[str]:
        return ["--prompt-lengths", str(settings.prompt_length), "--new-tokens", str(settings.new_tokens)]
