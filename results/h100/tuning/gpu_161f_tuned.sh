#!/bin/bash
# Dev driver (twentieth session), call 3: LTX-2B 161 frames all four configurations with tuned GEMMs (call 2's
# pre-pass failed at 1 step), then the linear GPU tests in their full sequence (call 1 segfaulted in gemm_export
# after them; the record test alone passed in call 2). Logs/JSON under $OUT.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
rm -rf /tmp/ltxcache/gemm-choices  # a fresh search, as on a new machine
timeout 400 python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 161 --steps 10 --phase transformer \
  --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-161f.json > $OUT/e2e-ltx-2b-161f.log 2>&1
grep -E "done|Error|error|GEMM" $OUT/e2e-ltx-2b-161f.log | tail -8; ls /tmp/ltxcache/gemm-choices/ 2>&1
echo "e2e done $(( $(date +%s) - t0 )) s"
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left python3 -X faulthandler -m pytest -q -s -rf --tb=short --durations=12 tests/test_ops_gpu.py -k "linear or bad_arguments or choices" > $OUT/gpu-tests-linear.log 2>&1
grep -E "passed|failed|FAILED|Error|Segmentation" $OUT/gpu-tests-linear.log | tail -8
echo "all done $(( $(date +%s) - t0 )) s"
