// The device facts the launchers size their grids by. Plain C++ over the CUDA runtime.
#pragma once
#include <atomic>

#include <cuda_runtime.h>

namespace ltxbench {

// Streaming multiprocessors of the current device, asked once per device (an attribute query on every launch
// costs a driver call); 132 (an H100's) where the runtime cannot say, which only sizes grids.
inline int multiprocessor_count() {
  constexpr int kMaxDevices = 64, kUnknown = 132;
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return kUnknown;
  int count = counts[device].load(std::memory_order_relaxed);
  if (count <= 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0)
      return kUnknown;
    counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

}  // namespace ltxbench
