#!/bin/bash
# Dev driver (twentieth session), call 5: the resized fp16 search test, then LTX-2B 49 frames, all four configurations,
# with the GEMM search in the untimed pre-pass.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
timeout 100 python3 -m pytest -q -s -rf --tb=short tests/test_ops_gpu.py -k "search or GFLOP" > $OUT/gpu-tests-search.log 2>&1
grep -E "passed|failed|FAILED|heuristic" $OUT/gpu-tests-search.log | tail -8
rm -rf /tmp/ltxcache/gemm-choices
timeout 360 python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 --phase transformer \
  --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-49f.json > $OUT/e2e-ltx-2b-49f.log 2>&1
grep -E "done|Error|error|GEMM" $OUT/e2e-ltx-2b-49f.log | tail -8
echo "all done $(( $(date +%s) - t0 )) s"
