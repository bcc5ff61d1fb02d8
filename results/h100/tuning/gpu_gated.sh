#!/bin/bash
# Dev driver (twenty-first session), call 5 (fresh machine, ~8 min of device time left): gate_msa folded into attn1's
# out-projection (ltx_step.gated_outputs). LTX-2B 161f optimized+compile with the fold, then without it (gated_off.py),
# same machine; then the 2B numerics tests (two-layer incl. the folded path, full pipeline 10 steps).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 270 python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 161 --steps 10 --phase transformer \
  --configs optimized+compile --output $OUT/e2e-ltx-2b-161f-gated.json > $OUT/e2e-ltx-2b-161f-gated.log 2>&1
grep -E "done|Error|error" $OUT/e2e-ltx-2b-161f-gated.log | tail -3; echo "on $(( $(date +%s) - t0 )) s"
timeout 120 python3 results/h100/tuning/gated_off.py bench e2e --model ltx-2b --weights random --num-frames 161 --steps 10 \
  --phase transformer --configs optimized+compile --output $OUT/e2e-ltx-2b-161f-gated-off.json > $OUT/e2e-ltx-2b-161f-gated-off.log 2>&1
grep -E "done|Error|error" $OUT/e2e-ltx-2b-161f-gated-off.log | tail -3; echo "off $(( $(date +%s) - t0 )) s"
left=$(( 480 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest -q -s -rf --tb=short -m gpu tests/test_inject_ltx.py -k "full_2b or (two_layer and one)" > $OUT/gpu-tests-inject-ltx.log 2>&1
grep -E "passed|failed|FAILED|cosine" $OUT/gpu-tests-inject-ltx.log | tail -5
echo "all done $(( $(date +%s) - t0 )) s"
