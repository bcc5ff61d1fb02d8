#!/bin/bash
# Dev driver written in the twenty-third session (no device time was left to run it then). Two calls on one warm
# machine (H100 or H200; the output names say which GPU ran them through `nvidia-smi` in the log):
#   bash results/h100/tuning/s23/gpu_s23.sh a   GPU tests of the session's changes (energy counter, CFG halves,
#                                               the 2B pipeline numerics, GEMM choices), then all four configs at 49f
#   bash results/h100/tuning/s23/gpu_s23.sh b   all four configurations at 161 frames, then the CFG-halves A/B
#                                               there (--no-pair-cfg-halves, same machine, GEMM choices reused)
# (run in the twenty-fourth session: the order of a/b was swapped so that each call fits its 10 minutes)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
e2e() {  # frames, configs, output stem, extra flags
  left=$(( 590 - ($(date +%s) - t0) ))
  timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames $1 --steps 10 \
    --phase transformer --configs $2 --output $OUT/$3.json $4 > $OUT/$3.log 2>&1
  grep -E "done|Error|error" $OUT/$3.log | tail -5; echo "$3 $(( $(date +%s) - t0 )) s"
}
if [ "$1" = a ]; then
  timeout 300 python3 -m pytest -q -rf --tb=short -m gpu tests/test_gpu_monitor.py tests/test_inject_ltx_cfg.py \
    "tests/test_inject_ltx.py::test_full_2b_random_pipeline_latents_after_10_steps_and_decoded_frames_match_unpatched" \
    "tests/test_ops_gpu.py::test_linear_choices_travel_between_processes_as_checked_records" \
    -s > $OUT/gpu-tests-s23.log 2>&1
  grep -E "cosine|passed|failed" $OUT/gpu-tests-s23.log | tail -3
  e2e 49 baseline,optimized,compile,optimized+compile e2e-ltx-2b-49f
else
  e2e 161 baseline,optimized,compile,optimized+compile e2e-ltx-2b-161f
  e2e 161 optimized,optimized+compile e2e-ltx-2b-161f-unpaired --no-pair-cfg-halves
fi
# The GEMM choices this machine searched, to ship in ltxbench/ops/gemm_choices/ (a fresh machine then skips the search)
cp /tmp/ltxcache/gemm-choices/*.json $OUT/ 2>/dev/null; ls /tmp/ltxcache/gemm-choices/
echo "all done $(( $(date +%s) - t0 )) s"
