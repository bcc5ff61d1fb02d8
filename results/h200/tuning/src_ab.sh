#!/bin/bash
# Dev driver (fifteenth session): A/B of cuda/ source trees and runtime knobs, `bench micro --providers cuda`, each
# distinct tree built once into its own cache (in parallel), two rounds in alternating order; the summary
# (ab_summary.py) gives the faster of the two round medians per (kernel, shape, dtype) and the ratio to the first.
# An entry is NAME=DIR, or NAME=DIR:VAR=VALUE to run that tree with an environment knob set.
# Usage (GPU machine, repo root): bash results/h200/tuning/src_ab.sh OUTDIR "KERNELS" "ENTRY ..." [bench args]
set -u
here=$(dirname "$0")
out=$1; kernels=$2; entries=$3; shift 3
mkdir -p "$out"
names=""; dirs=""
for e in $entries; do
  spec=${e#*=}; names="$names ${e%%=*}"; dirs="$dirs $(cd "${spec%%:*}" && pwd)"
done
cache() { echo "/tmp/ltxb-src-$(echo "$1" | md5sum | cut -c1-8)"; }
for d in $(echo $dirs | tr ' ' '\n' | sort -u); do
  LTXBENCH_CUDA_SRC=$d LTXBENCH_CACHE=$(cache "$d") MAX_JOBS=6 \
    python3 -c "from ltxbench.ops import _build; print('$d', round(_build.load()['seconds'], 1), 's')" &
done
wait
for round in 1 2; do
  order=$entries; [ $round = 2 ] && order=$(echo $entries | tr ' ' '\n' | tac | tr '\n' ' ')
  for e in $order; do
    n=${e%%=*}; spec=${e#*=}; d=$(cd "${spec%%:*}" && pwd); knob=$([ "$spec" = "${spec#*:}" ] || echo "${spec#*:}")
    env $knob LTXBENCH_CUDA_SRC=$d LTXBENCH_CACHE=$(cache "$d") python3 -m ltxbench bench micro $kernels \
      --providers cuda "$@" -o "$out/$n-$round.json" > "$out/$n-$round.log" 2>&1 \
      || { echo "$n round $round failed"; tail -3 "$out/$n-$round.log"; }
  done
done
python3 "$here/ab_summary.py" "$out" $names
