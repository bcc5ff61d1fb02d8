// linear for a few rows (an LLM's decode step: one token a sequence): out (M, N) = x (M, K) @ W (N, K)ᵀ [+ bias]
// [+ residual], M <= kGemvMaxRows, fp32 sums rounded once, on linear's GemmParams (M = tokens, N = n, K = k). Such a
// product reads every weight once and does two FLOPs per weight read, so it is bound by memory bandwidth alone; the
// goal is to keep HBM busy.
//
// One block of kThreads threads per kRows output rows: each thread streams 16-byte vectors of the kRows weight rows
// along K (kRows loads in flight, unrolled twice more), multiplies them with the same vectors of every x row (x is a
// few KB: L1 and L2 serve it), and the block sums the partial products (warp shuffles, then shared memory). Many small
// blocks (N / kRows) keep every SM loaded even at N = 1024.
//
// With an RMSNorm before it (rms_norm_linear, add_rms_norm_linear: a decoder layer's input norm before q/k/v, its
// post-attention norm before gate/up) every block reads the whole x row anyway, so it also sums x² over the row and
// multiplies x by the norm's weight as it loads it; the row's 1/rms is a common factor of every product and is applied
// to the fp32 sum at the end. No normed row is written or read back, and the norm costs no launch of its own. With the
// residual add in front, h = x + residual is rounded to the input dtype as it is read (as an unfused add stores it)
// and block 0 writes it out for the next residual.
//
// A decode step's q/k/v projection can also end in the RoPE and the static KV cache's writes (rms_norm_qkv_rope_cache):
// W is [q | k | v] in heads of head_dim rows, and a q or k block takes rows j, j + 1 of a head and their rotation
// partners j + half, j + half + 1, so that its epilogue holds every pair it rotates (each sum rounded to T first, as the
// unfused GEMV stores it, then rope_1d.cu's fp32 rotation); v blocks take 4 rows. q goes to out, k and v to the
// caches' row offset + s: the rope_1d_cache launch after the GEMV and its read of q/k/v go.
#include "common/dtype.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/rotate.cuh"
#include "common/row_math.cuh"
#include "common/source_use.h"

namespace ltxbench {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 4;  // weight rows a block computes

// The RMSNorm in front of the product (Prologue::None for plain linear), and what the epilogue makes of the sums.
enum class Prologue { None, Norm, AddNorm };
enum class Epilogue { Plain, SwiGLU, RopeCache };

struct NormArgs {
  const void* residual = nullptr;  // AddNorm: (M, K) at x's pitch
  void* h_out = nullptr;           // AddNorm: x + residual, (M, K) dense
  const void* gamma = nullptr;     // (K), dense
  float weight_offset = 0.f, eps = 1e-6f;
};

// Epilogue::RopeCache: neox RoPE over whole heads (half = head_dim / 2, even) from per-token fp32 tables (table_rows,
// half), row m = b * seq + s of x taking table row m (table_rows = M) or s (shared by the batch); q out (M, Hq * hd),
// k and v into dense (B, Hk, cache_len, hd) caches at row *offset + s (past cache_len: trap, as rope_1d.cu).
struct RopeCacheArgs {
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0, seq = 1;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t table_rows = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* offset = nullptr;
  int64_t cache_len = 0;
};

// SiLU as act.cu computes it for a SwiGLU (the fast form for 16-bit outputs), so that the epilogue below gives what
// the GEMV followed by ops.swiglu gives.
template <typename T> __device__ __forceinline__ float silu_times(float g, float u) {
  if constexpr (sizeof(T) == 2) return u * __fdividef(g, 1.f + __expf(-g));
  return u * (g / (1.f + expf(-g)));
}

// RopeCache's output for row n (of the block's first two where it rotates) and token row m: `a` the row's sum (scaled
// by 1/rms), `b` its partner's half a head on. Both rounded to T first, as the unfused GEMV stores q and k; then
// rope_1d.cu's rotation in fp32 (rotate_neox: the same roundings), out[j] = a·c − b·s, out[j + half] = b·c + a·s.
template <typename T>
__device__ __forceinline__ void rope_cache_epilogue(const GemmParams& p, const RopeCacheArgs& rope, bool rotates,
                                                    int64_t head, int64_t n, int m, float a, float b) {
  const int64_t hd = rope.head_dim, half = hd / 2, s = m % rope.seq, batch = m / rope.seq;
  const int64_t col = n - head * hd;  // rotates: the column within the head, < half
  const auto cache_row = [&] {  // the token's row in the k and v caches
    const int64_t row = *rope.offset + s;
    if (row < 0 || row >= rope.cache_len) __trap();
    return row;
  };
  if (!rotates) {  // v: copied into its cache row
    const int64_t vn = n - (rope.heads_q + rope.heads_kv) * hd, vh = vn / hd;
    static_cast<T*>(rope.v_cache)[((batch * rope.heads_kv + vh) * rope.cache_len + cache_row()) * hd + vn - vh * hd] =
        from_float<T>(a);
    return;
  }
  const float x0 = round_to<T>(a), x1 = round_to<T>(b);
  const int64_t table_row = rope.table_rows == p.tokens ? m : s;
  const float c = rope.cos[table_row * half + col], sv = rope.sin[table_row * half + col];
  float y0, y1;
  rotate_neox(x0, x1, c, sv, y0, y1);
  T* dst;
  if (head < rope.heads_q) {
    dst = static_cast<T*>(p.out) + m * p.ldout + head * hd;
  } else {
    dst = static_cast<T*>(rope.k_cache) +
          ((batch * rope.heads_kv + head - rope.heads_q) * rope.cache_len + cache_row()) * hd;
  }
  dst[col] = from_float<T>(y0);
  dst[col + half] = from_float<T>(y1);
}

// SwiGLU: W is [gate | up] (N = 2I rows) and out (M, I) = swiglu(x @ Wᵀ): a block takes gate rows j, j + 1 and the
// up rows I + j, I + j + 1, so that its epilogue holds each pair it writes (both sums rounded to T first, as the
// unfused GEMV stores them). RopeCache: the same pairing within a q or k head (partners half a head on), see above.
template <typename T, int M, Prologue P, Epilogue E>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemmParams p, NormArgs norm, RopeCacheArgs rope) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int kSums = kRows * M + (P == Prologue::None ? 0 : M);  // the products, then each row's sum of x²
    __shared__ float partial[kThreads / 32][kSums];
    constexpr bool kPaired = E != Epilogue::Plain;  // rows j, j + 1 and their partners `apart` rows on
    // RopeCache: the blocks of q and k heads first (half / 2 per head), then v's, 4 rows each.
    const int64_t rope_half = rope.head_dim / 2, pair_blocks = (rope.heads_q + rope.heads_kv) * (rope_half / 2);
    const bool rotates = E == Epilogue::RopeCache && blockIdx.x < pair_blocks;
    const int64_t head = rotates ? blockIdx.x / (rope_half / 2) : 0;
    int64_t n0, apart;
    int rows;
    if constexpr (E == Epilogue::SwiGLU) {
      apart = p.n / 2, n0 = static_cast<int64_t>(blockIdx.x) * 2;
      rows = static_cast<int>(apart - n0 < 2 ? apart - n0 : 2);
    } else if (rotates) {
      apart = rope_half, n0 = head * rope.head_dim + 2 * (blockIdx.x - head * (rope_half / 2)), rows = 2;
    } else {
      apart = 0, n0 = static_cast<int64_t>(blockIdx.x) * kRows;  // RopeCache's v blocks too: q/k take 4 rows a block
      rows = static_cast<int>(p.n - n0 < kRows ? p.n - n0 : kRows);
    }
    const bool pairs = kPaired && (E == Epilogue::SwiGLU || rotates);
    const int64_t nvec = p.k / VEC;
    const T* w = static_cast<const T*>(p.w);
    const T* x = static_cast<const T*>(p.x);
    const T* wrow[kRows];  // the block's weight rows; `live`: within the matrix
    bool live[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      live[r] = pairs ? r % 2 < rows : r < rows;
      wrow[r] = w + (pairs ? (r < 2 ? 0 : apart) + n0 + r % 2 : n0 + r) * p.ldw;
    }

    float acc[kRows][M] = {};
    float sumsq[M] = {};
#pragma unroll 2
    for (int64_t j = threadIdx.x; j < nvec; j += kThreads) {
      Vec<T, VEC> wr[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {  // every weight load of the step issued before any arithmetic
        if (live[r]) wr[r] = load_raw<T, VEC>(wrow[r] + j * VEC);
      }
      float gv[VEC];
      if constexpr (P != Prologue::None) {
        widen<T, VEC>(load_raw<T, VEC>(static_cast<const T*>(norm.gamma) + j * VEC), gv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) gv[e] += norm.weight_offset;
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[VEC];
        widen<T, VEC>(load_raw<T, VEC>(x + m * p.ldx + j * VEC), xv);
        if constexpr (P == Prologue::AddNorm) {
          float rv[VEC];
          widen<T, VEC>(load_raw<T, VEC>(static_cast<const T*>(norm.residual) + m * p.ldx + j * VEC), rv);
#pragma unroll
          for (int e = 0; e < VEC; ++e) xv[e] = round_to<T>(xv[e] + rv[e]);
          if (blockIdx.x == 0) store_vec<T, VEC>(static_cast<T*>(norm.h_out) + m * p.k + j * VEC, xv);
        }
        if constexpr (P != Prologue::None) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) sumsq[m] = fmaf(xv[e], xv[e], sumsq[m]), xv[e] *= gv[e];
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (!live[r]) continue;
          float wf[VEC];
          widen<T, VEC>(wr[r], wf);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[r][m] = fmaf(wf[e], xv[e], acc[r][m]);
        }
      }
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    auto warp_sum = [&](float v, int slot) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) partial[warp][slot] = v;
    };
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int m = 0; m < M; ++m) warp_sum(acc[r][m], r * M + m);
    }
    if constexpr (P != Prologue::None) {
#pragma unroll
      for (int m = 0; m < M; ++m) warp_sum(sumsq[m], kRows * M + m);
    }
    __syncthreads();
    // one thread per output: the warps' sums (a row's 1/rms), the bias, the residual or the SwiGLU, one rounding.
    // 1/rms by row_math.cuh's rms_stats: IEEE sqrt and division, as the norm kernels (rsqrtf is off by up to 2 ulp).
    if (threadIdx.x < rows * M) {
      const int r = threadIdx.x / M, m = threadIdx.x % M;
      auto total = [&](int slot) {
        float sum = 0.f;
#pragma unroll
        for (int g = 0; g < kThreads / 32; ++g) sum += partial[g][slot];
        return sum;
      };
      const float scale =
          P == Prologue::None ? 1.f : rms_stats(total(kRows * M + m), static_cast<float>(p.k), norm.eps).rstd;
      const int64_t n = n0 + r;
      if constexpr (E == Epilogue::SwiGLU) {  // r: the pair; its gate sum in slot r, its up sum two rows on
        const float g = round_to<T>(total(threadIdx.x) * scale), u = round_to<T>(total((2 + r) * M + m) * scale);
        static_cast<T*>(p.out)[m * p.ldout + n] = from_float<T>(silu_times<T>(g, u));
      } else if constexpr (E == Epilogue::RopeCache) {
        rope_cache_epilogue<T>(p, rope, rotates, head, n, m, total(threadIdx.x) * scale,
                               rotates ? total((2 + r) * M + m) * scale : 0.f);
      } else {
        float sum = total(threadIdx.x) * scale;
        if (p.bias) sum += to_float<T>(static_cast<const T*>(p.bias)[n]);
        if (p.residual) sum += to_float<T>(static_cast<const T*>(p.residual)[m * p.ldout + n]);
        static_cast<T*>(p.out)[m * p.ldout + n] = from_float<T>(sum);
      }
    }
  }
}

template <typename T, Prologue P, Epilogue E = Epilogue::Plain>
cudaError_t launch_gemv_typed(const GemmParams& p, const NormArgs& norm, cudaStream_t stream,
                              const RopeCacheArgs& rope = {}) {
  // RopeCache: N = (Hq + 2 Hk) hd rows with hd % 4 == 0, so that q/k blocks (2 pairs) and v blocks (4 rows) cover
  // N / 4 blocks as plain ones do.
  const unsigned blocks = static_cast<unsigned>(E == Epilogue::SwiGLU ? (p.n / 2 + 1) / 2 : (p.n + kRows - 1) / kRows);
  switch (p.tokens) {
    case 1: gemv_kernel<T, 1, P, E><<<blocks, kThreads, 0, stream>>>(p, norm, rope); break;
    case 2: gemv_kernel<T, 2, P, E><<<blocks, kThreads, 0, stream>>>(p, norm, rope); break;
    case 3: gemv_kernel<T, 3, P, E><<<blocks, kThreads, 0, stream>>>(p, norm, rope); break;
    case 4: gemv_kernel<T, 4, P, E><<<blocks, kThreads, 0, stream>>>(p, norm, rope); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

bool gemv_takes(const GemmParams& p, int element_bytes) {
  NOTE_SOURCE_USED();
  const int vec = 16 / element_bytes;
  auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return p.act == 0 && p.tokens >= 1 && p.tokens <= kGemvMaxRows && p.n > 0 && p.k > 0 && p.n <= (int64_t{1} << 33) &&
         p.k % vec == 0 && p.ldw % vec == 0 && p.ldx % vec == 0 && aligned16(p.w) && aligned16(p.x);
}

cudaError_t launch_gemv(const GemmParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  return dispatch_dtype(dtype, [&](auto tag) {
    return launch_gemv_typed<decltype(tag), Prologue::None>(p, NormArgs{}, stream);
  });
}

// out = rms_norm(h) @ wᵀ with h = x, or h = x + residual (written to h_out) where residual is given: the norm's
// weight (gamma, K) plus weight_offset, fp32 math, one rounding; with swiglu, w is [gate | up] (p.n = 2I rows) and out
// (M, I) at pitch p.ldout its SwiGLU (declared where it is called: bindings/gemv_norm.cpp). The operands as
// gemv_takes wants them, the residual at x's pitch, gamma and h_out dense and 16-byte aligned.
cudaError_t launch_norm_gemv(const GemmParams& p, const void* residual, void* h_out, const void* gamma,
                             float weight_offset, float eps, bool swiglu, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  const NormArgs norm{residual, h_out, gamma, weight_offset, eps};
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (residual)
      return swiglu ? launch_gemv_typed<T, Prologue::AddNorm, Epilogue::SwiGLU>(p, norm, stream)
                    : launch_gemv_typed<T, Prologue::AddNorm>(p, norm, stream);
    return swiglu ? launch_gemv_typed<T, Prologue::Norm, Epilogue::SwiGLU>(p, norm, stream)
                  : launch_gemv_typed<T, Prologue::Norm>(p, norm, stream);
  });
}

// rms_norm_qkv_rope_cache's GEMV (declared where it is called: bindings/gemv_norm.cpp): out = q of
// rms_norm(x) @ wᵀ rotated, k rotated and v written into the caches; w [q | k | v] with p.n = (Hq + 2 Hk) hd rows,
// hd % 4 == 0, out (M, Hq hd) dense at pitch p.ldout; tables (table_rows, hd / 2) fp32 dense, caches dense
// (M / seq, Hk, cache_len, hd), all 16-byte aligned where gemv_takes asks.
cudaError_t launch_norm_gemv_rope_cache(const GemmParams& p, const void* gamma, float weight_offset, float eps,
                                        int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t seq,
                                        const float* cos, const float* sin, int64_t table_rows, void* k_cache,
                                        void* v_cache, const int64_t* offset, int64_t cache_len, DType dtype,
                                        cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (head_dim % 4 != 0 || p.n != (heads_q + 2 * heads_kv) * head_dim) return cudaErrorInvalidValue;
  const NormArgs norm{nullptr, nullptr, gamma, weight_offset, eps};
  const RopeCacheArgs rope{heads_q, heads_kv, head_dim, seq, cos, sin, table_rows, k_cache, v_cache, offset,
                           cache_len};
  return dispatch_dtype(dtype, [&](auto tag) {
    return launch_gemv_typed<decltype(tag), Prologue::Norm, Epilogue::RopeCache>(p, norm, stream, rope);
  });
}

}  // namespace ltxbench
