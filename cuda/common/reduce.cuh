// Reductions over the `tpr` threads that share one row: a power of two up to 32, else a multiple of 32.
#pragma once

namespace ltxbench {

// 1 / n rounded to float once, on the host, so that a row's mean is one multiply instead of a division.
inline float inverse_count(int64_t n) { return static_cast<float>(1.0 / static_cast<double>(n)); }

// Sums of N floats over aligned groups of `width` lanes (a power of two up to 32), by xor butterfly: every lane
// of a group ends with the same bits.
template <int N> __device__ __forceinline__ void lane_group_sum(float (&v)[N], int width) {
  for (int off = width >> 1; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
}

// Sums of N floats over a whole warp; every lane ends with the sums.
template <int N> __device__ __forceinline__ void warp_sum(float (&v)[N]) { lane_group_sum<N>(v, 32); }

// Sums of N values over a row's threads (one pair of barriers whatever N); every thread of the row ends with
// the sums. Rows handled by one block never share a warp unless tpr <= 32, where xor-shuffles with offsets
// < tpr stay inside the row's aligned lane group. smem must hold [rows_per_block][32][N] floats when tpr > 32.
template <int N> __device__ __forceinline__ void row_group_sum(float (&v)[N], int tpr, float* smem) {
  lane_group_sum<N>(v, tpr < 32 ? tpr : 32);
  if (tpr <= 32) return;
  float* slots = smem + (threadIdx.x / tpr) * 32 * N;
  __syncthreads();  // slots may still be read from a previous reduction
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) slots[((threadIdx.x % tpr) >> 5) * N + k] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = slots[k];
  for (int w = 1; w < (tpr >> 5); ++w) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += slots[w * N + k];
  }
}

}  // namespace ltxbench
