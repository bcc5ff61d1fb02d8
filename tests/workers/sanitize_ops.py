"""Every op on every test shape and variant, once, then on two small shapes in every non-contiguous layout
(inputs.LAYOUTS) and on empty shapes: the workload `test_sanitizer.py` runs under compute-sanitizer. Prints the
number of op calls last, so the test can tell a run that did nothing.

    python tests/workers/sanitize_ops.py [--dtypes bf16,fp16,fp32] [--min-width 0] [--no-layouts] [--skip op,...]
"""

import argparse

import torch

from ltxbench.ops.inputs import LAYOUTS, relayout
from ltxbench.ops.registry import DTYPES, SPECS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--min-width", type=int, default=0, help="only shapes at least this wide (last dim)")
    parser.add_argument("--no-layouts", action="store_true", help="skip the layout and empty-shape calls")
    parser.add_argument("--skip", default="", help="ops not to run (comma-separated names)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    unknown = skip - set(SPECS)
    if unknown:
        parser.error(f"--skip: unknown op {sorted(unknown)[0]!r}")
    calls = 0
    for name in sorted(set(SPECS) - skip):
        spec = SPECS[name]
        for dtype in args.dtypes.split(","):
            for shape in spec.test_shapes:
                if shape[-1] < args.min_width:
                    continue
                for i, variant in enumerate(spec.variants):
                    if not spec.takes(variant, shape, DTYPES[dtype]):
                        continue
                    gen = torch.Generator().manual_seed(i)
                    spec.fn(**spec.make_inputs(shape, DTYPES[dtype], "cuda", gen, variant))
                    calls += 1
            if args.no_layouts:
                continue
            for i, variant in enumerate(spec.variants):
                for shape in ((2, 7, 256), (3, 5, 86)):
                    for how in LAYOUTS:
                        inputs = spec.make_inputs(shape, DTYPES[dtype], "cuda", torch.Generator().manual_seed(i),
                                                  variant)
                        spec.fn(**relayout(inputs, how, keep=spec.writes))
                        calls += 1
                for shape in ((0, 4, 64), (2, 0, 64), (2, 3, 0)):
                    spec.fn(**spec.make_inputs(shape, DTYPES[dtype], "cuda", torch.Generator().manual_seed(i),
                                               variant))
                    calls += 1
    torch.cuda.synchronize()
    print(f"op calls: {calls}")


if __name__ == "__main__":
    main()
