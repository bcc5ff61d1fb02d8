"""Dev probe (twenty-fifth session): GEMM choices A/B at the power cap, outside the model.

    python gemm_ab.py search PROBLEMS.json          # run ops.linear's search on every problem, save the choices
    python gemm_ab.py time PROBLEMS.json LABEL      # time every problem with the choices this process loads

PROBLEMS.json is a GEMM-choices file (ltxbench/ops/gemm_choices/<GPU>.json): its record keys name the problems.
Which choices a `time` process runs is set by the caller through LTXBENCH_GEMM_CACHE (the user's file takes
precedence over the shipped one; `off` = the heuristic's first choice, what torch runs). Each problem runs back to
back for 0.6 s, the first third untimed, in two rounds over the problem list: the GPU sits at the 700 W cap, as in
the 161-frame step. Prints one JSON line per problem.
"""

import json
import sys
import time
from pathlib import Path

import torch

import ltxbench.ops as ops
from ltxbench.ops import gemm_cache


def problems(path):
    for record in gemm_cache.read_records(Path(path)):
        f = [int(v) for v in record.split("\t")[0].split()[1:13]]
        _version, dtype, act, _align, bias, residual, tokens, n, k = f[:9]
        yield {"dtype": {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}[dtype], "act": act, "bias": bias,
               "residual": residual, "tokens": tokens, "n": n, "k": k}


def operands(p):
    g = torch.Generator(device="cuda").manual_seed(0)
    def rand(*shape):
        return (torch.rand(*shape, device="cuda", generator=g) - 0.5).to(p["dtype"])
    x, w = rand(p["tokens"], p["k"]), rand(p["n"], p["k"]) * 0.05
    bias = rand(p["n"]) if p["bias"] else None
    residual = rand(p["tokens"], p["n"]) if p["residual"] else None
    act = "gelu_tanh" if p["act"] == 1 else "none"
    return lambda: ops.linear(x, w, bias, act, residual)


def sustained_us(fn, seconds=0.6):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < seconds / 3:  # untimed: the power limiter settles
        fn()
        n += 1
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 2 * n
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def main():
    mode, path = sys.argv[1], sys.argv[2]
    todo = list(problems(path))
    if mode == "search":
        ops.gemm_tuning(True)
        for p in todo:
            operands(p)()
        torch.cuda.synchronize()
        print("saved to", ops.save_gemm_choices())
        print("\n".join(ops.gemm_choices()))
        return
    label = sys.argv[3]
    print(f"{label}: {ops.load_gemm_choices()} stored choices kept", file=sys.stderr)
    ops.gemm_tuning(False)
    fns = [operands(p) for p in todo]
    times = [[] for _ in todo]
    for _round in range(2):
        for i, fn in enumerate(fns):
            times[i].append(sustained_us(fn))
    choices = ops.gemm_choices()
    for p, t in zip(todo, times):
        key = f"tokens {p['tokens']} n {p['n']} k {p['k']} "
        formula = "gelu" if p["act"] else ("residual" if p["residual"] else "bias")
        summary = next((c for c in choices if key in c and (("gelu" in c) == bool(p["act"]))
                        and (("residual" in c) == bool(p["residual"]))), "")
        print(json.dumps({"label": label, "tokens": p["tokens"], "n": p["n"], "k": p["k"], "epilogue": formula,
                          "us": [round(v, 2) for v in t], "mean_us": round(sum(t) / len(t), 2),
                          "choice": summary.split("): ", 1)[-1]}))


if __name__ == "__main__":
    main()
