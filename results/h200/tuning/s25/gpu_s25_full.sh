#!/bin/bash
# Dev driver of the twenty-fifth session, last: the whole GPU suite at the session's final code (every test file
# changed this session), racecheck left out (memcheck ran earlier in the session and runs here too).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
timeout 575 python3 -m pytest -q -rf --tb=short -m gpu tests -k "not racecheck" -p no:cacheprovider -s \
  > $OUT/gpu-tests-full.log 2>&1
grep -E "cosine|PSNR" $OUT/gpu-tests-full.log | tail -3; tail -1 $OUT/gpu-tests-full.log
grep -E "^FAILED" $OUT/gpu-tests-full.log | head; echo "all done $(( $(date +%s) - t0 )) s"
