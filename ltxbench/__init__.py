"""ltxbench: fused CUDA kernels for LTX-Video and LLM inference, and the benchmarks that prove them.

Nothing heavy is imported here: `ltxbench --help` must stay instant. Kernels live in `ltxbench.ops`.
"""

__version__ = "0.1.0"
