#!/bin/bash
# Dev driver (fifteenth session): A/B of the load behind load_raw_keep (keep = main's L2 evict_last; plain; first;
# nc; more: see load_policy_variants.py) on the kernels that use it, through results/h200/tuning/src_ab.sh.
# Usage (on the GPU machine, repo root): [VARIANTS="keep more"] [EXTRA="--variant coords"]
# bash results/h100/tuning/load_policy_ab.sh OUTDIR "KERNELS" [SHAPES]
set -u
out=$1; kernels=$2; shapes=${3:-all}; variants=${VARIANTS:-keep plain first nc}; extra=${EXTRA:-}
mkdir -p /tmp/lp
python3 results/h100/tuning/load_policy_variants.py /tmp/lp > /dev/null
entries=""
for v in $variants; do
  [ $v = keep ] && entries="$entries keep=cuda" || entries="$entries $v=/tmp/lp/src-$v"
done
exec bash results/h200/tuning/src_ab.sh "$out" "$kernels" "$entries" --shapes $shapes --dtype bf16 $extra
