// Linear layers on cuBLASLt with the algorithm chosen by measurement (host code only: built by g++, not nvcc).
//
// torch's addmm runs cuBLASLt's heuristic first choice. On the H100 that choice is up to ~10% slower than the best
// configuration cuBLASLt itself offers for LTX-2B's projections (docs/tuning.md#gemms): the
// heuristic returns 8 algorithms, while its first algorithm takes thousands of tile / cluster / option variants,
// some of which fit the token count to the 132 SMs far better. So, once per problem (shape, dtype, leading dims,
// alignment, device), the first call times the heuristic's list and those variants on its own operands (stage 1:
// one short sample each, within a time budget), re-times the fastest few against the heuristic's first choice,
// interleaved (stage 2: medians over rounds), and keeps the winner only if it beats that choice by > 1%. Later
// calls go straight to the kept algorithm. Problems under 1 GFLOP or 20 us are not searched. While a graph is being
// captured (no timing possible) and with tuning off, the heuristic's first choice runs, exactly what torch would
// run. gemm_export / gemm_import carry the choices to a later process (records checked against this cuBLASLt
// version and by cublasLtMatmulAlgoCheck on load).
#include "common/params.h"
#include "common/source_use.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <type_traits>
#include <mutex>
#include <tuple>
#include <vector>

namespace ltxbench {
namespace {

constexpr double kStageOneBudgetSeconds = 15.0;
constexpr size_t kFinalists = 8;
constexpr int kFinalRounds = 5;
constexpr float kMinGain = 0.01f;
constexpr float kMinSearchUs = 20.f;  // below: launch cost dominates, and the search would outlast any saving
// Below ~1.6 us of tensor-core work at 600 TFLOP/s: never searched, not even timed. One timed launch of a tiny GEMM
// on an idle stream measures host latency, which had sent 1-token test problems into 15-s searches (H100).
constexpr double kMinSearchFlop = 1e9;
constexpr int kFirstReps = 5;  // back-to-back runs for the first time: a queue, so host latency is not timed
constexpr int kCudaErrorBase = 1000;                         // launch_gemm's codes: cuBLAS status, or this + cudaError_t
constexpr uint16_t kClusters[] = {0, 2, 3, 5};               // auto, 1x1x1, 2x1x1, 1x2x1
constexpr int kMaxOption = 7;
constexpr const char* kRecordTag = "ltxgemm2";                // format of gemm_export's records (2: + residual)
constexpr int kRecordNumbers = 20;                           // cuBLASLt version, 11 key fields, 8 algorithm words

struct Key {
  int device, dtype, act, align;
  bool bias, residual;  // residual: beta = 1 with C = the residual (the epilogue reads it: timed apart)
  int64_t tokens, n, k, ldx, ldw, ldout;
  bool operator<(const Key& o) const {
    return std::tie(device, dtype, act, align, bias, residual, tokens, n, k, ldx, ldw, ldout) <
           std::tie(o.device, o.dtype, o.act, o.align, o.bias, o.residual, o.tokens, o.n, o.k, o.ldx, o.ldw, o.ldout);
  }
};

struct Entry {
  cublasLtMatmulAlgo_t algo{};
  bool searched = false;  // false: the heuristic's choice, kept until a call may time candidates
  bool cached = false;    // loaded by gemm_import (not exported again)
  std::string summary;    // how it was chosen, with the timings
};

std::mutex g_mutex;
std::map<Key, Entry> g_table;
bool g_tuning = true;
std::map<int, cublasLtHandle_t> g_handles;

cudaDataType_t cuda_type(DType dt) {
  return dt == DType::F32 ? CUDA_R_32F : dt == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
}
const char* type_name(DType dt) { return dt == DType::F32 ? "fp32" : dt == DType::F16 ? "fp16" : "bf16"; }
int elem_bytes(DType dt) { return dt == DType::F32 ? 4 : 2; }

// Largest power of two <= 16 dividing every operand's address and row pitch in bytes.
int alignment(const GemmParams& p, DType dt) {
  uint64_t bits = 16;
  auto fold = [&](uint64_t v) { bits |= v; };
  fold(reinterpret_cast<uintptr_t>(p.x)), fold(reinterpret_cast<uintptr_t>(p.w));
  fold(reinterpret_cast<uintptr_t>(p.out)), fold(reinterpret_cast<uintptr_t>(p.residual));
  for (int64_t ld : {p.ldx, p.ldw, p.ldout}) fold(uint64_t(ld) * elem_bytes(dt));
  return int(bits & (~bits + 1));
}

// Descriptors of one problem in cuBLASLt's column-major terms, where row-major out is out^T (n x tokens, pitch
// ldout) = op(A) B (+ C) with A = w as stored (k x n, pitch ldw) and transposed, B = x as stored (k x tokens, pitch
// ldx), and C, the residual, laid out as out (one layout `c` for both).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

#define LTX_BLAS(expr) do { const cublasStatus_t s_ = (expr); if (s_ != CUBLAS_STATUS_SUCCESS) return int(s_); } while (0)
#define LTX_CUDA(expr) do { const cudaError_t e_ = (expr); if (e_ != cudaSuccess) return kCudaErrorBase + int(e_); } while (0)

// bias: the pointer for a launch; nullptr to describe a problem only (cublasLtMatmulAlgoCheck of a stored record).
int make_descs(const Key& key, const void* bias, Descs& d) {
  LTX_BLAS(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // fp32 stays fp32: no TF32
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LTX_BLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LTX_BLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const cublasLtEpilogue_t epi = key.act == 1 ? CUBLASLT_EPILOGUE_GELU_BIAS
                                 : key.bias   ? CUBLASLT_EPILOGUE_BIAS
                                              : CUBLASLT_EPILOGUE_DEFAULT;
  LTX_BLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias) LTX_BLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const cudaDataType_t t = cuda_type(DType(key.dtype));
  LTX_BLAS(cublasLtMatrixLayoutCreate(&d.a, t, key.k, key.n, key.ldw));
  LTX_BLAS(cublasLtMatrixLayoutCreate(&d.b, t, key.k, key.tokens, key.ldx));
  LTX_BLAS(cublasLtMatrixLayoutCreate(&d.c, t, key.n, key.tokens, key.ldout));
  return 0;
}

// The heuristic's list (successful entries only), for the workspace and alignment this binding provides.
int heuristic_list(cublasLtHandle_t h, const Descs& d, int align, std::vector<cublasLtMatmulHeuristicResult_t>& out) {
  cublasLtMatmulPreference_t pref = nullptr;
  LTX_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      owner(pref, &cublasLtMatmulPreferenceDestroy);
  const size_t ws = kGemmWorkspaceBytes;
  LTX_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t al = uint32_t(align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    LTX_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
  out.assign(8, {});  // cuBLASLt returned 8 at most (H100, cu13.0)
  int returned = 0;
  LTX_BLAS(cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.c, d.c, pref, int(out.size()), out.data(), &returned));
  out.resize(size_t(std::max(returned, 0)));
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& r) { return r.state != CUBLAS_STATUS_SUCCESS; }),
            out.end());
  return out.empty() ? int(CUBLAS_STATUS_NOT_SUPPORTED) : 0;
}

cublasStatus_t matmul(cublasLtHandle_t h, const Descs& d, const cublasLtMatmulAlgo_t& algo, const GemmParams& p,
                      cudaStream_t stream) {
  const float one = 1.f, zero = 0.f;
  const void* c = p.residual ? p.residual : p.out;  // with beta 0 cuBLASLt does not read C
  return cublasLtMatmul(h, d.op, &one, p.w, d.a, p.x, d.b, p.residual ? &one : &zero, c, d.c, p.out, d.c, &algo,
                        p.workspace, kGemmWorkspaceBytes, stream);
}

// The heuristic's list, then its first algorithm's tile x cluster x option variants that cuBLASLt accepts.
std::vector<cublasLtMatmulAlgo_t> candidates(cublasLtHandle_t h, const Descs& d,
                                             const std::vector<cublasLtMatmulHeuristicResult_t>& heuristic) {
  std::vector<cublasLtMatmulAlgo_t> out;
  for (const auto& r : heuristic) out.push_back(r.algo);
  const cublasLtMatmulAlgo_t base = heuristic.front().algo;
  size_t bytes = 0;
  cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes);
  std::vector<uint32_t> tiles(bytes / sizeof(uint32_t));
  if (!tiles.empty()) cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &bytes);
  int32_t option_max = 0;
  cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &option_max, sizeof option_max, &bytes);
  for (uint32_t tile : tiles)
    for (uint16_t cluster : kClusters)
      for (int32_t option = 0; option <= std::min(option_max, kMaxOption); ++option) {
        cublasLtMatmulAlgo_t algo = base;
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster) ||
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option, sizeof option) ||
            cublasLtMatmulAlgoCheck(h, d.op, d.a, d.b, d.c, d.c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > kGemmWorkspaceBytes)
          continue;
        out.push_back(algo);
      }
  return out;
}

// Mean microseconds of `reps` back-to-back runs of each algorithm in `algos` (one warm run first); a negative
// time marks an algorithm that failed to launch. Events are read in batches so the GPU never waits on the host.
std::vector<float> time_algos(cublasLtHandle_t h, const Descs& d, const GemmParams& p, cudaStream_t stream,
                              const std::vector<cublasLtMatmulAlgo_t>& algos, int reps, double budget_s) {
  constexpr size_t kBatch = 32;
  std::vector<float> us(algos.size(), -1.f);
  cudaEvent_t ev[2 * kBatch];
  for (auto& e : ev) cudaEventCreate(&e);
  const auto start = std::chrono::steady_clock::now();
  for (size_t first = 0; first < algos.size(); first += kBatch) {
    const size_t last = std::min(algos.size(), first + kBatch);
    std::vector<bool> ok(last - first, false);
    for (size_t i = first; i < last; ++i) {
      // Host time tracks GPU time once the launch queue is full: a run of slow candidates stops here, not a batch later.
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > budget_s) break;
      if (matmul(h, d, algos[i], p, stream) != CUBLAS_STATUS_SUCCESS) continue;
      cudaEventRecord(ev[2 * (i - first)], stream);
      bool launched = true;
      for (int r = 0; r < reps; ++r) launched = launched && matmul(h, d, algos[i], p, stream) == CUBLAS_STATUS_SUCCESS;
      cudaEventRecord(ev[2 * (i - first) + 1], stream);
      ok[i - first] = launched;
    }
    cudaStreamSynchronize(stream);
    for (size_t i = first; i < last; ++i) {
      float ms = 0.f;
      if (ok[i - first] && cudaEventElapsedTime(&ms, ev[2 * (i - first)], ev[2 * (i - first) + 1]) == cudaSuccess)
        us[i] = ms * 1000.f / reps;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > budget_s) break;
  }
  // A candidate's failed launch must not surface at the caller's next CUDA call; search() ran only with no error
  // pending, so whatever this clears came from the candidates.
  cudaGetLastError();
  for (auto& e : ev) cudaEventDestroy(e);
  return us;
}

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  uint32_t tile = 0;
  uint16_t cluster = 0;
  int32_t option = 0;
  size_t bytes = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &bytes);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &bytes);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option, sizeof option, &bytes);
  char buf[96];
  std::snprintf(buf, sizeof buf, "tile id %u, cluster id %u, option %d", tile, unsigned(cluster), option);
  return buf;
}

// Stage 1 over every candidate, stage 2 over the finalists and the heuristic's first choice (index 0).
int search(cublasLtHandle_t h, const Descs& d, const GemmParams& p, DType dt, cudaStream_t stream,
           const std::vector<cublasLtMatmulHeuristicResult_t>& heuristic, Entry& entry) {
  std::string& summary = entry.summary;
  const auto start = std::chrono::steady_clock::now();
  if (cudaPeekAtLastError() != cudaSuccess) {  // someone else's error: leave it for them, search at a later call
    summary = "heuristic's choice (a CUDA error was pending: not searched)";
    return 0;
  }
  if (2.0 * double(p.tokens) * double(p.n) * double(p.k) < kMinSearchFlop) {
    entry.searched = true;
    summary = "heuristic's choice (under 1 GFLOP: not searched)";
    return 0;
  }
  const float first_us = time_algos(h, d, p, stream, {heuristic.front().algo}, kFirstReps, 1e9)[0];
  if (first_us <= 0.f) return int(CUBLAS_STATUS_EXECUTION_FAILED);
  entry.searched = true;
  if (dt == DType::F32) {  // no tensor cores, none of the tile variants the search is for
    char buf[128];
    std::snprintf(buf, sizeof buf, "heuristic %.1f us, kept it (fp32: not searched)", first_us);
    summary = buf;
    return 0;
  }
  if (first_us < kMinSearchUs) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "heuristic %.1f us, kept it (under %.0f us: not searched)", first_us, kMinSearchUs);
    summary = buf;
    return 0;
  }
  // Listing the candidates is host work (a cublasLtMatmulAlgoCheck per variant, thousands): only past the checks above.
  const std::vector<cublasLtMatmulAlgo_t> algos = candidates(h, d, heuristic);
  const int reps1 = std::clamp(int(100.f / first_us) + 1, 1, 16);
  const std::vector<float> sample = time_algos(h, d, p, stream, algos, reps1, kStageOneBudgetSeconds);
  std::vector<size_t> order;
  for (size_t i = 1; i < algos.size(); ++i)
    if (sample[i] > 0.f) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sample[a] < sample[b]; });
  order.resize(std::min(order.size(), kFinalists));
  order.insert(order.begin(), 0);
  std::vector<cublasLtMatmulAlgo_t> finalists;
  for (size_t i : order) finalists.push_back(algos[i]);
  const int reps2 = std::clamp(int(500.f / first_us) + 1, 2, 50);
  std::vector<std::vector<float>> rounds(finalists.size());
  for (int r = 0; r < kFinalRounds; ++r) {
    const std::vector<float> t = time_algos(h, d, p, stream, finalists, reps2, 1e9);
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i] > 0.f) rounds[i].push_back(t[i]);
  }
  auto median = [](std::vector<float> v) {
    if (v.empty()) return 1e30f;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<float> medians;
  for (const auto& r : rounds) medians.push_back(median(r));
  size_t best = 0;
  const float heuristic_us = medians[0];
  float best_us = heuristic_us;
  for (size_t i = 1; i < finalists.size(); ++i)
    if (medians[i] < best_us) best = i, best_us = medians[i];
  if (best != 0 && best_us > (1.f - kMinGain) * heuristic_us) best = 0, best_us = heuristic_us;
  entry.algo = finalists[best];
  const size_t sampled = size_t(std::count_if(sample.begin(), sample.end(), [](float t) { return t > 0.f; }));
  char buf[320];
  std::snprintf(buf, sizeof buf, "heuristic %.1f us, %s %.1f us (%s); %zu of %zu candidates sampled in %.1f s",
                heuristic_us, best == 0 ? "kept it" : "tuned", best_us, describe(entry.algo).c_str(), sampled,
                algos.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  summary = buf;
  return 0;
}

// "bf16 x@w.T+b tokens 5376 n 2048 k 2048 (ld 2048/2048/2048, align 16, device 0): " + how it was chosen.
std::string describe(const Key& key, const Entry& entry) {
  char head[192];
  const char* formula = key.act == 1 ? "gelu_tanh(x@w.T+b)"
                        : key.residual ? (key.bias ? "x@w.T+b+residual" : "x@w.T+residual")
                                       : (key.bias ? "x@w.T+b" : "x@w.T");
  std::snprintf(head, sizeof head, "%s %s tokens %lld n %lld k %lld (ld %lld/%lld/%lld, align %d, device %d): ",
                type_name(DType(key.dtype)), formula,
                (long long)key.tokens, (long long)key.n, (long long)key.k, (long long)key.ldx, (long long)key.ldw,
                (long long)key.ldout, key.align, key.device);
  return head + entry.summary + (entry.cached ? " [from cache]" : "");
}

cublasLtHandle_t handle_for(int device) {  // g_mutex held; the caller's current device is `device`
  auto& handle = g_handles[device];
  if (!handle && cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) handle = nullptr;
  return handle;
}

// "<kRecordTag> n0 n1 ... n19": exactly kRecordNumbers unsigned decimal integers after the tag, nothing else.
bool parse_record(const std::string& head, uint64_t (&numbers)[kRecordNumbers]) {
  const size_t tag = std::strlen(kRecordTag);
  if (head.compare(0, tag, kRecordTag) != 0) return false;
  const char* cursor = head.c_str() + tag;
  for (uint64_t& number : numbers) {
    if (*cursor != ' ') return false;
    while (*cursor == ' ') ++cursor;
    if (*cursor < '0' || *cursor > '9') return false;  // no sign, no junk
    char* end = nullptr;
    errno = 0;
    number = std::strtoull(cursor, &end, 10);
    if (errno != 0) return false;
    cursor = end;
  }
  return *cursor == '\0';
}

}  // namespace

int launch_gemm(const GemmParams& p, DType dt, int device, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  const int align = alignment(p, dt);
  const Key key{device,  int(dt), p.act, align, p.bias != nullptr, p.residual != nullptr,
                p.tokens, p.n,     p.k,   p.ldx, p.ldw,             p.ldout};
  Descs d;
  if (const int err = make_descs(key, p.bias, d)) return err;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LTX_CUDA(cudaStreamIsCapturing(stream, &capture));
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulAlgo_t algo{};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    h = handle_for(device);
    if (!h) return int(CUBLAS_STATUS_NOT_INITIALIZED);
    auto found = g_table.find(key);
    const bool can_search = g_tuning && capture == cudaStreamCaptureStatusNone;
    if (found == g_table.end() || (!found->second.searched && can_search)) {
      std::vector<cublasLtMatmulHeuristicResult_t> heuristic;
      if (const int err = heuristic_list(h, d, align, heuristic)) return err;
      Entry entry;
      entry.algo = heuristic.front().algo;
      entry.summary = capture != cudaStreamCaptureStatusNone ? "heuristic's choice (captured before tuning)"
                                                             : "heuristic's choice (tuning off)";
      if (can_search)
        if (const int err = search(h, d, p, dt, stream, heuristic, entry)) return err;
      found = g_table.insert_or_assign(key, entry).first;
    }
    algo = found->second.algo;
  }
  LTX_BLAS(matmul(h, d, algo, p, stream));
  return 0;
}

const char* gemm_error_string(int code) {
  NOTE_SOURCE_USED();
  return code >= kCudaErrorBase ? cudaGetErrorString(cudaError_t(code - kCudaErrorBase))
                                : cublasLtGetStatusString(cublasStatus_t(code));
}

bool gemm_set_tuning(bool enabled) {
  NOTE_SOURCE_USED();
  std::lock_guard<std::mutex> lock(g_mutex);
  const bool previous = g_tuning;
  g_tuning = enabled;
  return previous;
}

std::vector<std::string> gemm_table() {
  NOTE_SOURCE_USED();
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::string> lines;
  for (const auto& [key, entry] : g_table) lines.push_back(describe(key, entry));
  return lines;
}

// "ltxgemm2 <cuBLASLt version> <dtype act align bias residual tokens n k ldx ldw ldout> <8 algo words>\t<summary>" for
// every problem searched in this process; the device is the caller's to record (records are stored per GPU model).
std::vector<std::string> gemm_export(int device) {
  NOTE_SOURCE_USED();
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::string> records;
  for (const auto& [key, entry] : g_table) {
    if (key.device != device || !entry.searched || entry.cached) continue;
    char buf[512];
    int used = std::snprintf(buf, sizeof buf, "%s %zu %d %d %d %d %d %lld %lld %lld %lld %lld %lld", kRecordTag,
                             cublasLtGetVersion(), key.dtype, key.act, key.align, int(key.bias), int(key.residual),
                             (long long)key.tokens,
                             (long long)key.n, (long long)key.k, (long long)key.ldx, (long long)key.ldw,
                             (long long)key.ldout);
    for (uint64_t word : entry.algo.data)
      used += std::snprintf(buf + used, sizeof buf - size_t(used), " %llu", (unsigned long long)word);
    records.push_back(std::string(buf) + '\t' + entry.summary);
  }
  return records;
}

// Records of gemm_export for `device` (the current device): each kept unless malformed, from another cuBLASLt
// version, for a problem already searched in this process, or refused by cublasLtMatmulAlgoCheck. Returns how
// many were kept; they run like searched choices, with tuning on or off.
int gemm_import(int device, const std::vector<std::string>& records) {
  NOTE_SOURCE_USED();
  std::lock_guard<std::mutex> lock(g_mutex);
  cublasLtHandle_t h = handle_for(device);
  if (!h) return 0;
  int kept = 0;
  for (const std::string& record : records) {
    const size_t tab = record.find('\t');
    uint64_t numbers[kRecordNumbers];  // cuBLASLt version, 11 key fields, 8 algorithm words
    if (!parse_record(record.substr(0, tab), numbers) || numbers[0] != cublasLtGetVersion() || numbers[1] > 2 ||
        numbers[2] > 1 || numbers[4] > 1 || numbers[5] > 1 || (numbers[2] == 1 && numbers[5] == 1) ||
        numbers[6] == 0 || numbers[7] == 0 || numbers[8] == 0)
      continue;
    Key key{};
    key.device = device, key.dtype = int(numbers[1]), key.act = int(numbers[2]), key.align = int(numbers[3]);
    key.bias = numbers[4] != 0, key.residual = numbers[5] != 0, key.tokens = int64_t(numbers[6]);
    key.n = int64_t(numbers[7]), key.k = int64_t(numbers[8]), key.ldx = int64_t(numbers[9]);
    key.ldw = int64_t(numbers[10]), key.ldout = int64_t(numbers[11]);
    cublasLtMatmulAlgo_t algo{};
    std::copy(numbers + 12, numbers + kRecordNumbers, algo.data);
    const auto found = g_table.find(key);
    if (found != g_table.end() && found->second.searched) continue;
    Descs d;
    cublasLtMatmulHeuristicResult_t check{};
    if (make_descs(key, nullptr, d) != 0 ||
        cublasLtMatmulAlgoCheck(h, d.op, d.a, d.b, d.c, d.c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > kGemmWorkspaceBytes)
      continue;
    Entry entry;
    entry.algo = algo, entry.searched = true, entry.cached = true;
    entry.summary = tab == std::string::npos ? std::string("(no summary)") : record.substr(tab + 1);
    g_table.insert_or_assign(key, entry);
    ++kept;
  }
  return kept;
}

}  // namespace ltxbench
