"""Dev helper (fifteenth session): copies of cuda/ whose load_raw_keep (the L2 evict_last load of the row,
activation and RoPE kernels) uses another load, for `LTXBENCH_CUDA_SRC=<copy> bench micro ...` A/B runs:
plain (ld.global, no policy), first (L2 evict_first policy, as Triton's eviction_policy='evict_first'),
nc (ld.global.nc via __ldg: the loads before the hint); more: main plus the hint on the three loads that were left
without it (LayerNorm rows, the fused q/k norm + RoPE, the exact-GELU GEGLU).
Usage: python load_policy_variants.py DEST_DIR"""
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CREATE = 'asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));'
LOAD = 'asm("ld.global.L1::evict_last.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"'
EDITS = {
    "more": [],  # edits of other files: MORE below
    "plain": [(CREATE, "policy = 0;"), (LOAD, 'asm("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"')],
    "first": [(CREATE, CREATE.replace("evict_last", "evict_first")), (LOAD, LOAD.replace("evict_last", "evict_first"))],
    "nc": [("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800\n  return load_raw<T, N>(p);  // cache policies",
            "#if 1\n  return load_raw<T, N>(p);  // cache policies")],
}

MORE = {
    "norm_lean.cu": [("load_raw_h<T, VEC, ARITY, !kLayer>(r,", "load_raw_h<T, VEC, ARITY, true>(r,")],
    "rope.cu": [("rq[i] = load_raw<T, VEC>(qrow + j * VEC);", "rq[i] = load_raw_keep<T, VEC>(qrow + j * VEC);"),
                ("rk[i] = load_raw<T, VEC>(krow + j * VEC);", "rk[i] = load_raw_keep<T, VEC>(krow + j * VEC);")],
    "act.cu": [("constexpr bool keep = ACT != kGeluErf;", "constexpr bool keep = true;")],
}

for name, edits in EDITS.items():
    dest = Path(sys.argv[1]) / f"src-{name}"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(ROOT / "cuda", dest)
    header = dest / "common" / "dtype.cuh"
    text = header.read_text()
    for old, new in edits:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    header.write_text(text)
    for file, file_edits in (MORE.items() if name == "more" else ()):
        text = (dest / file).read_text()
        for old, new in file_edits:
            assert text.count(old) == 1, (name, old)
            text = text.replace(old, new)
        (dest / file).write_text(text)
    print(dest)
