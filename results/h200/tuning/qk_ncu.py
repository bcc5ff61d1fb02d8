"""Dev driver for ncu (fifteenth session): ltxbench.qk_rms_norm_rope with angles from the grid (variant coords, as
the LTX injection runs it) at LTX-2B's 49-frame shape (2x2688x2048 bf16, CFG), 5 calls.
Usage: ncu -k regex:qk_norm_rope --launch-skip 3 --launch-count 1 --set full python qk_ncu.py [S]"""
import sys

import torch

from ltxbench import ops
from ltxbench.ops.registry import SPECS

S = int(sys.argv[1]) if len(sys.argv) > 1 else 2688
spec = SPECS["qk_rms_norm_rope"]
inputs = spec.make_inputs((2, S, 2048), torch.bfloat16, "cuda", torch.Generator().manual_seed(0), "coords")
for _ in range(5):
    out = spec.fn(**inputs)
torch.cuda.synchronize()
print("ran", ops.__name__, [tuple(t.shape) for t in out])
