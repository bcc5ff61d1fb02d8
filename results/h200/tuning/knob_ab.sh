#!/bin/bash
# Dev driver (fifteenth session): A/B of runtime tuning knobs on this tree's cuda/, through src_ab.sh. Each setting
# is VAR=VALUE (or "default"). Usage (GPU machine, repo root):
# bash results/h200/tuning/knob_ab.sh OUTDIR "KERNELS" "SETTING ..." [bench args]
set -u
out=$1; kernels=$2; settings=$3; shift 3
entries=""
for s in $settings; do
  [ "$s" = default ] && entries="$entries default=cuda" || entries="$entries ${s//=/_}=cuda:$s"
done
exec bash "$(dirname "$0")/src_ab.sh" "$out" "$kernels" "$entries" --dtype bf16 "$@"
