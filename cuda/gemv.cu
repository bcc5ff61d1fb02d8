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
#include "common/dtype.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/row_math.cuh"
#include "common/source_use.h"

namespace ltxbench {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 4;  // weight rows a block computes

// The RMSNorm in front of the product (Prologue::None for plain linear).
enum class Prologue { None, Norm, AddNorm };

struct NormArgs {
  const void* residual = nullptr;  // AddNorm: (M, K) at x's pitch
  void* h_out = nullptr;           // AddNorm: x + residual, (M, K) dense
  const void* gamma = nullptr;     // (K), dense
  float weight_offset = 0.f, eps = 1e-6f;
};

// SiLU as act.cu computes it for a SwiGLU (the fast form for 16-bit outputs), so that the epilogue below gives what
// the GEMV followed by ops.swiglu gives.
template <typename T> __device__ __forceinline__ float silu_times(float g, float u) {
  if constexpr (sizeof(T) == 2) return u * __fdividef(g, 1.f + __expf(-g));
  return u * (g / (1.f + expf(-g)));
}

// SWIGLU: W is [gate | up] (N = 2I rows) and out (M, I) = swiglu(x @ Wᵀ): a block takes gate rows j, j + 1 and the
// up rows I + j, I + j + 1, so that its epilogue holds each pair it writes (both sums rounded to T first, as the
// unfused GEMV stores them).
template <typename T, int M, Prologue P, bool SWIGLU>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemmParams p, NormArgs norm) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int kSums = kRows * M + (P == Prologue::None ? 0 : M);  // the products, then each row's sum of x²
    __shared__ float partial[kThreads / 32][kSums];
    const int64_t half = p.n / 2, n0 = static_cast<int64_t>(blockIdx.x) * (SWIGLU ? 2 : kRows);
    const int rows = static_cast<int>(SWIGLU ? (half - n0 < 2 ? half - n0 : 2) : (p.n - n0 < kRows ? p.n - n0 : kRows));
    const int64_t nvec = p.k / VEC;
    const T* w = static_cast<const T*>(p.w);
    const T* x = static_cast<const T*>(p.x);
    const T* wrow[kRows];  // the block's weight rows; `live`: within the matrix
    bool live[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      live[r] = SWIGLU ? r % 2 < rows : r < rows;
      wrow[r] = w + (SWIGLU ? (r < 2 ? 0 : half) + n0 + r % 2 : n0 + r) * p.ldw;
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
      if constexpr (SWIGLU) {  // r: the pair; its gate sum in slot r, its up sum two rows on
        const float g = round_to<T>(total(threadIdx.x) * scale), u = round_to<T>(total((2 + r) * M + m) * scale);
        static_cast<T*>(p.out)[m * p.ldout + n] = from_float<T>(silu_times<T>(g, u));
      } else {
        float sum = total(threadIdx.x) * scale;
        if (p.bias) sum += to_float<T>(static_cast<const T*>(p.bias)[n]);
        if (p.residual) sum += to_float<T>(static_cast<const T*>(p.residual)[m * p.ldout + n]);
        static_cast<T*>(p.out)[m * p.ldout + n] = from_float<T>(sum);
      }
    }
  }
}

template <typename T, Prologue P, bool SWIGLU = false>
cudaError_t launch_gemv_typed(const GemmParams& p, const NormArgs& norm, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(SWIGLU ? (p.n / 2 + 1) / 2 : (p.n + kRows - 1) / kRows);
  switch (p.tokens) {
    case 1: gemv_kernel<T, 1, P, SWIGLU><<<blocks, kThreads, 0, stream>>>(p, norm); break;
    case 2: gemv_kernel<T, 2, P, SWIGLU><<<blocks, kThreads, 0, stream>>>(p, norm); break;
    case 3: gemv_kernel<T, 3, P, SWIGLU><<<blocks, kThreads, 0, stream>>>(p, norm); break;
    case 4: gemv_kernel<T, 4, P, SWIGLU><<<blocks, kThreads, 0, stream>>>(p, norm); break;
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
      return swiglu ? launch_gemv_typed<T, Prologue::AddNorm, true>(p, norm, stream)
                    : launch_gemv_typed<T, Prologue::AddNorm>(p, norm, stream);
    return swiglu ? launch_gemv_typed<T, Prologue::Norm, true>(p, norm, stream)
                  : launch_gemv_typed<T, Prologue::Norm>(p, norm, stream);
  });
}

}  // namespace ltxbench
