#!/bin/bash
# Dev driver (twentieth session), call 1 of 2: build, the linear op's GPU tests (incl. the export/import records),
# bench micro linear at the LTX projection shapes. Logs/JSON under $OUT.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import ltxbench.ops._build as b; print(b.load())" 2>&1 | tail -1
echo "built $(( $(date +%s) - t0 )) s"
timeout 270 python3 -m pytest -q -s -rf --tb=short --durations=25 tests/test_ops_gpu.py -k "linear or bad_arguments or choices" > $OUT/gpu-tests-linear.log 2>&1
grep -E "passed|failed|FAILED|Error" $OUT/gpu-tests-linear.log | tail -8
echo "tests done $(( $(date +%s) - t0 )) s"
for v in bias gelu-tanh; do
  timeout 100 python3 -m ltxbench bench micro linear --shapes ltx --dtype bf16 --providers cuda,eager,compile --variant $v \
    --output $OUT/micro-linear-$v.json > $OUT/micro-linear-$v.log 2>&1; tail -14 $OUT/micro-linear-$v.log
done
echo "all done $(( $(date +%s) - t0 )) s"
