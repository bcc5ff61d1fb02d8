"""Dev probe (eighteenth session): every device event of a chrome trace from `ltxbench profile --trace-dir`, grouped
by kernel name, most frequent first (calls, total ms). Usage: python kernel_census.py TRACE.json [N]"""

import collections
import json
import sys


def main(path, top=45):
    events = json.load(open(path))["traceEvents"]
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            entry = totals[e["name"][:110]]
            entry[0] += 1
            entry[1] += e["dur"]
    for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{calls:5d} {us / 1000:8.3f} ms  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
