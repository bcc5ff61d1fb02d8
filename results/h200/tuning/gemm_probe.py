"""Dev probe (fourteenth session): how much do LTX-2B's GEMMs leave on the table, and can cuBLASLt fold the
gated residual into them?

For every transformer GEMM shape at 49 and 161 frames (CFG batch 2) it times, with CUDA events (median of 30,
warm L2: the GEMMs are compute-bound):
  * torch's call (F.linear with bias, or torch._addmm_activation for the GELU up-projection);
  * every algorithm cuBLASLt's heuristic offers for the same call (the first is what torch runs);
  * h += gate * (x @ W^T + b) as ONE batched cuBLASLt call: alpha a per-(batch, channel) device vector,
    beta 1 with C = D = h, the bias epilogue with gate * b; and h += x @ W^T + b (beta 1, no gate).
Writes one JSON line per (shape, variant) with every algorithm's time and its tile/stage/cluster ids.
Run: python results/h200/tuning/gemm_probe.py OUT.jsonl
"""

import glob
import json
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <vector>
#include <algorithm>

#define CK(x) do { cublasStatus_t s_ = (x); TORCH_CHECK(s_ == CUBLAS_STATUS_SUCCESS, #x, " -> ", (int)s_); } while (0)

// Row-major out (B, M, N) = x (B, M, K) @ w (N, K)^T as column-major D (N x M per batch) = op(w) op(x).
// mode 0: D = x w^T + bias (epilogue BIAS or GELU_BIAS); mode 1: D = alpha_vec * (x w^T) + 1 * C + bias, C = D = out;
// mode 2: D = x w^T + 1 * C + bias.
std::vector<std::vector<double>> bench(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor out,
                                       torch::Tensor alpha, int64_t mode, bool gelu, int64_t max_algos,
                                       int64_t reps) {
  const int64_t B = x.size(0), M = x.size(1), K = x.size(2), N = w.size(0);
  auto handle = at::cuda::getCurrentCUDABlasLtHandle();
  auto stream = at::cuda::getCurrentCUDAStream();
  size_t ws_size = 32u << 20;
  auto ws = torch::empty({(int64_t)ws_size}, x.options().dtype(torch::kUInt8));

  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t epi = gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  const void* bias_ptr = bias.data_ptr();
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  cudaDataType_t bias_type = CUDA_R_16BF;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  if (B > 1) {
    int64_t bstride = bias.dim() == 2 ? N : 0;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bstride, sizeof(bstride)));
  }
  float one = 1.f, zero = 0.f;
  const void* alpha_ptr = &one;
  const void* beta_ptr = mode == 0 ? &zero : &one;
  if (mode == 1) {
    int32_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
    int64_t astride = N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, &astride, sizeof(astride)));
    alpha_ptr = alpha.data_ptr();
  }
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
  if (B > 1) {
    int32_t bc = B; int64_t sa = 0, sb = M * K, sc = M * N;
    for (auto l : {la, lb, lc}) CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
    CK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof(sa)));
    CK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof(sb)));
    CK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof(sc)));
  }
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size, sizeof(ws_size)));
  std::vector<cublasLtMatmulHeuristicResult_t> res(max_algos);
  int found = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, max_algos, res.data(), &found);
  std::vector<std::vector<double>> rows;
  rows.push_back({(double)hs, (double)found});
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < found; ++i) {
    auto run = [&]() {
      return cublasLtMatmul(handle, desc, alpha_ptr, w.data_ptr(), la, x.data_ptr(), lb, beta_ptr, out.data_ptr(), lc,
                            out.data_ptr(), lc, &res[i].algo, ws.data_ptr(), ws_size, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) { rows.push_back({(double)i, -1.0}); continue; }
    for (int r = 0; r < 3; ++r) run();
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(e0, stream); run(); cudaEventRecord(e1, stream); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    int32_t tile = 0, stages = 0, cluster = 0, splitk = 0, algo_id = 0;
    size_t sz;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof(algo_id), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &sz);
    rows.push_back({(double)i, (double)t[t.size() / 2], (double)algo_id, (double)tile, (double)stages,
                    (double)cluster, (double)splitk, (double)res[i].wavesCount});
  }
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return rows;
}
"""


def cublaslt_dir() -> str:
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")
    for line in open("/proc/self/maps"):
        if "libcublasLt" in line:
            return os.path.dirname(line.split()[-1])
    hits = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcublasLt.so*"))
    return os.path.dirname(hits[0])


def torch_time(fn, reps=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main(path):
    lib = cublaslt_dir()
    ext = load_inline("gemm_probe", cpp_sources=CPP, functions=["bench"], extra_cflags=["-O2"], with_cuda=True,
                      extra_include_paths=glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*",
                                                                 "include")),
                      extra_ldflags=[f"-L{lib}", "-l:libcublasLt.so." + torch.version.cuda.split(".")[0],
                                     f"-Wl,-rpath,{lib}"], verbose=False)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    shapes = {"qkv": (6144, 2048), "out": (2048, 2048), "ff_up": (8192, 2048), "ff_down": (2048, 8192)}
    with open(path, "w") as f:
        for frames, seq in ((49, 2688), (161, 8064)):
            for name, (n, k) in shapes.items():
                x = torch.randn(2, seq, k, device=dev, dtype=dt)
                w = torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5
                b = torch.randn(n, device=dev, dtype=dt)
                out = torch.empty(2, seq, n, device=dev, dtype=dt)
                gelu = name == "ff_up"
                if gelu:
                    ref = torch_time(lambda: torch._addmm_activation(b, x.view(-1, k), w.t(), use_gelu=True))
                else:
                    ref = torch_time(lambda: torch.nn.functional.linear(x, w, b))
                flop = 2 * 2 * seq * n * k
                variants = [("plain", 0, None, b)]
                if name in ("out", "ff_down"):
                    gate = torch.randn(2, n, device=dev, dtype=torch.float32)
                    variants += [("gated_residual", 1, gate, (gate * b.float()).to(dt).contiguous()),
                                 ("residual", 2, None, b)]
                for variant, mode, alpha, bias in variants:
                    # mode 0 as one (B*M) GEMM like torch; the residual modes as a batch of 2 (per-batch alpha/bias)
                    xx = x.view(1, -1, k) if mode == 0 else x
                    oo = out.view(1, -1, n) if mode == 0 else out
                    rows = ext.bench(xx, w, bias, oo, alpha if alpha is not None else b, mode, gelu, 32, 30)
                    status, found = rows[0]
                    algos = [{"i": int(r[0]), "ms": r[1], "algo": int(r[2]), "tile": int(r[3]), "stages": int(r[4]),
                              "cluster": int(r[5]), "splitk": int(r[6]), "waves": r[7]} if len(r) > 2 else
                             {"i": int(r[0]), "failed": True} for r in rows[1:]]
                    ok = [a for a in algos if "ms" in a]
                    best = min(ok, key=lambda a: a["ms"]) if ok else None
                    line = {"frames": frames, "gemm": name, "variant": variant, "torch_ms": ref,
                            "heuristic_status": int(status), "found": int(found),
                            "first_ms": ok[0]["ms"] if ok else None, "best_ms": best["ms"] if best else None,
                            "best": best, "tflops_torch": flop / ref / 1e9,
                            "tflops_best": flop / best["ms"] / 1e9 if best else None, "algos": algos}
                    f.write(json.dumps(line) + "\n")
                    print(f"{frames}f {name:8s} {variant:15s} torch {ref * 1e3:7.1f} us | heuristic {int(status)} "
                          f"found {int(found):2d} first {line['first_ms'] and line['first_ms'] * 1e3 or -1:7.1f} "
                          f"best {line['best_ms'] and line['best_ms'] * 1e3 or -1:7.1f} us "
                          f"({line['tflops_best'] or 0:.0f} TFLOP/s, torch {line['tflops_torch']:.0f})", flush=True)
                del x, w, b, out


if __name__ == "__main__":
    main(sys.argv[1])
