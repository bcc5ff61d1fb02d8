#!/bin/bash
# Dev driver (twentieth session), call 4: every op's GPU tests after the gemm.cpp changes (records, FLOP gate).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
python3 -c "import ltxbench.ops._build as b; print(b.load())" 2>&1 | tail -1
timeout 420 python3 -X faulthandler -m pytest -q -s -rf --tb=short --durations=8 tests/test_ops_gpu.py > $OUT/gpu-tests-ops.log 2>&1
grep -E "passed|failed|FAILED|Error|Segmentation|not searched" $OUT/gpu-tests-ops.log | tail -8; grep -A9 slowest $OUT/gpu-tests-ops.log
echo "all done $(( $(date +%s) - t0 )) s"
