#!/bin/bash
# Dev driver (nineteenth session): one GPU call that builds, runs the linear op's GPU tests, the four-config LTX-2B
# 49-frame e2e run with tuned GEMMs, and the LTX injection GPU tests (latents vs unpatched). Logs/JSON under $OUT.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
python3 -c "import ltxbench.ops._build as b; print(b.load())" 2>&1 | tail -1
timeout 130 python3 -m pytest -q -s -rf --tb=line tests/test_ops_gpu.py -k "linear or bad_arguments" > $OUT/gpu-tests-linear.log 2>&1
grep -E "heuristic|passed|failed|FAILED|Error" $OUT/gpu-tests-linear.log | tail -14
echo "tests done $(( $(date +%s) - t0 )) s"
timeout 300 python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 --phase transformer --configs baseline,optimized,compile,optimized+compile \
  --output $OUT/e2e-ltx-2b-49f.json > $OUT/e2e-ltx-2b-49f.log 2>&1; grep -E "done|Error|error" $OUT/e2e-ltx-2b-49f.log | tail -5
echo "e2e done $(( $(date +%s) - t0 )) s"
timeout 130 python3 -m pytest -q -s -rf --tb=line tests/test_inject_ltx.py -m gpu > $OUT/gpu-tests-inject-ltx.log 2>&1
grep -E "cosine|PSNR|passed|failed|FAILED" $OUT/gpu-tests-inject-ltx.log | tail -6
echo "all done $(( $(date +%s) - t0 )) s"
