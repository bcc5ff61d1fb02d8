#!/bin/bash
# Dev driver (fifteenth session): the LTX-2B optimized+compile step (49 frames, 512x768, CFG, 10 steps) with main's
# cuda/ (L2 evict_last loads, whose lines persist in L2 and may crowd out the GEMMs' and attention's) against
# load_policy_variants.py's nc copy (no evict_last anywhere), alternating: keep nc [nc keep].
# Usage (GPU machine, repo root): bash results/h100/tuning/ltx_nc_ab.sh OUTDIR "ORDER"
set -u
out=$1; order=${2:-keep nc}
mkdir -p "$out" /tmp/lp
python3 results/h100/tuning/load_policy_variants.py /tmp/lp > /dev/null
i=0
for v in $order; do
  i=$((i + 1)); src=$([ $v = keep ] && echo "$PWD/cuda" || echo "/tmp/lp/src-$v")
  LTXBENCH_CUDA_SRC=$src LTXBENCH_CACHE=/tmp/ltxb-$v python3 -m ltxbench bench e2e --model ltx-2b --weights random \
    --phase transformer --configs optimized+compile --num-frames 49 --steps 10 --repeats 3 \
    -o "$out/ltx-$v-$i.json" > "$out/ltx-$v-$i.log" 2>&1 || tail -5 "$out/ltx-$v-$i.log"
  grep "done" "$out/ltx-$v-$i.log" | sed "s/^/$v run $i: /"
done
