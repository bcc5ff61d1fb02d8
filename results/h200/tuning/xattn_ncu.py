"""Dev driver for ncu (fourteenth session): ltxbench.cross_attention at LTX-2B's attn2 shape (CFG batch 2, 32 heads,
hd 64 unless argv[2], 128 text keys with a padded prompt), bf16, 5 calls.
Usage: ncu --kernel-name regex:xattn_mma --launch-skip 3 --launch-count 1 ... python xattn_ncu.py [S] [HD]"""
import sys

import torch

from ltxbench import ops

S = int(sys.argv[1]) if len(sys.argv) > 1 else 2688
HD = int(sys.argv[2]) if len(sys.argv) > 2 else 64
B, H, L = 2, 2048 // HD, 128
g = torch.Generator("cuda").manual_seed(0)
q, k, v = (torch.randn(B, n, H, HD, device="cuda", dtype=torch.bfloat16, generator=g) for n in (S, L, L))
mask = torch.zeros(B, H, 1, L, device="cuda", dtype=torch.bfloat16)
mask[0, :, :, 40:] = -10000.0
for _ in range(5):
    out = ops.cross_attention(q, k, v, mask)
torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       attn_mask=mask).transpose(1, 2)
print("max abs diff vs SDPA", (out.float() - ref.float()).abs().max().item())
