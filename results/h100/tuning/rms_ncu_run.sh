set -u
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu | head -1)
python3 results/h100/tuning/load_policy_variants.py /tmp/lp > /dev/null
LTXBENCH_CACHE=/tmp/ltxb-keep python3 -c "from ltxbench.ops import _build; _build.load()" &
LTXBENCH_CUDA_SRC=/tmp/lp/src-plain LTXBENCH_CACHE=/tmp/ltxb-plain python3 -c "from ltxbench.ops import _build; _build.load()" &
wait
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,sm__warps_active.avg.pct_of_peak_sustained_active
LTXBENCH_CACHE=/tmp/ltxb-keep $NCU --cache-control none --replay-mode application -k regex:"row_op_lean|rms_rows|copy_rows" --metrics $M --csv python3 results/h100/tuning/rms_ncu.py > $OUT/ncu-main.csv 2>/tmp/e1; tail -2 /tmp/e1
LTXBENCH_CUDA_SRC=/tmp/lp/src-plain LTXBENCH_CACHE=/tmp/ltxb-plain $NCU --cache-control none --replay-mode application -k regex:"row_op_lean" --metrics $M --csv python3 results/h100/tuning/rms_ncu.py ours > $OUT/ncu-ours-plain.csv 2>/tmp/e2; tail -2 /tmp/e2
python3 - <<'PY'
import csv, os
for f in ("ncu-main.csv", "ncu-ours-plain.csv"):
    rows = list(csv.reader(open(os.path.join(os.environ["OUT"], f))))
    hdr = None; by = {}
    for r in rows:
        if r and r[0] == "ID": hdr = r; continue
        if hdr and len(r) == len(hdr):
            d = dict(zip(hdr, r)); by.setdefault((int(d["ID"]), d["Kernel Name"][:30]), {})[d["Metric Name"].split(".")[0].split("__")[-1]] = d["Metric Value"]
    print(f)
    for k, v in sorted(by.items()): print(" ", k, v)
PY
