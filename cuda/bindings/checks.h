// What every bindings file shares: error formatting, the argument checks, row views of tensors and the checked
// launch. The files of cuda/bindings/ are the only ones that include torch, one per op family: each defines its
// schemas (TORCH_LIBRARY_FRAGMENT) and registers its entry points for CUDA and for CPU, where the first check
// names the argument that must be on CUDA (a clear error instead of "could not run with arguments from the CPU
// backend"). Each includes this header first: the define below keeps them on the per-op ATen headers
// (ATen/ops/<op>.h) rather than the whole of ATen. The build compiles them all as one translation unit (torch's
// headers parsed once: ltxbench/ops/build.py), so a name in one file's anonymous namespace must not repeat in
// another: each file registers through its own register_<file>.
#pragma once
#ifndef TORCH_ASSERT_ONLY_METHOD_OPERATORS
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#endif
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/params.h"
#include "common/source_use.h"

namespace ltxbench {

using at::Tensor;

// Numbers, shapes, devices and dtypes are formatted to strings here rather than streamed: an extension
// built by another compiler than torch's must not stream integers through torch's std::ostream
// (seen: a segfault in ostream::_M_insert<long> on the GPU image).
inline std::string num(int64_t v) { return std::to_string(v); }
inline std::string shape(at::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}
inline std::string dev(const Tensor& t) { return t.device().str(); }
inline const char* dtype_name(const Tensor& t) { return c10::toString(t.scalar_type()); }

inline DType dtype_of(const Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    default:
      TORCH_CHECK(false, "ltxbench.", op, ": ", name, " must be float32, float16 or bfloat16, got ", dtype_name(t));
  }
}

inline int compute_capability_major(int device) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

// The checks every op runs on its primary input: device, dtype, arch support.
inline DType check_primary(const Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.is_cuda(), "ltxbench.", op, ": ", name, " must be a CUDA tensor, got device ", dev(x));
  const DType dt = dtype_of(x, op, name);
  TORCH_CHECK(dt != DType::BF16 || compute_capability_major(x.get_device()) >= 8, "ltxbench.", op,
              ": bfloat16 needs compute capability >= 8.0 (Ampere); this GPU cannot run it, use float16");
  return dt;
}

// `t` (argument `name`) against the op's primary input `x` (argument `x_name`): same device and dtype.
inline void check_same(const Tensor& t, const Tensor& x, const char* op, const char* name, const char* x_name = "x") {
  TORCH_CHECK(t.device() == x.device(), "ltxbench.", op, ": ", name, " is on ", dev(t), " but ", x_name, " is on ",
              dev(x));
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "ltxbench.", op, ": ", name, " has dtype ", dtype_name(t), " but ",
              x_name, " has ", dtype_name(x), " (they must match)");
}

// check_same, and the same shape as x.
inline void check_like(const Tensor& t, const Tensor& x, const char* op, const char* name, const char* x_name) {
  check_same(t, x, op, name, x_name);
  TORCH_CHECK(t.sizes() == x.sizes(), "ltxbench.", op, ": ", name, " has shape ", shape(t.sizes()), " but ", x_name,
              " has ", shape(x.sizes()));
}

// A float32 table (cos, sin, grid, freqs) on x's device.
inline void check_f32_table(const Tensor& t, const Tensor& x, const char* op, const char* name,
                            const char* x_name = "q") {
  TORCH_CHECK(t.device() == x.device(), "ltxbench.", op, ": ", name, " is on ", dev(t), " but ", x_name, " is on ",
              dev(x));
  TORCH_CHECK(t.scalar_type() == at::kFloat, "ltxbench.", op, ": ", name, " must be float32, got ", dtype_name(t));
}

inline void check_3d(const Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.dim() == 3, "ltxbench.", op, ": ", name, " must be 3-D (B, S, D), got shape ", shape(x.sizes()));
}

inline void check_weight(const std::optional<Tensor>& w, const Tensor& x, int64_t D, const char* op) {
  if (!w) return;
  check_same(*w, x, op, "weight");
  TORCH_CHECK(w->dim() == 1 && w->size(0) == D, "ltxbench.", op, ": weight must have shape (", num(D), ",), got ",
              shape(w->sizes()));
}

// Last dim made contiguous explicitly where it is not; other strides are passed to the kernel.
inline Tensor unit_last_stride(const Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// (..., D) as a (1, N, D) row view: a view when the leading dims collapse, a copy otherwise.
// Size-1 dims get stride 0 so that their arbitrary strides never block the vectorized path.
inline int64_t row_stride(const Tensor& t, int dim) { return t.size(dim) == 1 ? 0 : t.stride(dim); }
inline Rows3 rows_of_flat(const Tensor& t2d) { return Rows3{t2d.data_ptr(), 0, row_stride(t2d, 0)}; }
inline Rows3 rows_of_3d(const Tensor& t) { return Rows3{t.data_ptr(), row_stride(t, 0), row_stride(t, 1)}; }

inline Tensor flat_rows(const Tensor& x) {
  Tensor r = x.reshape({-1, x.size(-1)});
  return unit_last_stride(r);
}

// A (B|1, S|1, D) modulation operand broadcast to x's (B, S, D) with stride 0 on size-1 dims.
inline Rows3 broadcast_rows(const Tensor& t, const Tensor& x, const char* op, const char* name, Tensor& keep,
                            const char* x_name = "x", bool float32_ok = false) {
  if (float32_ok && t.scalar_type() == at::kFloat) {  // float32 modulation over 16-bit rows (Wan's)
    TORCH_CHECK(t.device() == x.device(), "ltxbench.", op, ": ", name, " is on ", dev(t), " but ", x_name, " is on ",
                dev(x));
  } else {
    check_same(t, x, op, name, x_name);
  }
  const auto B = x.size(0), S = x.size(1), D = x.size(2);
  TORCH_CHECK(t.dim() == 3 && (t.size(0) == B || t.size(0) == 1) && (t.size(1) == S || t.size(1) == 1) &&
                  t.size(2) == D,
              "ltxbench.", op, ": ", name, " must have shape (B|1, S|1, D) = (", num(B), "|1, ", num(S), "|1, ", num(D),
              "), got ", shape(t.sizes()));
  keep = unit_last_stride(t).expand({B, S, D});
  return rows_of_3d(keep);
}

// launch(stream) on x's device and current stream; a failed launch is an error naming the op.
template <typename Launch>
void launch_checked(const Tensor& x, const char* op, Launch&& launch) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch(c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace ltxbench
