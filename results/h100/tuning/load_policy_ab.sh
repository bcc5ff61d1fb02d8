#!/bin/bash
# Dev driver (fifteenth session): A/B of the load behind load_raw_keep (keep = main's L2 evict_last; plain; first;
# nc) on the kernels that use it, `bench micro --providers cuda`, two rounds in alternating order, one process per
# run. Usage (on the GPU machine, repo root): [VARIANTS="keep more"] [EXTRA="--variant coords"]
# bash results/h100/tuning/load_policy_ab.sh OUTDIR "KERNELS" [SHAPES]
set -u
out=$1; kernels=$2; shapes=${3:-all}; variants=${VARIANTS:-keep plain first nc}; extra=${EXTRA:-}
mkdir -p "$out" /tmp/lp
python3 results/h100/tuning/load_policy_variants.py /tmp/lp > /dev/null
src() { [ "$1" = keep ] && echo "$PWD/cuda" || echo "/tmp/lp/src-$1"; }
for v in $variants; do
  LTXBENCH_CUDA_SRC=$(src $v) LTXBENCH_CACHE=/tmp/ltxb-$v MAX_JOBS=6 \
    python3 -c "from ltxbench.ops import _build; print('$v', round(_build.load()['seconds'], 1), 's')" &
done
wait
for round in 1 2; do
  order=$variants; [ $round = 2 ] && order=$(echo $variants | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    LTXBENCH_CUDA_SRC=$(src $v) LTXBENCH_CACHE=/tmp/ltxb-$v python3 -m ltxbench bench micro $kernels \
      --shapes $shapes --dtype bf16 --providers cuda $extra -o "$out/$v-$round.json" > "$out/$v-$round.log" 2>&1 \
      || { echo "$v round $round failed"; tail -5 "$out/$v-$round.log"; }
  done
done
python3 - "$out" $variants <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {}
for f in sorted(out.glob("*-[12].json")):
    v = f.stem.rsplit("-", 1)[0]
    for r in json.load(open(f))["records"]:
        if r["provider"] == "cuda" and r.get("stats"):
            key = (r["name"], r["params"].get("shape_name"), r["params"].get("variant"))
            runs.setdefault(key, {}).setdefault(v, []).append(r["stats"]["median"] * 1e3)
names = sys.argv[2:]
print(f"{'kernel':22s} {'shape':22s} " + " ".join(f"{n:>8s}" for n in names) + "   (us, faster of 2 rounds; ratio to keep)")
ratios = {n: [] for n in names}
for key, by in runs.items():
    if not all(n in by for n in names):
        continue
    best = {n: min(by[n]) for n in names}
    for n in names:
        ratios[n].append(best[n] / best["keep"])
    print(f"{key[0]:22s} {str(key[1]):22s} " + " ".join(f"{best[n]:8.2f}" for n in names) + "   "
          + " ".join(f"{best[n] / best['keep']:.3f}" for n in names[1:]))
import math
print("geomean vs keep: " + ", ".join(f"{n} {math.exp(sum(map(math.log, r)) / len(r)):.3f}" for n, r in ratios.items() if r))
PY
