"""Dev driver for ncu (fifteenth session): RMSNorm without weight at LTX-2B's 49-frame shape (2x2688x2048 bf16)
after do_bench's kind of flush (a 256 MB memset leaves L2 full of dirty lines): ours, and copy_floor.py's Triton
kernels (one row per program, 4 warps) with plain and evict_last loads, one of them on an input never read before.
Each call runs 3 times, a flush before each. Usage: ncu --cache-control none --replay-mode application
-k regex:"row_op_lean|rms_rows|copy_rows" ... python rms_ncu.py [CANDIDATE,...]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from copy_floor import copy_rows, rms_rows  # noqa: E402

from ltxbench import ops  # noqa: E402

x = torch.randn(2 * 2688, 2048, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


fresh = torch.randn_like(x)  # read only by the one candidate below: no earlier reads of it can be in L2


def triton_rms(policy, src=x):
    return lambda: rms_rows[(src.shape[0],)](src, y, src.shape[0], 1e-6, D=2048, ROWS=1, POLICY=policy, num_warps=4)


calls = {"ours": lambda: ops.rms_norm(x.view(2, 2688, 2048), None, 1e-6),
         "triton-plain-fresh-input": triton_rms("", fresh),
         "triton-plain": triton_rms(""), "triton-evict_last": triton_rms("evict_last"),
         "triton-copy-plain": lambda: copy_rows[(x.shape[0],)](x, y, x.shape[0], D=2048, ROWS=1, POLICY="",
                                                                num_warps=4)}
if len(sys.argv) > 1:
    calls = {k: v for k, v in calls.items() if k in sys.argv[1].split(",")}
for name, call in calls.items():
    for _ in range(3):
        flush.zero_()
        torch.cuda._sleep(400_000)
        call()
    torch.cuda.synchronize()
    print(name, "done")
