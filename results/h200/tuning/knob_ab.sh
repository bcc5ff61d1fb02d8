#!/bin/bash
# Dev driver (fifteenth session): A/B of runtime tuning knobs on one build, `bench micro --providers cuda`, two
# rounds in alternating order. Each setting is NAME=VALUE (or "default"); the summary gives the faster of the two
# round medians per shape and the ratio to the first setting.
# Usage (GPU machine, repo root): bash results/h200/tuning/knob_ab.sh OUTDIR "KERNELS" "SETTING ..." [bench args]
set -u
out=$1; kernels=$2; settings=$3; shift 3
mkdir -p "$out"
for round in 1 2; do
  order=$settings; [ $round = 2 ] && order=$(echo $settings | tr ' ' '\n' | tac | tr '\n' ' ')
  for s in $order; do
    env $([ $s = default ] || echo $s) python3 -m ltxbench bench micro $kernels --dtype bf16 --providers cuda "$@" \
      -o "$out/${s//=/_}-$round.json" > "$out/${s//=/_}-$round.log" 2>&1 || { echo "$s round $round failed"; tail -3 "$out/${s//=/_}-$round.log"; }
  done
done
python3 - "$out" $settings <<'PY'
import json, math, sys
from pathlib import Path
out, names = Path(sys.argv[1]), [s.replace("=", "_") for s in sys.argv[2:]]
runs = {}
for n in names:
    for f in sorted(out.glob(f"{n}-[12].json")):
        for r in json.load(open(f))["records"]:
            if r["provider"] == "cuda" and r.get("stats"):
                key = (r["name"], r["params"].get("shape_name"))
                runs.setdefault(key, {}).setdefault(n, []).append(r["stats"]["median"] * 1e3)
print(f"{'kernel':22s} {'shape':22s} " + " ".join(f"{n:>16s}" for n in names) + "   (us, faster of 2 rounds; ratio to the first)")
for key, by in runs.items():
    best = {n: min(by[n]) for n in names if n in by}
    print(f"{key[0]:22s} {str(key[1]):22s} " + " ".join(f"{best.get(n, float('nan')):16.2f}" for n in names) + "   "
          + " ".join(f"{best[n] / best[names[0]]:.3f}" for n in names[1:] if n in best))
PY
