#!/bin/bash
# Dev driver of the twenty-fifth session (H200): the GEMM search with stage 1 as ratios to the heuristic's choice
# timed in the same batch, 12 finalists and a 0.5% threshold. (1) the linear GPU tests; (2) LTX-2B 161 frames,
# optimized+compile with the shipped (old-search) choices; (3) all four configurations with the choices searched
# afresh by the new search (shipped file moved aside, the new choices written to $OUT/gc).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
e2e() {  # frames, configs, output stem, extra flags
  left=$(( 590 - ($(date +%s) - t0) ))
  timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames $1 --steps 10 \
    --phase transformer --configs $2 --output $OUT/$3.json $4 > $OUT/$3.log 2>&1
  grep -E "done|Error|error" $OUT/$3.log | tail -5; echo "$3 $(( $(date +%s) - t0 )) s"
}
timeout 240 python3 -m pytest -q -rf --tb=short -m gpu tests/test_ops_gpu.py -k "linear or choice or search or gemm" \
  -p no:cacheprovider > $OUT/gpu-tests-linear.log 2>&1
tail -1 $OUT/gpu-tests-linear.log; echo "tests $(( $(date +%s) - t0 )) s"
LTXBENCH_GEMM_CACHE=/tmp/gc-old e2e 161 optimized+compile e2e-ltx-2b-161f-old-choices
mv ltxbench/ops/gemm_choices/NVIDIA-H200.json /tmp/shipped-h200.json
LTXBENCH_GEMM_CACHE=$OUT/gc e2e 161 baseline,optimized,compile,optimized+compile e2e-ltx-2b-161f
mv /tmp/shipped-h200.json ltxbench/ops/gemm_choices/NVIDIA-H200.json
grep -o "tokens 16128[^\"]*" $OUT/gc/*.json | cut -c1-160
echo "all done $(( $(date +%s) - t0 )) s"
