#!/bin/bash
# Dev driver (twenty-second session): attn2's norm_q folded into cross_attention (q_scale). GPU tests of the op and
# the LTX injection, then the 161- and 49-frame steps with the fold on and off (fold_off.py), separate processes.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -rf --tb=short tests/test_ops_gpu.py -k "cross_attention" > $OUT/gpu-tests-xattn.log 2>&1
tail -2 $OUT/gpu-tests-xattn.log; echo "op tests $(( $(date +%s) - t0 )) s"
timeout 150 python3 -m pytest -q -rf --tb=short -m gpu tests/test_inject_ltx.py tests/test_inject_ltx_cross_kv.py -s > $OUT/gpu-tests-inject.log 2>&1
tail -2 $OUT/gpu-tests-inject.log; grep -iE "cosine|psnr" $OUT/gpu-tests-inject.log | head -4; echo "inject tests $(( $(date +%s) - t0 )) s"
E2E="bench e2e --model ltx-2b --weights random --steps 10 --phase transformer"
for run in 161:on 161:off 49:on 49:off; do
  f=${run%%:*}; mode=${run##*:}; left=$(( 585 - ($(date +%s) - t0) ))
  [ $left -lt 60 ] && { echo "skip $run"; continue; }
  cmd="python3 -m ltxbench"; [ $mode = off ] && cmd="python3 results/h100/tuning/normq-fold/fold_off.py"
  cfgs=optimized+compile,optimized; [ $f = 49 ] && cfgs=optimized+compile
  timeout $left $cmd $E2E --num-frames $f --configs $cfgs --output $OUT/e2e-${f}f-fold-$mode.json > $OUT/e2e-${f}f-fold-$mode.log 2>&1
  echo "$run: $(grep -E 'done|Error' $OUT/e2e-${f}f-fold-$mode.log | tr '\n' ' ' | cut -c1-400) [$(( $(date +%s) - t0 )) s]"
done
