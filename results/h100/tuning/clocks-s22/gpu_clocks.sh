#!/bin/bash
# Dev driver (twenty-second session). On an H200: #10's four-configuration runs (results/h200/tuning/gpu_e2e_tuned.sh).
# On an H100: the 161-frame profile (compile vs optimized+compile) with the GPU monitor, to see whether the profiled
# run's clocks are higher than the timed run's (1635-1665 MHz, power-capped 100%: e2e-ltx-2b-161f-6392580).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
if [[ "$gpu" == *H200* ]]; then exec bash results/h200/tuning/gpu_e2e_tuned.sh; fi
timeout 60 python3 -m pytest -q -rf --tb=short -m gpu tests/test_gpu_monitor.py tests/test_profile.py > $OUT/gpu-tests-monitor.log 2>&1
tail -1 $OUT/gpu-tests-monitor.log
for f in 161 49; do
  left=$(( 590 - ($(date +%s) - t0) ))
  timeout $left python3 -m ltxbench profile --model ltx-2b --weights random --num-frames $f --steps 2 --phase transformer \
    --configs compile,optimized+compile --top 25 --trace-dir /tmp/traces --output $OUT/profile-ltx-2b-${f}f.json > $OUT/profile-ltx-2b-${f}f.log 2>&1
  grep -E "profiled|Error|error" $OUT/profile-ltx-2b-${f}f.log | tail -4; echo "${f}f $(( $(date +%s) - t0 )) s"
done
echo "all done $(( $(date +%s) - t0 )) s"
