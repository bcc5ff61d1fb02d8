#!/bin/bash
# Dev driver of the twenty-fifth session (H200), second part: the search with stage 1b (48 re-ranked over 3
# interleaved rounds, 12 finalists, 2-ms stage-2 samples). (1) linear GPU tests; (2) the new search on the 14 shipped
# LTX-2B problems (shipped file moved aside) -> $OUT/gnew; (3) sustained A/B at the cap of every problem: the shipped
# choices (old search) vs the new ones vs the heuristic's choice (torch's), two alternations.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LTXBENCH_CACHE=/tmp/ltxcache
t0=$(date +%s)
S=results/h200/tuning/s25
nvidia-smi --query-gpu=name,temperature.gpu,clocks.max.sm,power.limit --format=csv,noheader
[ -z "$SKIP_TESTS" ] && timeout 240 python3 -m pytest -q -rf --tb=short -m gpu tests/test_ops_gpu.py -k "linear or choice or search or gemm" \
  -p no:cacheprovider > $OUT/gpu-tests-linear.log 2>&1
tail -1 $OUT/gpu-tests-linear.log; echo "tests $(( $(date +%s) - t0 )) s"
cp ltxbench/ops/gemm_choices/NVIDIA-H200.json /tmp/problems.json
mv ltxbench/ops/gemm_choices/NVIDIA-H200.json /tmp/shipped-h200.json
LTXBENCH_GEMM_CACHE=$OUT/gnew timeout 240 python3 $S/gemm_ab.py search /tmp/problems.json > $OUT/search.log 2>&1
tail -15 $OUT/search.log | cut -c1-220; echo "search $(( $(date +%s) - t0 )) s"
mv /tmp/shipped-h200.json ltxbench/ops/gemm_choices/NVIDIA-H200.json
for r in 1 2; do
  LTXBENCH_GEMM_CACHE=/tmp/empty-$r python3 $S/gemm_ab.py time /tmp/problems.json old >> $OUT/ab.jsonl 2>>$OUT/ab.err
  LTXBENCH_GEMM_CACHE=$OUT/gnew python3 $S/gemm_ab.py time /tmp/problems.json new >> $OUT/ab.jsonl 2>>$OUT/ab.err
  LTXBENCH_GEMM_CACHE=off python3 $S/gemm_ab.py time /tmp/problems.json heuristic >> $OUT/ab.jsonl 2>>$OUT/ab.err
  echo "round $r $(( $(date +%s) - t0 )) s"
done
tail -3 $OUT/ab.err
python3 - <<'PY'
import json, collections, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ab.jsonl")]
t = collections.defaultdict(list)
for r in rows: t[(r["tokens"], r["n"], r["k"], r["epilogue"], r["label"])] += r["us"]
keys = sorted({k[:4] for k in t})
print("problem                         old      new      heur   new/old")
for k in keys:
    m = {l: sorted(t[k + (l,)])[len(t[k + (l,)]) // 2] for l in ("old", "new", "heuristic")}
    print(f"{str(k):32s} {m['old']:8.1f} {m['new']:8.1f} {m['heuristic']:8.1f}  {m['new']/m['old']:.3f}")
PY
echo "all done $(( $(date +%s) - t0 )) s"
