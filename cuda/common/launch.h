// Host-side launch geometry shared by the row kernels (norm.cu, rope_3d.cu, rope_split.cu). Plain C++.
#pragma once
#include <cstdint>

namespace ltxbench {

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Threads that share a row of `per_row` work items. Up to a warp: a power of two (the shuffle groups must tile
// the warp); beyond: whole warps, so that every thread holds its share, e.g. 96 threads for 96 items, not 128.
inline int threads_per_row(int64_t per_row) {
  return per_row <= 32 ? next_pow2(per_row) : static_cast<int>((per_row + 31) / 32 * 32);
}

}  // namespace ltxbench
