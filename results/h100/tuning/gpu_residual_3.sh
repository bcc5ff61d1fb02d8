#!/bin/bash
# Dev driver (twenty-first session), call 3 (warm machine of calls 1-2): the 161-frame A/B with attn2's residual kept
# out of the GEMM, every op's GPU test, and a profile of the 161-frame step (compile vs optimized+compile).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 python3 results/h100/tuning/residual_off.py bench e2e --model ltx-2b --weights random --num-frames 161 --steps 10 \
  --phase transformer --configs optimized+compile,optimized --output $OUT/e2e-ltx-2b-161f-residual-off.json > $OUT/e2e-ltx-2b-161f-residual-off.log 2>&1
grep -E "done|Error|error" $OUT/e2e-ltx-2b-161f-residual-off.log | tail -4; echo "161f off $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest -q -rf --tb=short tests/test_ops_gpu.py > $OUT/gpu-tests-ops.log 2>&1
tail -3 $OUT/gpu-tests-ops.log; echo "tests $(( $(date +%s) - t0 )) s"
left=$(( 590 - ($(date +%s) - t0) ))
timeout $left python3 -m ltxbench profile --model ltx-2b --weights random --num-frames 161 --steps 2 --phase transformer \
  --configs compile,optimized+compile --top 25 --trace-dir /tmp/traces --output $OUT/profile-ltx-2b-161f.json > $OUT/profile-ltx-2b-161f.log 2>&1
tail -5 $OUT/profile-ltx-2b-161f.log
echo "all done $(( $(date +%s) - t0 )) s"
