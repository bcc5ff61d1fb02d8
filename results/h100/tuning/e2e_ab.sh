#!/bin/bash
# Dev driver (eighteenth session): A/B of whole package trees end to end, `bench e2e` of LTX-2B at 49 frames, the
# trees alternated ROUNDS times (A B A B ...) on one machine, since compile's step varies 45.6-46.8 ms between H100
# machines. A tree is a directory holding ltxbench/ configs/ cuda/, e.g. made on the CPU machine with
#   mkdir abbase && git archive <rev> ltxbench configs cuda | tar -x -C abbase     (abbase/ in .git/info/exclude)
# and carried to the device (run's carry). Prints each run's "done" lines; JSON + log per run under OUTDIR (the
# device returns at most 8 files: keep ROUNDS x trees x 2 within that, or read the printed medians).
# Usage (GPU machine, repo root): bash results/h100/tuning/e2e_ab.sh OUTDIR ROUNDS "NAME=DIR ..." [bench e2e args]
# e.g. bash results/h100/tuning/e2e_ab.sh $OUT 2 "base=abbase new=." --configs optimized+compile,compile
set -u
out=$1; rounds=$2; entries=$3; shift 3
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for e in $entries; do
    name=${e%%=*}; dir=$(cd "${e#*=}" && pwd)
    (cd "$dir" && PYTHONPATH="/tmp/site:$dir" python3 -m ltxbench bench e2e --model ltx-2b --weights random \
      --num-frames 49 --steps 10 --phase transformer "$@" --output "$out/$name-$round.json" > "$out/$name-$round.log" 2>&1) \
      || { echo "$name round $round failed"; tail -3 "$out/$name-$round.log"; }
    echo "$name $round: $(grep done "$out/$name-$round.log" | tr '\n' ' ')"
  done
done
