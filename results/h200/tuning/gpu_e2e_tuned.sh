#!/bin/bash
# Dev driver for the next H200 call (written in the twentieth session, not yet run): #10's H200 targets as the issue
# asks them, all four configurations in one run, at 49 and 161 frames, with the tuned GEMMs. ~6-7 minutes.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
# (twenty-first session) bench e2e now samples SM clock and power through NVML: its GPU smoke test first.
timeout 60 python3 -m pytest -q -rf --tb=short -m gpu tests/test_gpu_monitor.py > $OUT/gpu-tests-monitor.log 2>&1
tail -2 $OUT/gpu-tests-monitor.log
for f in 49 161; do
  left=$(( 590 - ($(date +%s) - t0) ))
  timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames $f --steps 10 --phase transformer \
    --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-${f}f.json > $OUT/e2e-ltx-2b-${f}f.log 2>&1
  grep -E "done|Error|error" $OUT/e2e-ltx-2b-${f}f.log | tail -5
done
echo "all done $(( $(date +%s) - t0 )) s"
