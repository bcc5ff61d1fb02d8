#!/bin/bash
# Dev driver (fifteenth session): A/B of cuda/ source trees, `bench micro --providers cuda`, each tree built into
# its own cache (in parallel), two rounds in alternating order; the summary gives the faster of the two round
# medians per (kernel, shape, dtype) and the ratio to the first tree.
# Usage (GPU machine, repo root): bash results/h200/tuning/src_ab.sh OUTDIR "KERNELS" "NAME=DIR ..." [bench args]
set -u
out=$1; kernels=$2; trees=$3; shift 3
mkdir -p "$out"
names=""
for t in $trees; do
  n=${t%%=*}; d=$(cd "${t#*=}" && pwd); names="$names $n"
  LTXBENCH_CUDA_SRC=$d LTXBENCH_CACHE=/tmp/ltxb-src-$n MAX_JOBS=6 \
    python3 -c "from ltxbench.ops import _build; print('$n', round(_build.load()['seconds'], 1), 's')" &
done
wait
for round in 1 2; do
  order=$trees; [ $round = 2 ] && order=$(echo $trees | tr ' ' '\n' | tac | tr '\n' ' ')
  for t in $order; do
    n=${t%%=*}; d=$(cd "${t#*=}" && pwd)
    LTXBENCH_CUDA_SRC=$d LTXBENCH_CACHE=/tmp/ltxb-src-$n python3 -m ltxbench bench micro $kernels --providers cuda "$@" \
      -o "$out/$n-$round.json" > "$out/$n-$round.log" 2>&1 || { echo "$n round $round failed"; tail -3 "$out/$n-$round.log"; }
  done
done
python3 - "$out" $names <<'PY'
import json, sys
from pathlib import Path
out, names = Path(sys.argv[1]), sys.argv[2:]
runs = {}
for n in names:
    for f in sorted(out.glob(f"{n}-[12].json")):
        for r in json.load(open(f))["records"]:
            if r["provider"] == "cuda" and r.get("stats"):
                key = (r["name"], r["params"].get("shape_name"), r["dtype"])
                runs.setdefault(key, {}).setdefault(n, []).append(r["stats"]["median"] * 1e3)
print(f"{'kernel':18s} {'shape':18s} {'dtype':5s} " + " ".join(f"{n:>9s}" for n in names) + "   (us, faster of 2 rounds; ratio to the first)")
for key, by in runs.items():
    best = {n: min(by[n]) for n in names if n in by}
    print(f"{key[0]:18s} {str(key[1]):18s} {key[2]:5s} " + " ".join(f"{best.get(n, float('nan')):9.2f}" for n in names) + "   "
          + " ".join(f"{best[n] / best[names[0]]:.3f}" for n in names[1:] if n in best))
PY
