// linear for a few rows (an LLM's decode step: one token a sequence): out (M, N) = x (M, K) @ W (N, K)ᵀ [+ bias]
// [+ residual], M <= kGemvMaxRows, fp32 sums rounded once, on linear's GemmParams (M = tokens, N = n, K = k). Such a
// product reads every weight once and does two FLOPs per weight read, so it is bound by memory bandwidth alone; the
// goal is to keep HBM busy.
//
// One block of kThreads threads per kRows output rows: each thread streams 16-byte vectors of the kRows weight rows
// along K (kRows loads in flight, unrolled twice more), multiplies them with the same vectors of every x row (x is a
// few KB: L1 and L2 serve it), and the block sums the partial products (warp shuffles, then shared memory). Many small
// blocks (N / kRows) keep every SM loaded even at N = 1024.
#include "common/dtype.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/source_use.h"

namespace ltxbench {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 4;  // weight rows a block computes

template <typename T, int M>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemmParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ float partial[kThreads / 32][kRows * M];
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
    const int rows = static_cast<int>(p.n - n0 < kRows ? p.n - n0 : kRows);
    const int64_t nvec = p.k / VEC;
    const T* w = static_cast<const T*>(p.w) + n0 * p.ldw;
    const T* x = static_cast<const T*>(p.x);

    float acc[kRows][M] = {};
#pragma unroll 2
    for (int64_t j = threadIdx.x; j < nvec; j += kThreads) {
      Vec<T, VEC> wr[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {  // every weight load of the step issued before any arithmetic
        if (r < rows) wr[r] = load_raw<T, VEC>(w + r * p.ldw + j * VEC);
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[VEC];
        widen<T, VEC>(load_raw<T, VEC>(x + m * p.ldx + j * VEC), xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r >= rows) continue;
          float wf[VEC];
          widen<T, VEC>(wr[r], wf);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[r][m] = fmaf(wf[e], xv[e], acc[r][m]);
        }
      }
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float v = acc[r][m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) partial[warp][r * M + m] = v;
      }
    }
    __syncthreads();
    if (threadIdx.x < rows * M) {  // one thread per output: the warps' sums, the bias, the residual, one rounding
      const int r = threadIdx.x / M, m = threadIdx.x % M;
      float sum = 0.f;
#pragma unroll
      for (int g = 0; g < kThreads / 32; ++g) sum += partial[g][threadIdx.x];
      const int64_t n = n0 + r;
      if (p.bias) sum += to_float<T>(static_cast<const T*>(p.bias)[n]);
      if (p.residual) sum += to_float<T>(static_cast<const T*>(p.residual)[m * p.ldout + n]);
      static_cast<T*>(p.out)[m * p.ldout + n] = from_float<T>(sum);
    }
  }
}

template <typename T> cudaError_t launch_gemv_typed(const GemmParams& p, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((p.n + kRows - 1) / kRows);
  switch (p.tokens) {
    case 1: gemv_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(p); break;
    case 2: gemv_kernel<T, 2><<<blocks, kThreads, 0, stream>>>(p); break;
    case 3: gemv_kernel<T, 3><<<blocks, kThreads, 0, stream>>>(p); break;
    case 4: gemv_kernel<T, 4><<<blocks, kThreads, 0, stream>>>(p); break;
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
  return dispatch_dtype(dtype, [&](auto tag) { return launch_gemv_typed<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
