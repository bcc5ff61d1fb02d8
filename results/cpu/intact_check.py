"""Time fuse._intact's eager check (three fused nn.Linear layers with biases, CPU) against the check it replaced
(a4a7bd9: read `lin.weight`/`lin.bias` through nn.Module.__getattr__ and walk the expected data pointers).
Writes JSON to stdout: microseconds per call, median of 7 runs of 20000 calls each."""
import json
import platform
import statistics
import subprocess
import time

import torch

from ltxbench.inject.fuse import _intact, fuse_linears


def check_before_a4a7bd9(x, linears, fused):
    params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
    if len(params) != len(fused.params) or any(p is not q for p, q in zip(params, fused.params, strict=True)):
        return False
    weight_at, bias_at = fused.weight.data_ptr(), fused.bias.data_ptr() if fused.bias is not None else 0
    rows_w = fused.weight.stride(0) * fused.weight.element_size()
    rows_b = fused.bias.element_size() if fused.bias is not None else 0
    for lin in linears:
        if lin.weight.data_ptr() != weight_at or (lin.bias is not None and lin.bias.data_ptr() != bias_at):
            return False
        weight_at += lin.weight.shape[0] * rows_w
        bias_at += lin.weight.shape[0] * rows_b
    return True


def per_call_us(fn, *args, calls=20000, runs=7):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


layers = [torch.nn.Linear(64, 64) for _ in range(3)]
fused = fuse_linears(layers)
x = torch.randn(2, 64)
assert _intact(x, layers, fused) and check_before_a4a7bd9(x, layers, fused)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"what": "fuse._intact eager check, 3 fused Linear(64, 64) with bias, CPU",
                  "commit": commit, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                  "us_per_call": {"before_a4a7bd9": round(per_call_us(check_before_a4a7bd9, x, layers, fused), 2),
                                  "now": round(per_call_us(_intact, x, layers, fused), 2)}}, indent=1))
