"""Dev probe (seventeenth session): how fast is LTX's self-attention (attn1) with each SDPA backend, in TFLOP/s?

attn1 is ~22% of the optimized 49-frame step and ~45% at 161 frames, and it runs the same vendor kernel in every
configuration; this says how far the fastest backend is from the tensor-core rate. Shapes: LTX-2B, CFG batch 2,
32 heads of 64, S = 2688 (49 frames) / 8064 (161 frames); q/k/v laid out as diffusers passes them ((B, S, H, hd)
viewed as (B, H, S, hd)) and contiguous (B, H, S, hd). Timing: triton.testing.do_bench (median, warm L2: the
kernels are compute-bound). FLOPs: 4 * B * H * S^2 * hd (QK^T and PV). Prints one JSON line per case.
Run: python results/h100/tuning/attn1_probe.py
"""

import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def case(seq: int, layout: str, backend: str) -> dict:
    B, H, hd = 2, 32, 64
    gen = torch.Generator("cuda").manual_seed(0)
    shape = (B, seq, H, hd) if layout == "bshd" else (B, H, seq, hd)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    flops = 4 * B * H * seq * seq * hd
    try:
        with sdpa_kernel(BACKENDS[backend]):
            ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v), warmup=50, rep=300)
    except RuntimeError as e:
        return {"seq": seq, "layout": layout, "backend": backend, "error": str(e).splitlines()[0][:120]}
    return {"seq": seq, "layout": layout, "backend": backend, "us": round(ms * 1e3, 1),
            "tflops": round(flops / (ms * 1e-3) / 1e12, 1)}


if __name__ == "__main__":
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version()}))
    for seq in (2688, 8064):
        for layout in ("bshd", "bhsd"):
            for backend in BACKENDS:
                print(json.dumps(case(seq, layout, backend)), flush=True)
