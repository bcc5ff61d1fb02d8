// Helpers shared by the RoPE kernels (rope_3d.cu, rope_split.cu, rope_1d.cu): row addressing, the parts of a
// packed q/k/v output, the alignment tests that pick the 16-byte path, and the grid-stride grid size.
#pragma once
#include <cstdint>

#include "device.h"
#include "params.h"

namespace ltxbench {

constexpr int kBlockThreads = 256;
constexpr int kMaxRowThreads = 512;

template <typename T> __device__ __forceinline__ const T* at_row(const Rows3& r, int64_t b, int64_t s) {
  return static_cast<const T*>(r.ptr) + b * r.sb + s * r.ss;
}

// Part `part` of the packed output: at a pointer of its own, or after the parts before it in one buffer.
template <typename T>
__device__ __forceinline__ T* packed_part(void* packed, void* const* part_out, int64_t part, int64_t size) {
  return part_out[0] != nullptr ? static_cast<T*>(part_out[part]) : static_cast<T*>(packed) + part * size;
}

inline bool aligned16(const void* ptr) { return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
inline bool rows_aligned(const Rows3& r, int v) { return aligned16(r.ptr) && r.sb % v == 0 && r.ss % v == 0; }
// Every part of a packed output 16-byte aligned (a part at a pointer of its own may start anywhere).
inline bool parts_aligned16(const void* packed, void* const* part_out) {
  for (int r = 0; r < kMaxPackParts; ++r)
    if (!aligned16(part_out[r])) return false;
  return aligned16(packed);
}

// Blocks of kBlockThreads for `total` grid-stride items: enough for one item each, at most 16 per SM.
inline int grid_for(int64_t total) {
  const int64_t wanted = (total + kBlockThreads - 1) / kBlockThreads;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 16;
  return static_cast<int>(wanted < cap ? wanted : cap);
}

}  // namespace ltxbench
