#!/bin/bash
# Dev driver of the twenty-fifth session: after the injection audit (second apply_kernels refused; parity tests at
# 1e-6 on the reference path; new CFG / cross-kv / revert tests), the injection GPU tests (cuda provider, eager and
# compiled, the 2B pipeline numerics) and the LLM injection GPU tests.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 570 python3 -m pytest -q -rf --tb=short tests/test_inject_ltx.py tests/test_inject_ltx_cfg.py \
  tests/test_inject_ltx_cross_kv.py tests/test_inject_ltx_step.py tests/test_inject_llm.py tests/test_inject_fuse.py \
  -p no:cacheprovider -s > $OUT/gpu-tests-inject.log 2>&1
grep -E "cosine|PSNR" $OUT/gpu-tests-inject.log | tail -4; tail -1 $OUT/gpu-tests-inject.log
grep -E "^FAILED" $OUT/gpu-tests-inject.log | head; echo "all done $(( $(date +%s) - t0 )) s"
