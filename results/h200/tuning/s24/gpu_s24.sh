#!/bin/bash
# Dev driver of the twenty-fourth session (H200): (1) on a fresh machine, the shipped GEMM choices
# (ltxbench/ops/gemm_choices/NVIDIA-H200.json) load with an empty user cache; (2) LTX-2B 49 frames, all four
# configurations, two rounds in alternating order (pooled samples), to see how far the first run's
# optimized+compile (39.49 ms) sits from the 39 ms target beyond run-to-run noise.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/fresh
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
ls /tmp/fresh/gemm-choices 2>&1 | head -2
python3 -c "import ltxbench.ops as o; print('shipped GEMM choices kept by the extension:', o.load_gemm_choices())" 2>&1 | tail -2
timeout $(( 590 - ($(date +%s) - t0) )) python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 \
  --steps 10 --phase transformer --configs baseline,optimized,compile,optimized+compile --rounds 2 \
  --output $OUT/e2e-ltx-2b-49f-rounds2.json > $OUT/e2e-ltx-2b-49f-rounds2.log 2>&1
grep -E "GEMM|cache|done|Error|error" $OUT/e2e-ltx-2b-49f-rounds2.log | tail -12
echo "all done $(( $(date +%s) - t0 )) s"
