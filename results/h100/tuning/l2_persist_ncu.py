"""Dev driver for ncu (fifteenth session): do lines loaded with the L2 evict_last policy survive do_bench's flush
(a 256 MB memset), and does cuCtxResetPersistingL2Cache clear them? Phases, a flush before every call:
A ours (evict_last loads) x3 on x (2x2688x2048 bf16); B copy_floor's Triton RMSNorm (plain loads) on x x2;
C the same after a reset x2; D ours on a 1x1024x2048 input x3; E the same after a reset x3.
Usage: ncu --cache-control none --replay-mode application -k regex:"row_op_lean|rms_rows" ... python this.py"""
import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from copy_floor import rms_rows  # noqa: E402

from ltxbench import ops  # noqa: E402

libcuda = ctypes.CDLL("libcuda.so.1")
x = torch.randn(2 * 2688, 2048, device="cuda", dtype=torch.bfloat16)
small = torch.randn(1, 1024, 2048, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def run(call, times, reset):
    for _ in range(times):
        torch.cuda.synchronize()
        if reset:
            assert libcuda.cuCtxResetPersistingL2Cache() == 0
        flush.zero_()
        torch.cuda._sleep(400_000)
        call()
    torch.cuda.synchronize()


def triton_plain():
    rms_rows[(x.shape[0],)](x, y, x.shape[0], 1e-6, D=2048, ROWS=1, POLICY="", num_warps=4)


run(lambda: ops.rms_norm(x.view(2, 2688, 2048), None, 1e-6), 3, False)  # A
run(triton_plain, 2, False)  # B
run(triton_plain, 2, True)  # C
run(lambda: ops.rms_norm(small, None, 1e-6), 3, False)  # D
run(lambda: ops.rms_norm(small, None, 1e-6), 3, True)  # E
print("done")
