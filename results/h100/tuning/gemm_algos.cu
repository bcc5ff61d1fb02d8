// Dev probe (not part of the package): for each LTX-2B linear of the 49-frame CFG step, time every
// algorithm cuBLASLt's heuristic offers (bf16, fp32 accumulate, bias or gelu+bias epilogue, row-major
// out = x @ W^T + b as torch's addmm calls it) and print them beside the heuristic's first choice, which
// is what torch runs. Question: is there a faster cuBLASLt algorithm than the one torch gets?
// Build: nvcc -O2 -std=c++17 gemm_algos.cu -I$NV/include -L$NV/lib -l:libcublasLt.so.13 -o gemm_algos
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { auto s_ = (x); if (s_ != 0) { std::printf("error %d at %s:%d\n", int(s_), __FILE__, __LINE__); std::exit(1); } } while (0)

// Random-looking data: GEMM power (and so clocks) depends on bit toggling, constant inputs would flatter.
__global__ void fill_random(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16((x & 0xffff) / 65536.0f - 0.5f);
  }
}

struct Shape { const char* name; int m, n, k; bool gelu; };

static float time_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                       cublasLtMatrixLayout_t c, const cublasLtMatmulAlgo_t* algo, const void* W, const void* X, void* Y,
                       void* ws, size_t ws_bytes, cudaStream_t st, int iters) {
  float one = 1.f, zero = 0.f;
  for (int i = 0; i < 3; ++i)
    if (cublasLtMatmul(h, op, &one, W, a, X, b, &zero, Y, c, Y, c, algo, ws, ws_bytes, st) != CUBLAS_STATUS_SUCCESS) return -1.f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> reps;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(e0, st);
    for (int i = 0; i < iters; ++i) cublasLtMatmul(h, op, &one, W, a, X, b, &zero, Y, c, Y, c, algo, ws, ws_bytes, st);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    reps.push_back(ms * 1000.f / iters);
  }
  std::sort(reps.begin(), reps.end());
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  return reps[reps.size() / 2];
}

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 2 * 2688;  // 49 frames at 512x768, batch 2
  const Shape shapes[] = {
      {"attn1.qkv 2048->6144", tokens, 6144, 2048, false},
      {"attn out / attn2.q 2048->2048", tokens, 2048, 2048, false},
      {"ff.up+gelu 2048->8192", tokens, 8192, 2048, true},
      {"ff.down 8192->2048", tokens, 2048, 8192, false},
      {"proj_in 128->2048", tokens, 2048, 128, false},
  };
  const size_t ws_bytes = 32u << 20;
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  void *W, *X, *Y, *B, *ws;
  CK(cudaMalloc(&W, size_t(8192) * 8192 * 2)); CK(cudaMalloc(&X, size_t(tokens) * 8192 * 2));
  CK(cudaMalloc(&Y, size_t(tokens) * 8192 * 2)); CK(cudaMalloc(&B, 8192 * 2)); CK(cudaMalloc(&ws, ws_bytes));
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(W), size_t(8192) * 8192, 1u);
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(X), size_t(tokens) * 8192, 2u);
  fill_random<<<8, 256>>>(static_cast<__nv_bfloat16*>(B), 8192, 3u);
  CK(cudaDeviceSynchronize());
  for (const Shape& s : shapes) {
    // Column-major view: Y^T[n_out, tokens] = W[n_out, k] (transposed K-major) * X^T[k, tokens].
    cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = s.gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &B, sizeof B));
    cublasLtMatrixLayout_t a, b, c;
    CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, s.k, s.n, s.k));
    CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.k, s.m, s.k));
    CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, s.n, s.m, s.n));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[64]; int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 64, res, &got));
    const double flop = 2.0 * s.m * s.n * s.k;
    const int iters = std::max(5, int(2e11 / flop));
    std::printf("\n%s  (M=%d N=%d K=%d), %d heuristic algorithms\n", s.name, s.m, s.n, s.k, got);
    float first = 0.f, best = 1e30f; int best_i = -1;
    for (int i = 0; i < got; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
      float us = time_algo(h, op, a, b, c, &res[i].algo, W, X, Y, ws, ws_bytes, st, iters);
      int id = -1, tile = -1, stages = -1, splitk = -1, red = -1, swz = -1;
      uint16_t cluster = 0;
      size_t sz;
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &sz);
      std::printf("  #%-2d %8.1f us %6.0f TF/s  algo %d tile %d stages %d splitk %d red %d swz %d cluster %u ws %zu waves %.2f\n",
                  i, us, us > 0 ? flop / us * 1e-6 : 0.0, id, tile, stages, splitk, red, swz, cluster,
                  res[i].workspaceSize, res[i].wavesCount);
      if (i == 0) first = us;
      if (us > 0 && us < best) { best = us; best_i = i; }
    }
    std::printf("  => heuristic first %.1f us, best #%d %.1f us (%.1f%% faster)\n", first, best_i, best,
                100.0 * (first - best) / first);
    // Beyond the heuristic's list: heuristic #0's algorithm with every tile the algorithm supports, a few
    // cluster shapes, both CTA swizzles and its custom options; each checked by cublasLtMatmulAlgoCheck.
    if (got > 0 && std::getenv("EXHAUSTIVE")) {
      cublasLtMatmulAlgo_t base = res[0].algo;
      size_t n_bytes = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &n_bytes);
      std::vector<uint32_t> tiles(n_bytes / sizeof(uint32_t));
      if (!tiles.empty()) cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), n_bytes, &n_bytes);
      int custom_max = 0, swz_ok = 0; size_t sz;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max, &sz);
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &sz);
      std::printf("  exhaustive: %zu tiles, custom options 0..%d, swizzle %d\n", tiles.size(), custom_max, swz_ok);
      const uint16_t clusters[] = {0, 2, 3, 4, 5};  // auto, 1x1x1, 2x1x1, 4x1x1, 1x2x1
      struct Found { float us; uint32_t tile; uint16_t cluster; uint32_t swz; int custom; cublasLtMatmulAlgo_t algo; };
      std::vector<Found> found;
      int tried = 0;
      for (uint32_t tile : tiles)
        for (uint16_t cl : clusters)
          for (uint32_t swz = 0; swz <= (swz_ok ? 1u : 0u); ++swz)
            for (int co = 0; co <= std::min(custom_max, 7); ++co) {
              cublasLtMatmulAlgo_t algo = base;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &co, sizeof co);
              cublasLtMatmulHeuristicResult_t chk;
              if (cublasLtMatmulAlgoCheck(h, op, a, b, c, c, &algo, &chk) != CUBLAS_STATUS_SUCCESS) continue;
              if (chk.workspaceSize > ws_bytes) continue;
              ++tried;
              float us = time_algo(h, op, a, b, c, &algo, W, X, Y, ws, ws_bytes, st, iters);
              if (us > 0) found.push_back({us, tile, cl, swz, co, algo});
            }
      std::sort(found.begin(), found.end(), [](const Found& x, const Found& y) { return x.us < y.us; });
      std::printf("  exhaustive: %d valid configurations\n", tried);
      // Re-time the five fastest against heuristic #0, interleaved, with more iterations.
      for (int round = 0; round < 2; ++round) {
        float ref = time_algo(h, op, a, b, c, &res[0].algo, W, X, Y, ws, ws_bytes, st, 4 * iters);
        std::printf("  round %d: heuristic #0 %.1f us |", round, ref);
        for (size_t i = 0; i < std::min<size_t>(5, found.size()); ++i) {
          float us = time_algo(h, op, a, b, c, &found[i].algo, W, X, Y, ws, ws_bytes, st, 4 * iters);
          std::printf(" tile %u cl %u swz %u opt %d: %.1f us (%.1f%%) |", found[i].tile, found[i].cluster, found[i].swz,
                      found[i].custom, us, 100.0 * (ref - us) / ref);
        }
        std::printf("\n");
      }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a); cublasLtMatrixLayoutDestroy(b); cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  return 0;
}
