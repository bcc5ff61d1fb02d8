#!/bin/bash
# Dev driver of the twenty-fourth session, after moving the ops' input factories to ltxbench/ops/inputs.py: the op
# GPU tests and the micro smoke tests, then `bench micro` of every kernel at the seed and LTX shapes against all
# providers (the #5 table's shapes) while time is left.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 300 python3 -m pytest -q -rf --tb=short -m gpu tests/test_ops_gpu.py tests/test_bench_micro.py -p no:cacheprovider > $OUT/gpu-tests-ops.log 2>&1
tail -1 $OUT/gpu-tests-ops.log; echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 585 - ($(date +%s) - t0) )) python3 -m ltxbench bench micro rms_norm fused_add_rms_norm --shapes all --dtype bf16 --providers all \
  --output $OUT/micro-norms.json > $OUT/micro-norms.log 2>&1
tail -3 $OUT/micro-norms.log; echo "all done $(( $(date +%s) - t0 )) s"
