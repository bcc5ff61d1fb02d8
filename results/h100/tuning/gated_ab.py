"""Dev A/B (twenty-first session): LTX-2B 161f eager optimized step, gate_msa folded into attn1's out-projection
(default) vs the gated_residual pass, alternated in one process (rounds x modes), same pipeline, stored GEMM choices."""
import statistics
import sys

import torch

import ltxbench.inject.ltx_step as ltx_step
from ltxbench.bench.e2e import _encode, run_once
from ltxbench.inject.ltx import apply_kernels
from ltxbench.models.ltx import build_pipeline

frames = int(sys.argv[1]) if len(sys.argv) > 1 else 161
args = {"seed": 42, "num_frames": frames, "height": 512, "width": 768, "frame_rate": 25, "steps": 10,
        "guidance_scale": 3.0, "batch_size": 1, "phase": "transformer"}
pipe = build_pipeline("ltx-2b", "random", "cuda", "bf16")
pipe.set_progress_bar_config(disable=True)
with torch.no_grad():
    embeds = _encode(pipe, args, torch.device("cuda"))
real = ltx_step.one_timestep
steps = {"fold": [], "pass": []}
with apply_kernels(pipe, "cuda"):
    for round_index in range(3):
        for mode in ("fold", "pass") if round_index % 2 == 0 else ("pass", "fold"):
            ltx_step.one_timestep = real if mode == "fold" else (lambda timestep: False)
            run_once(pipe, args, embeds)  # warmup
            for _ in range(2):
                steps[mode] += run_once(pipe, args, embeds)["step_ms"]
            print(mode, round_index, round(statistics.median(steps[mode][-20:]), 2), flush=True)
for mode, samples in steps.items():
    print(f"{mode}: median step {statistics.median(samples):.2f} ms over {len(samples)} steps")
