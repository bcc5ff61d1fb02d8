#!/bin/bash
# Dev driver of the twenty-fifth session: after the e2e honesty changes (untimed first iteration, a new generation
# per iteration, dynamic=False compiles, inductor cache hits recorded). (1) the new fp32 cuda-provider parity test
# and the e2e / profile GPU tests; (2) llama-tiny, all four configs, two prompt lengths (static-shape compiles per
# length); (3) LTX-2B 49 frames, all four configurations.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 python3 -m pytest -q -rf --tb=short -m gpu tests/test_inject_ltx.py -k "fp32_is or two_layer" \
  -p no:cacheprovider > $OUT/gpu-tests-e2e.log 2>&1
timeout 200 python3 -m pytest -q -rf --tb=short tests/test_bench_e2e.py tests/test_profile.py tests/test_gpu_monitor.py \
  -p no:cacheprovider >> $OUT/gpu-tests-e2e.log 2>&1
grep -E "passed|failed" $OUT/gpu-tests-e2e.log; grep -E "^FAILED|Error" $OUT/gpu-tests-e2e.log | head -8; echo "tests $(( $(date +%s) - t0 )) s"
timeout 150 python3 -m ltxbench bench e2e --model llama-tiny --weights random --prompt-lengths 64,256 --new-tokens 16 \
  --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-llama-tiny.json > $OUT/e2e-llama-tiny.log 2>&1
grep -E "done|Error|error" $OUT/e2e-llama-tiny.log | tail -6; echo "llm $(( $(date +%s) - t0 )) s"
left=$(( 590 - ($(date +%s) - t0) ))
timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 \
  --phase transformer --configs baseline,optimized,compile,optimized+compile --output $OUT/e2e-ltx-2b-49f.json \
  > $OUT/e2e-ltx-2b-49f.log 2>&1
grep -E "done|Error|error" $OUT/e2e-ltx-2b-49f.log | tail -6; echo "all done $(( $(date +%s) - t0 )) s"
