"""Model builders: pipelines from real weights (hub id or directory) or from configs/ with random weights.

Importing this package is light (no torch/diffusers at import time); the builders import them when called.
"""

from ltxbench.models.ltx import build_pipeline, inject_kernels, run_generate, validate_video_args

__all__ = ["build_pipeline", "inject_kernels", "run_generate", "validate_video_args"]
