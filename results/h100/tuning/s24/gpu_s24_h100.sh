#!/bin/bash
# Dev driver of the twenty-fourth session on an H100: LTX-2B all four configurations at 161 and 49 frames with the
# CFG-halves answer read one step late (f0224c8), and the GEMM choices this machine searches, to ship.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
e2e() {  # frames, configs, output stem, extra flags
  left=$(( 590 - ($(date +%s) - t0) ))
  timeout $left python3 -m ltxbench bench e2e --model ltx-2b --weights random --num-frames $1 --steps 10 \
    --phase transformer --configs $2 --output $OUT/$3.json $4 > $OUT/$3.log 2>&1
  grep -E "done|Error|error" $OUT/$3.log | tail -5; echo "$3 $(( $(date +%s) - t0 )) s"
}
e2e 161 baseline,optimized,compile,optimized+compile e2e-ltx-2b-161f
e2e 49 baseline,optimized,compile,optimized+compile e2e-ltx-2b-49f
cp /tmp/ltxcache/gemm-choices/*.json $OUT/ 2>/dev/null; ls /tmp/ltxcache/gemm-choices/
echo "all done $(( $(date +%s) - t0 )) s"
