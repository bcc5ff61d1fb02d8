#!/bin/bash
# Dev driver (twenty-first session), call 1: attn2's residual in its out-projection GEMM (ops.linear residual=):
# build, the linear and LTX-injection GPU tests, LTX-2B 49 frames all four configurations.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 300 python3 -m pytest -q -rf --tb=short tests/test_ops_gpu.py -k "linear or bad_arguments or choices or GFLOP" > $OUT/gpu-tests-linear.log 2>&1
tail -3 $OUT/gpu-tests-linear.log; echo "tests linear $(( $(date +%s) - t0 )) s"
timeout 150 python3 -m pytest -q -rf --tb=short -m gpu tests/test_inject_ltx.py tests/test_inject_ltx_cross_kv.py > $OUT/gpu-tests-inject-ltx.log 2>&1
tail -3 $OUT/gpu-tests-inject-ltx.log; echo "tests inject $(( $(date +%s) - t0 )) s"
left=$(( 570 - ($(date +%s) - t0) ))
timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 --phase transformer \
  --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-49f.json > $OUT/e2e-ltx-2b-49f.log 2>&1
grep -E "done|Error|error|residual" $OUT/e2e-ltx-2b-49f.log | tail -6; echo "e2e $(( $(date +%s) - t0 )) s"
echo "all done $(( $(date +%s) - t0 )) s"
