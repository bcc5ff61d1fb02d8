// The FP8 (e4m3) outputs (fp8.cu, and rope_3d.cu for the q/k norm + RoPE): one float32 scale per row for the
// GEMM inputs, one per (batch, head) for FlashAttention-3's FP8 inputs.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <climits>
#include <optional>
#include <tuple>
#include <vector>

#include "bindings/norm.h"
#include "bindings/rope.h"

namespace ltxbench {
namespace {

// ---- per-row scales -------------------------------------------------------------------------------------

// q: a fresh contiguous float8_e4m3fn tensor of x's shape; x_scale: float32 (..., 1), one scale per row.
std::tuple<Tensor, Tensor> run_fp8(Fp8Params& p, DType dt, const Tensor& x, const char* op) {
  TORCH_CHECK(p.rows.B * p.rows.S <= INT32_MAX, "ltxbench.", op, ": at most 2^31 - 1 rows, got ",
              num(p.rows.B * p.rows.S));
  std::vector<int64_t> scale_shape(x.sizes().begin(), x.sizes().end());
  scale_shape.back() = 1;
  Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  Tensor x_scale = at::empty(scale_shape, x.options().dtype(at::kFloat));
  p.q = q.data_ptr(), p.x_scale = x_scale.data_ptr<float>();
  launch_checked(x, op, [&](cudaStream_t stream) { return launch_fp8_rows(p, dt, stream); });
  return {q, x_scale};
}

std::tuple<Tensor, Tensor> rms_norm_modulate_fp8(const Tensor& x, const std::optional<Tensor>& weight,
                                                 const Tensor& scale, const Tensor& shift, double eps) {
  NOTE_SOURCE_USED();
  const char* op = "rms_norm_modulate_fp8";
  const DType dt = check_primary(x, op, "x");
  Modulated m = modulated(x, scale, shift, eps, op, "x", false);
  check_weight(weight, x, m.p.D, op);
  const Tensor w = weight ? weight->contiguous() : Tensor();
  m.p.weight = weight ? w.data_ptr() : nullptr;
  Fp8Params p;
  p.op = Fp8Op::RmsNormModulate, p.rows = m.p;
  return run_fp8(p, dt, m.x, op);
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_modulate_fp8(const Tensor& h, const Tensor& a,
                                                             const std::optional<Tensor>& gate, const Tensor& scale,
                                                             const Tensor& shift, double eps) {
  NOTE_SOURCE_USED();
  const char* op = "add_rms_norm_modulate_fp8";
  const DType dt = check_primary(h, op, "h");
  Modulated m = modulated(h, scale, shift, eps, op, "h", false);
  Tensor gate_keep;
  const Tensor ar = attach_branch(m.p, m.x, a, gate, op, gate_keep);
  Tensor h_out = at::empty(m.x.sizes(), m.x.options());
  m.p.h_out = h_out.data_ptr();
  Fp8Params p;
  p.op = Fp8Op::RmsNormModulate, p.rows = m.p;
  auto [q, x_scale] = run_fp8(p, dt, m.x, op);
  return {q, x_scale, h_out};
}

// x (..., D) with any leading dims, as rows.
std::tuple<Tensor, Tensor> fp8_of_rows(const Tensor& x, Fp8Op kind, const char* op) {
  const DType dt = check_primary(x, op, "x");
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dimension");
  Fp8Params p;
  p.op = kind;
  p.rows.B = 1, p.rows.D = x.size(-1);
  p.rows.S = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) p.rows.S *= x.size(i);
  Tensor rows;  // rows of width 0 have no data, only their scales to write
  if (x.numel() > 0) {
    rows = flat_rows(x);
    p.rows.x = rows_of_flat(rows);
  }
  return run_fp8(p, dt, x, op);
}

std::tuple<Tensor, Tensor> gelu_tanh_fp8(const Tensor& x) {
  NOTE_SOURCE_USED();
  return fp8_of_rows(x, Fp8Op::GeluTanh, "gelu_tanh_fp8");
}
std::tuple<Tensor, Tensor> quantize_fp8(const Tensor& x) {
  NOTE_SOURCE_USED();
  return fp8_of_rows(x, Fp8Op::Quantize, "quantize_fp8");
}

// ---- per-(batch, head) scales: FlashAttention-3's FP8 inputs ----------------------------------------------

void check_heads(int64_t D, int64_t heads, const char* op) {
  TORCH_CHECK(heads >= 1 && D % heads == 0, "ltxbench.", op, ": heads must be >= 1 and divide the inner dim ",
              num(D), ", got ", num(heads));
}

// (q, q_descale (B, heads), k, k_descale): qk_rms_norm_rope written as e4m3 with per-head power-of-two scales from
// the norm weights (Rope3dParams, FP8 outputs).
std::tuple<Tensor, Tensor, Tensor, Tensor> qk_rms_norm_rope_fp8(const Tensor& q, const Tensor& k, const Tensor& wq,
                                                                const Tensor& wk, double eps, int64_t heads,
                                                                const std::optional<Tensor>& cos,
                                                                const std::optional<Tensor>& sin,
                                                                const std::optional<Tensor>& grid,
                                                                const std::optional<Tensor>& freqs) {
  NOTE_SOURCE_USED();
  const char* op = "qk_rms_norm_rope_fp8";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  check_heads(p.D, heads, op);
  TORCH_CHECK((p.D / heads) % 2 == 0, "ltxbench.", op, ": the head dim D / heads must be even (RoPE pairs), got ",
              num(p.D / heads));
  p.heads = heads;
  const Fp8QkOutputs o = fp8_qk_outputs(p, q, heads);
  launch_3d_checked(p, dt, q, op);
  return {o.q, o.q_descale, o.k, o.k_descale};
}

// (q, descale (B, heads)): x (B, S, D) in e4m3, one power-of-two scale per (batch, head) from its amax.
std::tuple<Tensor, Tensor> quantize_fp8_heads(const Tensor& x, int64_t heads) {
  NOTE_SOURCE_USED();
  const char* op = "quantize_fp8_heads";
  const DType dt = check_primary(x, op, "x");
  check_3d(x, op, "x");
  check_heads(x.size(2), heads, op);
  TORCH_CHECK(heads <= 8192, "ltxbench.", op, ": heads must be <= 8192 (one scale each in shared memory), got ",
              num(heads));
  const Tensor rows = unit_last_stride(x);
  Fp8HeadsParams p;
  p.B = x.size(0), p.S = x.size(1), p.H = heads, p.hd = x.size(2) / heads;
  p.x = rows_of_3d(rows);
  Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  Tensor descale = at::empty({p.B, heads}, x.options().dtype(at::kFloat));
  Tensor amax = at::empty({p.B, heads}, x.options().dtype(at::kInt));
  p.q = q.data_ptr(), p.descale = descale.data_ptr<float>();
  p.amax = reinterpret_cast<unsigned*>(amax.data_ptr<int32_t>());
  launch_checked(x, op, [&](cudaStream_t stream) { return launch_fp8_heads(p, dt, stream); });
  return {q, descale};
}

void register_fp8(torch::Library& m) {
  m.impl("rms_norm_modulate_fp8", &rms_norm_modulate_fp8);
  m.impl("add_rms_norm_modulate_fp8", &add_rms_norm_modulate_fp8);
  m.impl("gelu_tanh_fp8", &gelu_tanh_fp8);
  m.impl("quantize_fp8", &quantize_fp8);
  m.impl("qk_rms_norm_rope_fp8", &qk_rms_norm_rope_fp8);
  m.impl("quantize_fp8_heads", &quantize_fp8_heads);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  // FP8 (e4m3) outputs with one float32 scale per row: (q, x_scale (..., 1)[, h'])
  m.def("rms_norm_modulate_fp8(Tensor x, Tensor? weight, Tensor scale, Tensor shift, float eps) -> (Tensor, Tensor)");
  m.def(
      "add_rms_norm_modulate_fp8(Tensor h, Tensor a, Tensor? gate, Tensor scale, Tensor shift, float eps)"
      " -> (Tensor, Tensor, Tensor)");
  m.def("gelu_tanh_fp8(Tensor x) -> (Tensor, Tensor)");
  m.def("quantize_fp8(Tensor x) -> (Tensor, Tensor)");
  // FP8 (e4m3) with one float32 descale per (batch, head), FlashAttention-3's FP8 inputs
  m.def(
      "qk_rms_norm_rope_fp8(Tensor q, Tensor k, Tensor wq, Tensor wk, float eps, int heads, Tensor? cos, Tensor? sin,"
      " Tensor? grid, Tensor? freqs) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("quantize_fp8_heads(Tensor x, int heads) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_fp8(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_fp8(m); }
