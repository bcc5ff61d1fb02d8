// The activations (act.cu): GELU-tanh, and the gated GEGLU and SwiGLU over the two halves of the last dim.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <vector>

namespace ltxbench {
namespace {

Tensor activation(const Tensor& x, bool gated, int64_t gate_half, int act, const char* op) {
  const DType dt = check_primary(x, op, "x");
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dimension");
  TORCH_CHECK(gate_half == 0 || gate_half == 1, "ltxbench.", op, ": gate_half must be 0 or 1, got ", num(gate_half));
  const int64_t width = x.size(-1);
  TORCH_CHECK(!gated || width % 2 == 0, "ltxbench.", op, ": the last dim of x must be even (value and gate halves), got ",
              num(width));
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = gated ? width / 2 : width;
  Tensor out = at::empty(out_shape, x.options());
  if (x.numel() == 0) return out;
  const Tensor rows = flat_rows(x);
  ActParams p;
  p.rows = rows.size(0), p.H = out_shape.back();
  p.x = rows.data_ptr(), p.row_stride = rows.size(0) == 1 ? 0 : rows.stride(0);
  p.gated = gated, p.gate_half = static_cast<int>(gate_half), p.act = act;
  p.out = out.data_ptr();
  launch_checked(x, op, [&](cudaStream_t stream) { return launch_act(p, dt, stream); });
  return out;
}

Tensor gelu_tanh(const Tensor& x) { NOTE_SOURCE_USED(); return activation(x, false, 1, 1, "gelu_tanh"); }
Tensor geglu(const Tensor& x, int64_t gate_half, bool approximate) {
  NOTE_SOURCE_USED();
  return activation(x, true, gate_half, approximate ? 1 : 0, "geglu");
}
Tensor swiglu(const Tensor& x, int64_t gate_half) {
  NOTE_SOURCE_USED();
  return activation(x, true, gate_half, 2, "swiglu");
}

void register_act(torch::Library& m) {
  m.impl("gelu_tanh", &gelu_tanh);
  m.impl("geglu", &geglu);
  m.impl("swiglu", &swiglu);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def("gelu_tanh(Tensor x) -> Tensor");
  m.def("geglu(Tensor x, int gate_half=1, bool approximate=False) -> Tensor");
  m.def("swiglu(Tensor x, int gate_half=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_act(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_act(m); }
