#!/bin/bash
# Dev driver (twenty-first session), call 2 (same warm machine as call 1, GEMM choices in /tmp/ltxcache): the 49-frame
# A/B with attn2's residual kept out of the GEMM (residual_off.py), then LTX-2B 161 frames, all four configurations.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 170 python3 results/h100/tuning/residual_off.py bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 \
  --phase transformer --configs optimized+compile,optimized --output $OUT/e2e-ltx-2b-49f-residual-off.json > $OUT/e2e-ltx-2b-49f-residual-off.log 2>&1
grep -E "done|Error|error" $OUT/e2e-ltx-2b-49f-residual-off.log | tail -4; echo "49f off $(( $(date +%s) - t0 )) s"
left=$(( 590 - ($(date +%s) - t0) ))
timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 161 --steps 10 --phase transformer \
  --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-161f.json > $OUT/e2e-ltx-2b-161f.log 2>&1
grep -E "done|Error|error" $OUT/e2e-ltx-2b-161f.log | tail -6
echo "all done $(( $(date +%s) - t0 )) s"
