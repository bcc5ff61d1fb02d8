#!/bin/bash
# Dev driver of the twenty-fourth session, second part: the CFG-halves answer read one step late (no host
# synchronization before the step). GPU tests of it, then LTX-2B all four configurations at 49 and 161 frames,
# then the 49-frame A/B against --no-pair-cfg-halves while time is left.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
e2e() {  # frames, configs, output stem, extra flags
  left=$(( 590 - ($(date +%s) - t0) ))
  timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames $1 --steps 10 \
    --phase transformer --configs $2 --output $OUT/$3.json $4 > $OUT/$3.log 2>&1
  grep -E "done|Error|error" $OUT/$3.log | tail -5; echo "$3 $(( $(date +%s) - t0 )) s"
}
timeout 200 python3 -m pytest -q -rf --tb=short -m gpu tests/test_inject_ltx_cfg.py \
  "tests/test_inject_ltx.py::test_full_2b_random_pipeline_latents_after_10_steps_and_decoded_frames_match_unpatched" \
  -s > $OUT/gpu-tests.log 2>&1
grep -E "cosine|passed|failed" $OUT/gpu-tests.log | tail -3
e2e 49 baseline,optimized,compile,optimized+compile e2e-ltx-2b-49f
e2e 161 baseline,optimized,compile,optimized+compile e2e-ltx-2b-161f
e2e 49 optimized,optimized+compile e2e-ltx-2b-49f-unpaired --no-pair-cfg-halves
echo "all done $(( $(date +%s) - t0 )) s"
