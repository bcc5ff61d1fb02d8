#!/bin/bash
# Dev driver (twentieth session), call 2: build, the GEMM-record test alone (under gdb when there is one: call 1
# segfaulted in gemm_export), LTX-2B 161 frames all four configurations with tuned GEMMs, the LTX injection GPU tests.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
python3 -c "import ltxbench.ops._build as b; print(b.load())" 2>&1 | tail -1
T="python3 -X faulthandler -m pytest -q -s -rf --tb=short tests/test_ops_gpu.py -k choices"
if command -v gdb >/dev/null; then timeout 150 gdb -q -batch -ex run -ex bt --args $T > $OUT/gpu-tests-choices.log 2>&1
else timeout 150 $T > $OUT/gpu-tests-choices.log 2>&1; fi
grep -E "passed|failed|FAILED|Error|SIGSEGV|^#[0-9]" $OUT/gpu-tests-choices.log | head -30
echo "tests done $(( $(date +%s) - t0 )) s"
timeout 440 python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 161 --steps 10 --phase transformer \
  --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-161f.json > $OUT/e2e-ltx-2b-161f.log 2>&1
grep -E "done|Error|error|GEMM" $OUT/e2e-ltx-2b-161f.log | tail -8; ls /tmp/ltxcache/gemm-choices/ 2>&1
echo "e2e done $(( $(date +%s) - t0 )) s"
left=$(( 590 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && timeout $left python3 -m pytest -q -s -rf --tb=line tests/test_inject_ltx.py -m gpu > $OUT/gpu-tests-inject-ltx.log 2>&1
grep -E "cosine|PSNR|passed|failed|FAILED" $OUT/gpu-tests-inject-ltx.log | tail -6
echo "all done $(( $(date +%s) - t0 )) s"
