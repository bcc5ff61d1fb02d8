// Launch parameters shared by bindings.cpp (which includes torch) and the .cu files (which do not).
// Plain C++ and the CUDA runtime API only: keeps nvcc translation units free of torch headers.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace ltxbench {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };
enum class NormKind : int { None = 0, RMS = 1, Layer = 2 };

// A (B, S, D) operand whose last dim is contiguous; sb/ss are element strides of B and S.
// Stride 0 broadcasts (e.g. a per-batch (B, 1, D) modulation tensor expanded over S).
struct Rows3 {
  const void* ptr = nullptr;
  int64_t sb = 0;
  int64_t ss = 0;
};

// One row-wise op covers the whole normalization family:
//   h   = x + a * gate        (a, gate optional; no gate means h = x + a)
//   n   = norm(h)             (RMS or no-affine LayerNorm in fp32; NormKind::None means n = h)
//   n   = n * weight          (optional; cast_before_weight rounds n to the input dtype first)
//   out = n * (1 + scale) + shift   (optional modulation)
// out is written contiguous (B, S, D); h_out (optional) receives h rounded to the input dtype.
struct RowOpParams {
  int64_t B = 0, S = 0, D = 0;
  Rows3 x, a, gate, scale, shift;
  const void* weight = nullptr;
  bool cast_before_weight = false;
  NormKind norm = NormKind::RMS;
  float eps = 1e-6f;
  void* out = nullptr;
  void* h_out = nullptr;
};

cudaError_t launch_row_op(const RowOpParams& p, DType dtype, cudaStream_t stream);

}  // namespace ltxbench
