// Sum reductions over the `tpr` threads that share one row (tpr is a power of two, 1..1024).
#pragma once

namespace ltxbench {

// Rows handled by one block never share a warp unless tpr <= 32, where xor-shuffles with offsets < tpr
// stay inside the row's aligned lane group.
__device__ __forceinline__ float row_group_sum(float v, int tpr, float* smem /* [rows_per_block][32] */) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (tpr <= 32) return v;
  const int lane = threadIdx.x & 31;
  const int row_in_block = threadIdx.x / tpr;
  const int warp_in_row = (threadIdx.x % tpr) >> 5;
  const int warps_per_row = tpr >> 5;
  float* slots = smem + row_in_block * 32;
  __syncthreads();  // slots may still be read from a previous reduction
  if (lane == 0) slots[warp_in_row] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps_per_row; ++w) total += slots[w];
  return total;
}

}  // namespace ltxbench
