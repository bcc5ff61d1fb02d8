"""A/B of attn2 through ltxbench.cross_attention vs SDPA (cuDNN) inside the patched LTX-2B transformer: GPU time of
one forward (CFG batch 2, 512x768, FRAMES frames), eager, the two variants alternated; output difference between
them. Usage: python xattn_step.py [FRAMES]   (prints one line per measurement)."""
import statistics
import sys

import torch
from diffusers import LTXVideoTransformer3DModel

from ltxbench.inject.ltx import apply_kernels

frames = int(sys.argv[1]) if len(sys.argv) > 1 else 49
torch.manual_seed(0)
with torch.device("cuda"):
    tr = LTXVideoTransformer3DModel().to(torch.bfloat16).eval()
B, F, H, W = 2, (frames - 1) // 8 + 1, 16, 24
g = torch.Generator("cuda").manual_seed(1)
mask = torch.ones(B, 128, device="cuda", dtype=torch.bfloat16)
mask[0, 40:] = 0  # a padded prompt
kw = dict(hidden_states=torch.randn(B, F * H * W, 128, device="cuda", dtype=torch.bfloat16, generator=g),
          encoder_hidden_states=torch.randn(B, 128, 4096, device="cuda", dtype=torch.bfloat16, generator=g),
          timestep=torch.full((B,), 500.0, device="cuda"), encoder_attention_mask=mask,
          num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)


def gpu_ms(n=10):
    with torch.no_grad():
        for _ in range(3):
            tr(**kw)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        for _ in range(n):
            tr(**kw)
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / n


with torch.no_grad():
    base_out = tr(**kw)[0].float()
outs, times = {}, {True: [], False: []}
for rnd in range(3):
    for xattn in (False, True) if rnd % 2 == 0 else (True, False):
        with apply_kernels(tr, "cuda", cross_attention=xattn) as report:
            times[xattn].append(gpu_ms())
            with torch.no_grad():
                outs[xattn] = tr(**kw)[0].float()
        print(f"{frames}f round {rnd} cross_attention={xattn}: {times[xattn][-1]:.2f} ms/forward", flush=True)


def cos(a, b):
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


for xattn in (False, True):
    print(f"{frames}f cross_attention={xattn}: median {statistics.median(times[xattn]):.2f} ms "
          f"({', '.join(f'{t:.2f}' for t in times[xattn])}); output cosine to unpatched {cos(outs[xattn], base_out):.6f}")
print(f"{frames}f kernel vs SDPA outputs: cosine {cos(outs[True], outs[False]):.6f}, "
      f"max abs diff {(outs[True] - outs[False]).abs().max().item():.4g} (|out| max {outs[False].abs().max().item():.3g})")
