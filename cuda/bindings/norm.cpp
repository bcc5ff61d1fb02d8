// The row ops (norm.cu, norm_lean.cu): RMSNorm, the fused residual add, AdaLN modulation and the gated residual.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <initializer_list>
#include <optional>
#include <tuple>

#include "bindings/norm.h"

namespace ltxbench {

Modulated modulated(const Tensor& x_in, const Tensor& scale, const Tensor& shift, double eps, const char* op,
                    const char* x_name, bool allocate_out, bool float32_ok) {
  check_3d(x_in, op, x_name);
  Modulated m;
  m.x = unit_last_stride(x_in);
  m.p.B = m.x.size(0), m.p.S = m.x.size(1), m.p.D = m.x.size(2);
  m.p.x = rows_of_3d(m.x);
  m.p.scale = broadcast_rows(scale, m.x, op, "scale", m.scale, x_name, float32_ok);
  m.p.shift = broadcast_rows(shift, m.x, op, "shift", m.shift, x_name, float32_ok);
  m.p.eps = static_cast<float>(eps);
  if (allocate_out) {  // the FP8 ops write q instead
    m.out = at::empty(m.x.sizes(), m.x.options());
    m.p.out = m.out.data_ptr();
  }
  return m;
}

Tensor attach_branch(RowOpParams& p, const Tensor& h, const Tensor& a, const std::optional<Tensor>& gate,
                     const char* op, Tensor& gate_keep, bool float32_gate) {
  check_like(a, h, op, "a", "h");
  Tensor ar = unit_last_stride(a);
  p.a = rows_of_3d(ar);
  if (gate) p.gate = broadcast_rows(*gate, h, op, "gate", gate_keep, "h", float32_gate);
  return ar;
}

namespace {

void run(const RowOpParams& p, DType dt, const Tensor& x, const char* op) {
  launch_checked(x, op, [&](cudaStream_t stream) { return launch_row_op(p, dt, stream); });
}

// weight_offset (Gemma's 1 + weight, added in fp32 as the kernel reads the weight): a weight to offset, and the
// fp32 product (cast_before_weight rounds before the weight: not Gemma's order).
void check_offset(double weight_offset, const std::optional<Tensor>& weight, bool cast_before_weight, const char* op) {
  if (weight_offset == 0) return;
  TORCH_CHECK(weight.has_value(), "ltxbench.", op, ": weight_offset needs a weight");
  TORCH_CHECK(!cast_before_weight, "ltxbench.", op, ": weight_offset multiplies in fp32: cast_before_weight must be "
              "False");
}

Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, double eps, bool cast_before_weight,
                double weight_offset) {
  NOTE_SOURCE_USED();
  const char* op = "rms_norm";
  const DType dt = check_primary(x, op, "x");
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dimension");
  const auto D = x.size(-1);
  check_weight(weight, x, D, op);
  check_offset(weight_offset, weight, cast_before_weight, op);
  Tensor out = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return out;
  const Tensor w = weight ? weight->contiguous() : Tensor();
  const Tensor xr = flat_rows(x);
  RowOpParams p;
  p.B = 1, p.S = xr.size(0), p.D = D;
  p.x = rows_of_flat(xr);
  p.weight = weight ? w.data_ptr() : nullptr;
  p.cast_before_weight = cast_before_weight;
  p.weight_offset = static_cast<float>(weight_offset);
  p.norm = NormKind::RMS, p.eps = static_cast<float>(eps);
  p.out = out.data_ptr();
  run(p, dt, x, op);
  return out;
}

std::tuple<Tensor, Tensor> fused_add_rms_norm(const Tensor& x, const Tensor& residual,
                                              const std::optional<Tensor>& weight, double eps,
                                              bool cast_before_weight, double weight_offset) {
  NOTE_SOURCE_USED();
  const char* op = "fused_add_rms_norm";
  const DType dt = check_primary(x, op, "x");
  check_like(residual, x, op, "residual", "x");
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dimension");
  const auto D = x.size(-1);
  check_weight(weight, x, D, op);
  check_offset(weight_offset, weight, cast_before_weight, op);
  Tensor out = at::empty(x.sizes(), x.options());
  Tensor residual_out = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return {out, residual_out};
  const Tensor w = weight ? weight->contiguous() : Tensor();
  const Tensor xr = flat_rows(x), rr = flat_rows(residual);
  RowOpParams p;
  p.B = 1, p.S = xr.size(0), p.D = D;
  p.x = rows_of_flat(rr);  // h = residual + x
  p.a = rows_of_flat(xr);
  p.weight = weight ? w.data_ptr() : nullptr;
  p.cast_before_weight = cast_before_weight;
  p.weight_offset = static_cast<float>(weight_offset);
  p.norm = NormKind::RMS, p.eps = static_cast<float>(eps);
  p.out = out.data_ptr(), p.h_out = residual_out.data_ptr();
  run(p, dt, x, op);
  return {out, residual_out};
}

Tensor rms_norm_modulate(const Tensor& x, const std::optional<Tensor>& weight, const Tensor& scale,
                         const Tensor& shift, double eps) {
  NOTE_SOURCE_USED();
  const char* op = "rms_norm_modulate";
  const DType dt = check_primary(x, op, "x");
  Modulated m = modulated(x, scale, shift, eps, op);
  check_weight(weight, x, m.p.D, op);
  const Tensor w = weight ? weight->contiguous() : Tensor();
  m.p.weight = weight ? w.data_ptr() : nullptr;
  m.p.norm = NormKind::RMS;
  run(m.p, dt, x, op);
  return m.out;
}

// Float32 modulation over 16-bit rows (Wan keeps its AdaLN in float32 and rounds once): every modulation operand
// float32, rows within the kernel's width. Else the operands share x's dtype (checked where they are read).
bool float32_modulation(const Tensor& x, std::initializer_list<const Tensor*> modulation, const char* op) {
  if (x.scalar_type() == at::kFloat || modulation.begin()[0]->scalar_type() != at::kFloat) return false;
  for (const Tensor* t : modulation) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "ltxbench.", op, ": the modulation is float32 or ", dtype_name(x),
                " throughout, got ", dtype_name(*modulation.begin()[0]), " and ", dtype_name(*t));
  }
  TORCH_CHECK(x.dim() < 1 || x.size(-1) <= kMaxF32ModulationRow, "ltxbench.", op, ": float32 modulation takes rows of ",
              "at most ", num(kMaxF32ModulationRow), " values, got ", num(x.size(-1)));
  return true;
}

void run_f32_modulation(const RowOpParams& p, DType dt, const Tensor& x, const char* op) {
  launch_checked(x, op, [&](cudaStream_t stream) { return launch_row_op_f32_modulation(p, dt, stream); });
}

Tensor layer_norm_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, double eps) {
  NOTE_SOURCE_USED();
  const char* op = "layer_norm_modulate";
  const DType dt = check_primary(x, op, "x");
  const bool f32 = float32_modulation(x, {&scale, &shift}, op);
  Modulated m = modulated(x, scale, shift, eps, op, "x", true, f32);
  m.p.norm = NormKind::Layer;
  if (f32) run_f32_modulation(m.p, dt, x, op);
  else run(m.p, dt, x, op);
  return m.out;
}

Tensor gated_residual(const Tensor& h_in, const Tensor& a, const Tensor& gate) {
  NOTE_SOURCE_USED();
  const char* op = "gated_residual";
  const DType dt = check_primary(h_in, op, "h");
  check_3d(h_in, op, "h");
  const bool f32 = float32_modulation(h_in, {&gate}, op);
  const Tensor h = unit_last_stride(h_in);
  RowOpParams p;
  p.B = h.size(0), p.S = h.size(1), p.D = h.size(2);
  p.x = rows_of_3d(h);
  Tensor gate_keep;
  const Tensor ar = attach_branch(p, h, a, gate, op, gate_keep, f32);
  Tensor out = at::empty(h.sizes(), h.options());
  p.norm = NormKind::None;
  p.out = out.data_ptr();
  if (f32) run_f32_modulation(p, dt, h, op);
  else run(p, dt, h, op);
  return out;
}

std::tuple<Tensor, Tensor> add_rms_norm_modulate(const Tensor& h, const Tensor& a,
                                                 const std::optional<Tensor>& gate, const Tensor& scale,
                                                 const Tensor& shift, double eps) {
  NOTE_SOURCE_USED();
  const char* op = "add_rms_norm_modulate";
  const DType dt = check_primary(h, op, "h");
  Modulated m = modulated(h, scale, shift, eps, op, "h");
  Tensor gate_keep;
  const Tensor ar = attach_branch(m.p, m.x, a, gate, op, gate_keep);
  Tensor h_out = at::empty(m.x.sizes(), m.x.options());
  m.p.norm = NormKind::RMS;
  m.p.h_out = h_out.data_ptr();
  run(m.p, dt, h, op);
  return {m.out, h_out};
}

void register_norm(torch::Library& m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("rms_norm_modulate", &rms_norm_modulate);
  m.impl("layer_norm_modulate", &layer_norm_modulate);
  m.impl("gated_residual", &gated_residual);
  m.impl("add_rms_norm_modulate", &add_rms_norm_modulate);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def(
      "rms_norm(Tensor x, Tensor? weight, float eps, bool cast_before_weight=False, float weight_offset=0.)"
      " -> Tensor");
  m.def(
      "fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps, bool cast_before_weight=False,"
      " float weight_offset=0.) -> (Tensor, Tensor)");
  m.def("rms_norm_modulate(Tensor x, Tensor? weight, Tensor scale, Tensor shift, float eps) -> Tensor");
  m.def("layer_norm_modulate(Tensor x, Tensor scale, Tensor shift, float eps) -> Tensor");
  m.def("gated_residual(Tensor h, Tensor a, Tensor gate) -> Tensor");
  m.def(
      "add_rms_norm_modulate(Tensor h, Tensor a, Tensor? gate, Tensor scale, Tensor shift, float eps)"
      " -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_norm(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_norm(m); }
