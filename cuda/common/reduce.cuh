// Sum reductions over the `tpr` threads that share one row: a power of two up to 32, else a multiple of 32.
#pragma once

namespace ltxbench {

// Reduces N values at once (one pair of barriers whatever N is). Rows handled by one block never share
// a warp unless tpr <= 32, where xor-shuffles with offsets < tpr stay inside the row's aligned lane group.
// smem must hold [rows_per_block][32][N] floats when tpr > 32.
template <int N> __device__ __forceinline__ void row_group_sum(float (&v)[N], int tpr, float* smem) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width >> 1; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  if (tpr <= 32) return;
  const int lane = threadIdx.x & 31;
  const int row_in_block = threadIdx.x / tpr;
  const int warp_in_row = (threadIdx.x % tpr) >> 5;
  const int warps_per_row = tpr >> 5;
  float* slots = smem + row_in_block * 32 * N;
  __syncthreads();  // slots may still be read from a previous reduction
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) slots[warp_in_row * N + k] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = 0.f;
  for (int w = 0; w < warps_per_row; ++w) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += slots[w * N + k];
  }
}

}  // namespace ltxbench
