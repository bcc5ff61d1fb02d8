"""Dev helper (fifteenth session): the summary of an A/B written by src_ab.sh: per (kernel, shape, dtype) the faster
of the two round medians of each setting (files OUTDIR/NAME-1.json, NAME-2.json) and the ratio to the first setting.
Usage: python ab_summary.py OUTDIR NAME [NAME ...]"""
import json
import sys
from pathlib import Path

out, names = Path(sys.argv[1]), sys.argv[2:]
runs = {}
for name in names:
    for path in sorted(out.glob(f"{name}-[12].json")):
        for r in json.load(open(path))["records"]:
            if r["provider"] == "cuda" and r.get("stats"):
                key = (r["name"], r["params"].get("shape_name"), r["dtype"])
                runs.setdefault(key, {}).setdefault(name, []).append(r["stats"]["median"] * 1e3)
width = max(9, *(len(n) for n in names))
print(f"{'kernel':22s} {'shape':22s} {'dtype':5s} " + " ".join(f"{n:>{width}s}" for n in names)
      + "   (us, faster of 2 rounds; ratio to the first)")
for (kernel, shape, dtype), by in runs.items():
    best = {n: min(by[n]) for n in names if n in by}
    times = " ".join(f"{best.get(n, float('nan')):{width}.2f}" for n in names)
    ratios = " ".join(f"{best[n] / best[names[0]]:.3f}" for n in names[1:] if n in best and names[0] in best)
    print(f"{kernel:22s} {str(shape):22s} {dtype:5s} {times}   {ratios}")
