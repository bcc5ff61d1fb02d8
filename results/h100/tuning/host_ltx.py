"""Host vs GPU time of one LTX-2B transformer forward (49f, CFG batch 2), baseline and optimized; cProfile of each."""
import cProfile, io, pstats, statistics, sys, time
import torch
from diffusers import LTXVideoTransformer3DModel
from ltxbench.inject.ltx import apply_kernels

torch.manual_seed(0)
with torch.device("cuda"):
    tr = LTXVideoTransformer3DModel().to(torch.bfloat16).eval()
B, F, H, W = 2, 7, 16, 24
S = F * H * W
kw = dict(hidden_states=torch.randn(B, S, 128, device="cuda", dtype=torch.bfloat16),
          encoder_hidden_states=torch.randn(B, 128, 4096, device="cuda", dtype=torch.bfloat16),
          timestep=torch.full((B,), 500.0, device="cuda"),
          encoder_attention_mask=torch.ones(B, 128, device="cuda", dtype=torch.bfloat16),
          num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)

def measure(name):
    with torch.no_grad():
        for _ in range(3): tr(**kw)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10): tr(**kw)
        e1.record(); torch.cuda.synchronize()
        gpu = e0.elapsed_time(e1) / 10
        host = []
        for _ in range(10):
            torch.cuda.synchronize(); t = time.perf_counter(); tr(**kw); host.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
        # host time with the GPU kept busy first (the queue then holds the forward while the host runs ahead)
        print(f"{name}: back-to-back {gpu:.2f} ms/forward; host time of one forward after a sync: median "
              f"{statistics.median(host):.2f} ms (min {min(host):.2f})", flush=True)
        pr = cProfile.Profile()
        torch.cuda.synchronize(); pr.enable(); tr(**kw); pr.disable(); torch.cuda.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])

measure("baseline")
report = apply_kernels(tr, "cuda")
measure("optimized")
