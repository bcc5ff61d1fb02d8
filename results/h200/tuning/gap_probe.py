"""Dev probe (fourteenth session): where the idle time between kernels of a profiled LTX step goes.

Reads the chrome traces that `ltxbench profile --trace-dir DIR` writes and prints, per trace: device busy / idle
time, a histogram of the gaps between consecutive device events, the largest gaps with the kernels around them, and
how far ahead of the GPU the host was: for each kernel, its start minus the end of the runtime call that launched it
(slack near zero = the GPU waited for the host). Usage: python gap_probe.py TRACE.json [...]
"""

import json
import statistics
import sys

BUCKETS = (2, 5, 20, 100, 1000, float("inf"))


def load(path):
    events = json.load(open(path))["traceEvents"]
    device = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                    key=lambda e: e["ts"])
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    return device, launches


def report(path):
    device, launches = load(path)
    gaps, big, slack = [], [], []
    for prev, cur in zip(device, device[1:]):
        gap = cur["ts"] - (prev["ts"] + prev["dur"])
        gaps.append(gap)
        big.append((gap, prev["name"][:70], cur["name"][:70]))
    for e in device:
        launch = launches.get(e["args"].get("correlation"))
        if launch is not None:
            slack.append(e["ts"] - (launch["ts"] + launch["dur"]))
    span = device[-1]["ts"] + device[-1]["dur"] - device[0]["ts"]
    busy = sum(e["dur"] for e in device)
    print(f"== {path}: {len(device)} device events, span {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, "
          f"idle {(span - busy) / 1e3:.2f} ms")
    lo = 0
    for hi in BUCKETS:
        sel = [g for g in gaps if lo <= g < hi]
        print(f"  gaps {lo:>5}-{hi:<5} us: {len(sel):5d}, total {sum(sel) / 1e3:7.3f} ms")
        lo = hi
    neg = [g for g in gaps if g < 0]
    if neg:
        print(f"  overlapping events: {len(neg)}")
    print("  largest gaps (us, before, after):")
    for gap, a, b in sorted(big, reverse=True)[:12]:
        print(f"    {gap:8.1f}  {a}  ->  {b}")
    if slack:
        starved = [s for s in slack if s < 5]
        print(f"  host lead (kernel start - launch end): median {statistics.median(slack):.0f} us, "
              f"p10 {sorted(slack)[len(slack) // 10]:.0f} us, {len(starved)} of {len(slack)} kernels started < 5 us "
              f"after their launch returned")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        report(p)
