#!/bin/bash
# Dev driver of the twenty-fifth session: the audit's test changes (every op names its own arguments; strided and
# empty inputs over every variant and dtype; eps; cross_attention head dims 33/80/200 and a scale; linear's odd
# width with bias; NaN poison per output) and the bindings' argument names. (1) op + micro GPU tests; (2) a micro
# run of the kernels whose inputs changed; (3) the sanitizer (memcheck) with the layout / empty / fp16 workload.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 330 python3 -m pytest -q -rf --tb=short -m gpu tests/test_ops_gpu.py tests/test_bench_micro.py -p no:cacheprovider \
  > $OUT/gpu-tests-ops.log 2>&1
tail -1 $OUT/gpu-tests-ops.log; grep -E "^FAILED" $OUT/gpu-tests-ops.log | head -20; echo "tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 -m ltxbench bench micro rms_norm cross_attention linear --shapes ltx --dtype bf16 \
  --providers cuda,eager --output $OUT/micro-smoke.json > $OUT/micro-smoke.log 2>&1
tail -4 $OUT/micro-smoke.log; echo "micro $(( $(date +%s) - t0 )) s"
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest -q -rf --tb=short -m gpu tests/test_sanitizer.py -k memcheck -p no:cacheprovider \
  > $OUT/gpu-tests-sanitizer.log 2>&1
tail -3 $OUT/gpu-tests-sanitizer.log; echo "all done $(( $(date +%s) - t0 )) s"
