// Dev probe (twenty-fifth session, not part of the package): does the GEMM search rank cuBLASLt's candidates the way
// the power-capped LTX step would?
//
// The search (cuda/gemm.cpp) times candidates in ~0.5 ms bursts, interleaved, so every candidate runs at about the
// same SM clock and is ranked by cycles. The 161-frame step runs at the 700 W cap the whole time (NVML, sessions 22
// and 24), where a step's time is its energy over the cap: a candidate that takes fewer cycles but more power per
// cycle can lose there. For each LTX-2B projection at 161 frames (CFG batch 2) this lists the search's finalists (the
// eight fastest stage-1 candidates + the heuristic's first choice), times them in bursts as the search does, and
// then runs each alone back to back for `seconds` (the first quarter untimed, so the power limiter settles), reading
// NVML's energy counter, power and SM clock over the timed part.
// Build: nvcc -O2 -std=c++17 gemm_energy.cu -I$NV/include -L$NV/lib -l:libcublasLt.so.13 -ldl -o gemm_energy
// Run:   ./gemm_energy [tokens=16128] [seconds=0.4] [rounds=2]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CK(x) do { auto s_ = (x); if (s_ != 0) { std::printf("error %d at %s:%d\n", int(s_), __FILE__, __LINE__); std::exit(1); } } while (0)

// NVML through dlopen: the toolkit here ships no nvml.h. Signatures as in NVML's API (handles are opaque pointers).
struct Nvml {
  using Dev = void*;
  int (*init)() = nullptr;
  int (*handle)(unsigned, Dev*) = nullptr;
  int (*energy)(Dev, unsigned long long*) = nullptr;  // mJ since the driver loaded
  int (*power)(Dev, unsigned*) = nullptr;             // mW
  int (*clock)(Dev, int, unsigned*) = nullptr;        // MHz; type 1 = SM
  Dev dev = nullptr;
  bool load() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return false;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    handle = reinterpret_cast<int (*)(unsigned, Dev*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<int (*)(Dev, unsigned long long*)>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    power = reinterpret_cast<int (*)(Dev, unsigned*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    clock = reinterpret_cast<int (*)(Dev, int, unsigned*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    return init && handle && energy && power && clock && init() == 0 && handle(0, &dev) == 0;
  }
  double joules() { unsigned long long mj = 0; energy(dev, &mj); return mj * 1e-3; }
};

__global__ void fill_random(__nv_bfloat16* p, size_t n, unsigned seed) {  // GEMM power depends on bit toggling
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

struct Shape { const char* name; int n, k; bool gelu, residual; };
struct Problem {
  cublasLtHandle_t h; cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t a, b, c;
  const void *w, *x, *res; void *y, *ws; size_t ws_bytes; cudaStream_t st;
  bool run(const cublasLtMatmulAlgo_t& algo) const {
    const float one = 1.f, zero = 0.f;
    return cublasLtMatmul(h, op, &one, w, a, x, b, res ? &one : &zero, res ? res : y, c, y, c, &algo, ws, ws_bytes,
                          st) == CUBLAS_STATUS_SUCCESS;
  }
  float burst_us(const cublasLtMatmulAlgo_t& algo, int reps) const {  // mean of `reps` back-to-back runs
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    run(algo);
    cudaEventRecord(e0, st);
    bool ok = true;
    for (int i = 0; i < reps; ++i) ok = run(algo) && ok;
    cudaEventRecord(e1, st); cudaEventSynchronize(e1);
    float ms = 0.f; cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    cudaGetLastError();
    return ok ? ms * 1000.f / reps : -1.f;
  }
};

struct Sustained { double us, joules_per_gemm, watts, mhz; };

// `seconds` of back-to-back runs; the last three quarters timed by events, NVML energy read when the GPU reaches the
// quarter mark and again at the end (polled every 0.2 ms), power and SM clock sampled every 10 ms in between.
Sustained sustained(const Problem& p, const cublasLtMatmulAlgo_t& algo, float burst, double seconds, Nvml& nvml) {
  const int total = std::max(8, int(seconds * 1e6 / burst)), quarter = total / 4;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::atomic<int> recorded{0};  // an event never recorded queries as complete: wait for the host thread's record
  std::thread host([&] {
    for (int i = 0; i < total; ++i) {
      if (i == quarter) cudaEventRecord(e0, p.st), recorded = 1;
      p.run(algo);
    }
    cudaEventRecord(e1, p.st);
    recorded = 2;
  });
  auto wait_for = [&](cudaEvent_t e, int mark) {
    while (recorded < mark || cudaEventQuery(e) == cudaErrorNotReady)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  };
  wait_for(e0, 1);
  const double j0 = nvml.joules();
  double watts = 0, mhz = 0; int samples = 0;
  while (recorded < 2 || cudaEventQuery(e1) == cudaErrorNotReady) {
    unsigned mw = 0, clk = 0;
    if (nvml.power(nvml.dev, &mw) == 0 && nvml.clock(nvml.dev, 1, &clk) == 0) watts += mw * 1e-3, mhz += clk, ++samples;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  host.join();
  wait_for(e1, 2);
  const double j1 = nvml.joules();
  float ms = 0.f; cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  const int timed = total - quarter;
  return {ms * 1000.0 / timed, (j1 - j0) / timed, samples ? watts / samples : 0, samples ? mhz / samples : 0};
}

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 2 * 8064;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.4;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 2;
  Nvml nvml;
  if (!nvml.load()) { std::printf("NVML not available\n"); return 1; }
  const Shape shapes[] = {
      {"attn1.qkv 2048->6144", 6144, 2048, false, false},
      {"attn1.out / attn2.q 2048->2048", 2048, 2048, false, false},
      {"attn2.out + residual 2048->2048", 2048, 2048, false, true},
      {"ff.up + gelu 2048->8192", 8192, 2048, true, false},
      {"ff.down 8192->2048", 2048, 8192, false, false},
  };
  const size_t ws_bytes = 4u << 20;  // the binding's workspace (kGemmWorkspaceBytes)
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  void *W, *X, *Y, *R, *B, *ws;
  CK(cudaMalloc(&W, size_t(8192) * 8192 * 2)); CK(cudaMalloc(&X, size_t(tokens) * 8192 * 2));
  CK(cudaMalloc(&Y, size_t(tokens) * 8192 * 2)); CK(cudaMalloc(&R, size_t(tokens) * 2048 * 2));
  CK(cudaMalloc(&B, 8192 * 2)); CK(cudaMalloc(&ws, ws_bytes));
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(W), size_t(8192) * 8192, 1u);
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(X), size_t(tokens) * 8192, 2u);
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(R), size_t(tokens) * 2048, 4u);
  fill_random<<<8, 256>>>(static_cast<__nv_bfloat16*>(B), 8192, 3u);
  CK(cudaDeviceSynchronize());
  const uint16_t clusters[] = {0, 2, 3, 5};
  for (const Shape& s : shapes) {
    cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = s.gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &B, sizeof B));
    cublasLtMatrixLayout_t a, b, c;
    CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, s.k, s.n, s.k));
    CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.k, tokens, s.k));
    CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, s.n, tokens, s.n));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[8]; int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 8, res, &got));
    const Problem p{h, op, a, b, c, W, X, s.residual ? R : nullptr, Y, ws, ws_bytes, st};
    // Candidates as the search lists them: the heuristic's list, then its first algorithm's variants.
    std::vector<cublasLtMatmulAlgo_t> algos;
    for (int i = 0; i < got; ++i) if (res[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(res[i].algo);
    size_t bytes = 0;
    cublasLtMatmulAlgoCapGetAttribute(&res[0].algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes);
    std::vector<uint32_t> tiles(bytes / sizeof(uint32_t));
    if (!tiles.empty()) cublasLtMatmulAlgoCapGetAttribute(&res[0].algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &bytes);
    for (uint32_t tile : tiles)
      for (uint16_t cl : clusters)
        for (int32_t opt = 0; opt <= 7; ++opt) {
          cublasLtMatmulAlgo_t algo = res[0].algo;
          cublasLtMatmulHeuristicResult_t chk{};
          if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) ||
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl) ||
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &opt, sizeof opt) ||
              cublasLtMatmulAlgoCheck(h, op, a, b, c, c, &algo, &chk) != CUBLAS_STATUS_SUCCESS || chk.workspaceSize > ws_bytes)
            continue;
          algos.push_back(algo);
        }
    const float first = p.burst_us(algos[0], 5);
    const int reps1 = std::clamp(int(100.f / first) + 1, 1, 16);
    std::vector<std::pair<float, size_t>> stage1;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 1; i < algos.size(); ++i) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > 15.0) break;
      const float us = p.burst_us(algos[i], reps1);
      if (us > 0) stage1.push_back({us, i});
    }
    std::sort(stage1.begin(), stage1.end());
    std::vector<size_t> fin{0};
    for (size_t i = 0; i < std::min<size_t>(8, stage1.size()); ++i) fin.push_back(stage1[i].second);
    // Bursts as stage 2 times them (5 interleaved rounds, ~0.5 ms each), then the sustained runs, interleaved.
    const int reps2 = std::clamp(int(500.f / first) + 1, 2, 50);
    std::vector<std::vector<float>> bursts(fin.size());
    for (int r = 0; r < 5; ++r)
      for (size_t f = 0; f < fin.size(); ++f) bursts[f].push_back(p.burst_us(algos[fin[f]], reps2));
    std::vector<std::vector<Sustained>> sus(fin.size());
    sustained(p, algos[0], first, seconds, nvml);  // bring the GPU to the cap before the first timed candidate
    for (int r = 0; r < rounds; ++r)
      for (size_t f = 0; f < fin.size(); ++f) {
        const size_t g = r % 2 ? fin.size() - 1 - f : f;  // alternate the order between rounds
        sus[g].push_back(sustained(p, algos[fin[g]], first, seconds, nvml));
      }
    std::printf("\n%s  tokens %d: %zu candidates, %zu sampled in stage 1\n", s.name, tokens, algos.size(), stage1.size());
    std::printf("  %-34s %9s %9s %9s %7s %6s\n", "candidate", "burst us", "cap us", "mJ/gemm", "W", "MHz");
    for (size_t f = 0; f < fin.size(); ++f) {
      uint32_t tile = 0; uint16_t cl = 0; int32_t opt = 0; int id = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&algos[fin[f]], CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &bytes);
      cublasLtMatmulAlgoConfigGetAttribute(&algos[fin[f]], CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &bytes);
      cublasLtMatmulAlgoConfigGetAttribute(&algos[fin[f]], CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl, &bytes);
      cublasLtMatmulAlgoConfigGetAttribute(&algos[fin[f]], CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &opt, sizeof opt, &bytes);
      std::vector<float> bs = bursts[f];
      std::sort(bs.begin(), bs.end());
      double us = 0, mj = 0, w = 0, mhz = 0;
      for (const auto& x : sus[f]) us += x.us, mj += 1e3 * x.joules_per_gemm, w += x.watts, mhz += x.mhz;
      const double n = double(sus[f].size());
      char label[64];
      std::snprintf(label, sizeof label, "%s algo %d tile %u cl %u opt %d", f == 0 ? "heur" : "    ", id, tile, cl, opt);
      std::printf("  %-34s %9.1f %9.1f %9.2f %7.0f %6.0f\n", label, bs[bs.size() / 2], us / n, mj / n, w / n, mhz / n);
    }
    std::fflush(stdout);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a); cublasLtMatrixLayoutDestroy(b); cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  return 0;
}
