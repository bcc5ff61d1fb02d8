"""Dev probe (fifteenth session): does a provider timed after ours on the SAME input run faster than on an input
ours never read (lines ours loaded with L2 evict_last surviving do_bench's flush)? `bench micro`'s timer
(time_cuda: do_bench, L2 flushed, host headroom), bf16, RMSNorm without weight, F.rms_norm and torch copy of x.
Usage: python l2_persist_bias.py"""
import torch
import torch.nn.functional as F

from ltxbench import ops
from ltxbench.bench.timing import time_cuda


def probe(shape):
    d = shape[-1]
    x, fresh = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(x)
    calls = [("F.rms_norm, input ours never read", lambda: F.rms_norm(fresh, (d,), None, 1e-6)),
             ("copy, input ours never read", lambda: out.copy_(fresh)),
             ("ours", lambda: ops.rms_norm(x, None, 1e-6)),
             ("F.rms_norm, after ours on the same input", lambda: F.rms_norm(x, (d,), None, 1e-6)),
             ("copy, after ours on the same input", lambda: out.copy_(x)),
             ("F.rms_norm, input ours never read (again)", lambda: F.rms_norm(fresh, (d,), None, 1e-6))]
    print(shape, " | ".join(f"{name}: {time_cuda(call)['median'] * 1e3:.2f}" for name, call in calls))


for shape in ((1, 1024, 2048), (4, 1024, 2048), (2, 2688, 2048)):
    probe(shape)
