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

// Count, mean and sum of squared deviations of one row, merged over its `tpr` threads (Chan et al.'s pairwise
// update: exact in the counts, no E[x²] - E[x]² cancellation). Every thread of the row ends with the row's
// values. smem must hold [rows_per_block][32][3] floats when tpr > 32.
struct MeanM2 {
  float n = 0.f, mean = 0.f, m2 = 0.f;
};

// The weight b.n / n by __fdividef (2 ulp): the counts are small exact integers, and the IEEE division's
// longer dependent chain, ten times per row, cost the modulated LayerNorm 6% on the H200 (2x8064x2048).
__device__ __forceinline__ MeanM2 merge(const MeanM2& a, const MeanM2& b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float delta = b.mean - a.mean, wb = __fdividef(b.n, n);
  return MeanM2{n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

__device__ __forceinline__ MeanM2 row_group_mean_m2(MeanM2 v, int tpr, float* smem) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width >> 1; off > 0; off >>= 1) {
    const MeanM2 o{__shfl_xor_sync(0xffffffffu, v.n, off), __shfl_xor_sync(0xffffffffu, v.mean, off),
                   __shfl_xor_sync(0xffffffffu, v.m2, off)};
    v = merge(v, o);
  }
  if (tpr <= 32) return v;
  const int lane = threadIdx.x & 31;
  const int row_in_block = threadIdx.x / tpr;
  const int warp_in_row = (threadIdx.x % tpr) >> 5;
  float* slots = smem + row_in_block * 32 * 3;
  __syncthreads();  // slots may still be read from a previous reduction
  if (lane == 0) {
    slots[warp_in_row * 3] = v.n;
    slots[warp_in_row * 3 + 1] = v.mean;
    slots[warp_in_row * 3 + 2] = v.m2;
  }
  __syncthreads();
  MeanM2 acc;
  for (int w = 0; w < (tpr >> 5); ++w) acc = merge(acc, MeanM2{slots[w * 3], slots[w * 3 + 1], slots[w * 3 + 2]});
  return acc;
}

}  // namespace ltxbench
