// The only translation unit that includes torch: op schemas, argument checks and CUDA dispatch.
// Kernels live in plain .cu files behind the launch functions declared in common/params.h.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "common/params.h"

namespace ltxbench {
namespace {

using at::Tensor;

// Numbers, shapes, devices and dtypes are formatted to strings here rather than streamed: an extension
// built by another compiler than torch's must not stream integers through torch's std::ostream
// (seen: a segfault in ostream::_M_insert<long> on the GPU image).
std::string num(int64_t v) { return std::to_string(v); }
std::string shape(at::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}
std::string dev(const Tensor& t) { return t.device().str(); }
const char* dtype_name(const Tensor& t) { return c10::toString(t.scalar_type()); }

DType dtype_of(const Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    default:
      TORCH_CHECK(false, "ltxbench.", op, ": ", name, " must be float32, float16 or bfloat16, got ", dtype_name(t));
  }
}

int compute_capability_major(int device) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

// The checks every op runs on its primary input: device, dtype, arch support.
DType check_primary(const Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.is_cuda(), "ltxbench.", op, ": ", name, " must be a CUDA tensor, got device ", dev(x));
  const DType dt = dtype_of(x, op, name);
  TORCH_CHECK(dt != DType::BF16 || compute_capability_major(x.get_device()) >= 8, "ltxbench.", op,
              ": bfloat16 needs compute capability >= 8.0 (Ampere); this GPU cannot run it, use float16");
  return dt;
}

// `t` (argument `name`) against the op's primary input `x` (argument `x_name`): same device and dtype.
void check_same(const Tensor& t, const Tensor& x, const char* op, const char* name, const char* x_name = "x") {
  TORCH_CHECK(t.device() == x.device(), "ltxbench.", op, ": ", name, " is on ", dev(t), " but ", x_name, " is on ",
              dev(x));
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "ltxbench.", op, ": ", name, " has dtype ", dtype_name(t), " but ",
              x_name, " has ", dtype_name(x), " (they must match)");
}

// Last dim made contiguous explicitly where it is not; other strides are passed to the kernel.
Tensor unit_last_stride(const Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// (..., D) as a (1, N, D) row view: a view when the leading dims collapse, a copy otherwise.
// Size-1 dims get stride 0 so that their arbitrary strides never block the vectorized path.
int64_t row_stride(const Tensor& t, int dim) { return t.size(dim) == 1 ? 0 : t.stride(dim); }
Rows3 rows_of_flat(const Tensor& t2d) { return Rows3{t2d.data_ptr(), 0, row_stride(t2d, 0)}; }
Rows3 rows_of_3d(const Tensor& t) { return Rows3{t.data_ptr(), row_stride(t, 0), row_stride(t, 1)}; }

Tensor flat_rows(const Tensor& x) {
  Tensor r = x.reshape({-1, x.size(-1)});
  return unit_last_stride(r);
}

// A (B|1, S|1, D) modulation operand broadcast to x's (B, S, D) with stride 0 on size-1 dims.
Rows3 broadcast_rows(const Tensor& t, const Tensor& x, const char* op, const char* name, Tensor& keep,
                     const char* x_name = "x") {
  check_same(t, x, op, name, x_name);
  const auto B = x.size(0), S = x.size(1), D = x.size(2);
  TORCH_CHECK(t.dim() == 3 && (t.size(0) == B || t.size(0) == 1) && (t.size(1) == S || t.size(1) == 1) &&
                  t.size(2) == D,
              "ltxbench.", op, ": ", name, " must have shape (B|1, S|1, D) = (", num(B), "|1, ", num(S), "|1, ", num(D),
              "), got ", shape(t.sizes()));
  keep = unit_last_stride(t).expand({B, S, D});
  return rows_of_3d(keep);
}

void check_weight(const std::optional<Tensor>& w, const Tensor& x, int64_t D, const char* op) {
  if (!w) return;
  check_same(*w, x, op, "weight");
  TORCH_CHECK(w->dim() == 1 && w->size(0) == D, "ltxbench.", op, ": weight must have shape (", num(D), ",), got ",
              shape(w->sizes()));
}

void check_3d(const Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.dim() == 3, "ltxbench.", op, ": ", name, " must be 3-D (B, S, D), got shape ", shape(x.sizes()));
}

void run(const RowOpParams& p, DType dt, const Tensor& x, const char* op) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch_row_op(p, dt, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
}

Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, double eps, bool cast_before_weight) {
  const char* op = "rms_norm";
  const DType dt = check_primary(x, op, "x");
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dimension");
  const auto D = x.size(-1);
  check_weight(weight, x, D, op);
  Tensor out = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return out;
  const Tensor w = weight ? weight->contiguous() : Tensor();
  const Tensor xr = flat_rows(x);
  RowOpParams p;
  p.B = 1, p.S = xr.size(0), p.D = D;
  p.x = rows_of_flat(xr);
  p.weight = weight ? w.data_ptr() : nullptr;
  p.cast_before_weight = cast_before_weight;
  p.norm = NormKind::RMS, p.eps = static_cast<float>(eps);
  p.out = out.data_ptr();
  run(p, dt, x, op);
  return out;
}

std::tuple<Tensor, Tensor> fused_add_rms_norm(const Tensor& x, const Tensor& residual,
                                              const std::optional<Tensor>& weight, double eps,
                                              bool cast_before_weight) {
  const char* op = "fused_add_rms_norm";
  const DType dt = check_primary(x, op, "x");
  check_same(residual, x, op, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes(), "ltxbench.", op, ": residual has shape ", shape(residual.sizes()),
              " but x has ", shape(x.sizes()));
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dimension");
  const auto D = x.size(-1);
  check_weight(weight, x, D, op);
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
  p.norm = NormKind::RMS, p.eps = static_cast<float>(eps);
  p.out = out.data_ptr(), p.h_out = residual_out.data_ptr();
  run(p, dt, x, op);
  return {out, residual_out};
}

// Shared by the modulated ops: x as (B, S, D) rows, scale/shift broadcast, a fresh contiguous output.
struct Modulated {
  RowOpParams p;
  Tensor x, scale, shift, out;
};

Modulated modulated(const Tensor& x_in, const Tensor& scale, const Tensor& shift, double eps, const char* op,
                    const char* x_name = "x", bool allocate_out = true) {
  check_3d(x_in, op, x_name);
  Modulated m;
  m.x = unit_last_stride(x_in);
  m.p.B = m.x.size(0), m.p.S = m.x.size(1), m.p.D = m.x.size(2);
  m.p.x = rows_of_3d(m.x);
  m.p.scale = broadcast_rows(scale, m.x, op, "scale", m.scale, x_name);
  m.p.shift = broadcast_rows(shift, m.x, op, "shift", m.shift, x_name);
  m.p.eps = static_cast<float>(eps);
  if (allocate_out) {  // the FP8 ops write q instead
    m.out = at::empty(m.x.sizes(), m.x.options());
    m.p.out = m.out.data_ptr();
  }
  return m;
}

Tensor rms_norm_modulate(const Tensor& x, const std::optional<Tensor>& weight, const Tensor& scale,
                         const Tensor& shift, double eps) {
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

Tensor layer_norm_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, double eps) {
  const char* op = "layer_norm_modulate";
  const DType dt = check_primary(x, op, "x");
  Modulated m = modulated(x, scale, shift, eps, op);
  m.p.norm = NormKind::Layer;
  run(m.p, dt, x, op);
  return m.out;
}

// The residual branch a (same shape as h) and an optional (B|1, S|1, D) gate.
Tensor attach_branch(RowOpParams& p, const Tensor& h, const Tensor& a, const std::optional<Tensor>& gate,
                     const char* op, Tensor& gate_keep) {
  check_same(a, h, op, "a", "h");
  TORCH_CHECK(a.sizes() == h.sizes(), "ltxbench.", op, ": a has shape ", shape(a.sizes()), " but h has ", shape(h.sizes()));
  Tensor ar = unit_last_stride(a);
  p.a = rows_of_3d(ar);
  if (gate) p.gate = broadcast_rows(*gate, h, op, "gate", gate_keep, "h");
  return ar;
}

Tensor gated_residual(const Tensor& h_in, const Tensor& a, const Tensor& gate) {
  const char* op = "gated_residual";
  const DType dt = check_primary(h_in, op, "h");
  check_3d(h_in, op, "h");
  const Tensor h = unit_last_stride(h_in);
  RowOpParams p;
  p.B = h.size(0), p.S = h.size(1), p.D = h.size(2);
  p.x = rows_of_3d(h);
  Tensor gate_keep;
  const Tensor ar = attach_branch(p, h, a, gate, op, gate_keep);
  Tensor out = at::empty(h.sizes(), h.options());
  p.norm = NormKind::None;
  p.out = out.data_ptr();
  run(p, dt, h, op);
  return out;
}

std::tuple<Tensor, Tensor> add_rms_norm_modulate(const Tensor& h, const Tensor& a,
                                                 const std::optional<Tensor>& gate, const Tensor& scale,
                                                 const Tensor& shift, double eps) {
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


// ---- RoPE -------------------------------------------------------------------------------------------

void check_f32_table(const Tensor& t, const Tensor& x, const char* op, const char* name, const char* x_name = "q") {
  TORCH_CHECK(t.device() == x.device(), "ltxbench.", op, ": ", name, " is on ", dev(t), " but ", x_name, " is on ",
              dev(x));
  TORCH_CHECK(t.scalar_type() == at::kFloat, "ltxbench.", op, ": ", name, " must be float32, got ", dtype_name(t));
}

// The angle source of the 3-D RoPE: exactly one of (cos, sin) or (grid, freqs).
void attach_ltx_angles(Rope3dParams& p, const Tensor& q, const std::optional<Tensor>& cos,
                       const std::optional<Tensor>& sin, const std::optional<Tensor>& grid,
                       const std::optional<Tensor>& freqs, const char* op, std::vector<Tensor>& keep) {
  const bool tables = cos.has_value() || sin.has_value(), coords = grid.has_value() || freqs.has_value();
  TORCH_CHECK(tables != coords && (tables ? cos && sin : grid && freqs), "ltxbench.", op,
              ": pass either cos and sin, or grid and freqs (exactly one pair)");
  const int64_t B = p.B, S = p.S, D = p.D;
  if (tables) {
    for (auto [t, name, rows] : {std::tuple{&*cos, "cos", &p.cos}, std::tuple{&*sin, "sin", &p.sin}}) {
      check_f32_table(*t, q, op, name);
      TORCH_CHECK(t->dim() == 3 && (t->size(0) == B || t->size(0) == 1) && t->size(1) == S && t->size(2) == D,
                  "ltxbench.", op, ": ", name, " must have shape (B|1, S, D) = (", num(B), "|1, ", num(S), ", ",
                  num(D), "), got ", shape(t->sizes()));
      keep.push_back(unit_last_stride(*t).expand({B, S, D}));
      *rows = rows_of_3d(keep.back());
    }
  } else {
    check_f32_table(*grid, q, op, "grid");
    check_f32_table(*freqs, q, op, "freqs");
    TORCH_CHECK(grid->dim() == 3 && (grid->size(0) == B || grid->size(0) == 1) && grid->size(1) == S &&
                    grid->size(2) == 3,
                "ltxbench.", op, ": grid must have shape (B|1, S, 3), got ", shape(grid->sizes()));
    TORCH_CHECK(freqs->dim() == 1 && freqs->size(0) == D / 6, "ltxbench.", op, ": freqs must have shape (D // 6,) = (",
                num(D / 6), ",), got ", shape(freqs->sizes()));
    keep.push_back(unit_last_stride(*grid).expand({B, S, 3}));
    p.grid = rows_of_3d(keep.back());
    keep.push_back(freqs->contiguous());
    p.freqs = keep.back().data_ptr<float>();
    p.pad = static_cast<int>(D % 6);
  }
}

Rope3dParams rope_3d_params(const Tensor& q, const Tensor& k, const char* op, std::vector<Tensor>& keep) {
  check_3d(q, op, "q");
  check_same(k, q, op, "k", "q");
  TORCH_CHECK(k.sizes() == q.sizes(), "ltxbench.", op, ": k has shape ", shape(k.sizes()), " but q has ",
              shape(q.sizes()));
  TORCH_CHECK(q.size(2) % 2 == 0, "ltxbench.", op, ": the inner dim D must be even (pairs), got ", num(q.size(2)));
  keep.push_back(unit_last_stride(q));
  keep.push_back(unit_last_stride(k));
  Rope3dParams p;
  p.B = q.size(0), p.S = q.size(1), p.D = q.size(2);
  p.q = rows_of_3d(keep[keep.size() - 2]);
  p.k = rows_of_3d(keep.back());
  return p;
}

// The launch on q's device and stream, with its error named after the op.
void launch_3d_checked(const Rope3dParams& p, DType dt, const Tensor& q, const char* op) {
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = launch_rope_3d(p, dt, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
}

// Fresh contiguous q/k outputs, then the launch (shared by rope_3d and qk_rms_norm_rope).
std::tuple<Tensor, Tensor> run_rope_3d(Rope3dParams& p, DType dt, const Tensor& q, const char* op) {
  Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(q.sizes(), q.options());
  p.q_out = q_out.data_ptr(), p.k_out = k_out.data_ptr();
  launch_3d_checked(p, dt, q, op);
  return {q_out, k_out};
}

std::tuple<Tensor, Tensor> rope_3d(const Tensor& q, const Tensor& k, const std::optional<Tensor>& cos,
                                   const std::optional<Tensor>& sin, const std::optional<Tensor>& grid,
                                   const std::optional<Tensor>& freqs) {
  const char* op = "rope_3d";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = rope_3d_params(q, k, op, keep);
  attach_ltx_angles(p, q, cos, sin, grid, freqs, op, keep);
  return run_rope_3d(p, dt, q, op);
}

// qk_rms_norm_rope's checks and params (outputs not yet attached).
Rope3dParams qk_norm_rope_params(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk, double eps,
                                 const std::optional<Tensor>& cos, const std::optional<Tensor>& sin,
                                 const std::optional<Tensor>& grid, const std::optional<Tensor>& freqs, const char* op,
                                 std::vector<Tensor>& keep) {
  Rope3dParams p = rope_3d_params(q, k, op, keep);
  TORCH_CHECK(p.D <= 8192, "ltxbench.", op, ": the inner dim D must be <= 8192, got ", num(p.D));
  for (auto [w, name] : {std::pair{&wq, "wq"}, std::pair{&wk, "wk"}}) {
    check_same(*w, q, op, name, "q");
    TORCH_CHECK(w->dim() == 1 && w->size(0) == p.D, "ltxbench.", op, ": ", name, " must have shape (", num(p.D),
                ",), got ", shape(w->sizes()));
  }
  keep.push_back(wq.contiguous());
  p.wq = keep.back().data_ptr();
  keep.push_back(wk.contiguous());
  p.wk = keep.back().data_ptr();
  p.norm = true, p.eps = static_cast<float>(eps);
  attach_ltx_angles(p, q, cos, sin, grid, freqs, op, keep);
  return p;
}

std::tuple<Tensor, Tensor> qk_rms_norm_rope(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                            double eps, const std::optional<Tensor>& cos,
                                            const std::optional<Tensor>& sin, const std::optional<Tensor>& grid,
                                            const std::optional<Tensor>& freqs) {
  const char* op = "qk_rms_norm_rope";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  return run_rope_3d(p, dt, q, op);
}

// v (B, S, D) beside q for the packed outputs, copied as it is: its checks, then its rows in the params.
void attach_v(Rope3dParams& p, const Tensor& v, const Tensor& q, const char* op, std::vector<Tensor>& keep) {
  check_same(v, q, op, "v", "q");
  TORCH_CHECK(v.sizes() == q.sizes(), "ltxbench.", op, ": v has shape ", shape(v.sizes()), " but q has ",
              shape(q.sizes()));
  keep.push_back(unit_last_stride(v));
  p.v = rows_of_3d(keep.back());
}

Tensor qk_rms_norm_rope_pack(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                             double eps, const std::optional<Tensor>& cos, const std::optional<Tensor>& sin,
                             const std::optional<Tensor>& grid, const std::optional<Tensor>& freqs, int64_t parts) {
  const char* op = "qk_rms_norm_rope_pack";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  attach_v(p, v, q, op, keep);
  TORCH_CHECK(parts >= 1 && p.D % parts == 0, "ltxbench.", op, ": parts must be >= 1 and divide the inner dim D = ",
              num(p.D), ", got ", num(parts));
  p.chunk = p.D / parts;
  Tensor packed = at::empty({parts, p.B, p.S, 3, p.chunk}, q.options());
  p.packed = packed.data_ptr();
  launch_3d_checked(p, dt, q, op);
  return packed;
}

// `outs` as the parts of a packed q/k/v output, each (B, S, 3, chunk), contiguous, q's dtype, on q's device (a peer
// GPU's memory mapped here counts as q's device): their pointers into part_out, the first also as `packed`.
void attach_parts(void** part_out, void*& packed, at::TensorList outs, const Tensor& q, int64_t chunk, const char* op) {
  const std::vector<int64_t> want{q.size(0), q.size(1), 3, chunk};
  for (size_t r = 0; r < outs.size(); ++r) {
    const Tensor& out = outs[r];
    const std::string which = "outs[" + num(static_cast<int64_t>(r)) + "]";  // formatted here: see num()
    TORCH_CHECK(out.scalar_type() == q.scalar_type() && out.device() == q.device(), "ltxbench.", op, ": ", which,
                " must be ", dtype_name(q), " on ", dev(q), ", got ", dtype_name(out), " on ", dev(out));
    TORCH_CHECK(out.sizes() == c10::IntArrayRef(want) && out.is_contiguous(), "ltxbench.", op, ": ", which,
                " must be contiguous of shape ", shape(want), ", got ", shape(out.sizes()));
    part_out[r] = out.data_ptr();
  }
  packed = part_out[0];
}

// The number of parts of a packed output written through `outs`, checked: 1 to kMaxPackParts, dividing `total`.
int64_t parts_of(at::TensorList outs, int64_t total, const char* what, const char* op) {
  const auto parts = static_cast<int64_t>(outs.size());
  TORCH_CHECK(parts >= 1 && parts <= kMaxPackParts && total % parts == 0, "ltxbench.", op, ": outs must hold 1 to ",
              num(kMaxPackParts), " tensors, as many as divide ", what, " (", num(total), "), got ", num(parts));
  return parts;
}

// qk_rms_norm_rope_pack with part r written to outs[r] instead of one fresh buffer: a rank of a Ulysses exchange
// writes its peers' parts straight into their receive buffers.
void qk_rms_norm_rope_pack_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                                double eps, const std::optional<Tensor>& cos, const std::optional<Tensor>& sin,
                                const std::optional<Tensor>& grid, const std::optional<Tensor>& freqs,
                                at::TensorList outs) {
  const char* op = "qk_rms_norm_rope_pack_into";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  attach_v(p, v, q, op, keep);
  p.chunk = p.D / parts_of(outs, p.D, "the inner dim D", op);
  attach_parts(p.part_out, p.packed, outs, q, p.chunk, op);
  if (q.numel() == 0) return;
  launch_3d_checked(p, dt, q, op);
}

// qk_rms_norm_rope with k and v written together per token, (B, S, 2, D): the send buffer of a ring attention's
// key/value all-gather, whose gathered buffer attention then reads in place; q (B, S, D) on its own.
std::tuple<Tensor, Tensor> qk_rms_norm_rope_kv(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq,
                                               const Tensor& wk, double eps, const std::optional<Tensor>& cos,
                                               const std::optional<Tensor>& sin, const std::optional<Tensor>& grid,
                                               const std::optional<Tensor>& freqs) {
  const char* op = "qk_rms_norm_rope_kv";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  attach_v(p, v, q, op, keep);
  p.chunk = p.D, p.slots = 2;
  Tensor q_out = at::empty({p.B, p.S, p.D}, q.options()), kv = at::empty({p.B, p.S, 2, p.D}, q.options());
  p.q_out = q_out.data_ptr(), p.packed = kv.data_ptr();
  launch_3d_checked(p, dt, q, op);
  return {q_out, kv};
}

// ---- LTX-2: q/k RMSNorm over all heads + split RoPE ----------------------------------------------------

// x (B, S, D) (`name`: x or q) with its weight, and the shared tables cos/sin (B|1, H, S, D / 2H), any strides but
// the last: the checks, then the params without outputs. Tensors that must outlive the launch go to `keep`.
RopeSplitParams rope_split_params(const Tensor& x, const char* name, const Tensor& w, const char* w_name,
                                  const Tensor& cos, const Tensor& sin, double eps, const char* op,
                                  std::vector<Tensor>& keep) {
  check_3d(x, op, name);
  const int64_t B = x.size(0), S = x.size(1), D = x.size(2);
  TORCH_CHECK(D <= 8192, "ltxbench.", op, ": the inner dim D must be <= 8192, got ", num(D));
  check_same(w, x, op, w_name, name);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == D, "ltxbench.", op, ": ", w_name, " must have shape (", num(D), ",), got ",
              shape(w.sizes()));
  for (auto [t, t_name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_f32_table(*t, x, op, t_name, name);
    TORCH_CHECK(t->dim() == 4, "ltxbench.", op, ": ", t_name, " must be 4-D (B|1, heads, S, head_dim / 2), got shape ",
                shape(t->sizes()));
  }
  TORCH_CHECK(sin.sizes() == cos.sizes(), "ltxbench.", op, ": sin has shape ", shape(sin.sizes()), " but cos has ",
              shape(cos.sizes()));
  const int64_t H = cos.size(1);
  TORCH_CHECK(H > 0 && D % H == 0, "ltxbench.", op, ": the inner dim D = ", num(D), " of ", name,
              " is not a multiple of the heads of cos (dim 1) = ", num(H));
  const int64_t hd = D / H;
  TORCH_CHECK(hd % 2 == 0, "ltxbench.", op, ": the head dim D / heads = ", num(D), " / ", num(H), " = ", num(hd),
              " must be even (two halves)");
  TORCH_CHECK(cos.size(3) == hd / 2, "ltxbench.", op, ": cos must have head_dim / 2 = ", num(hd / 2),
              " in its last dim (D = ", num(D), " over ", num(H), " heads), got shape ", shape(cos.sizes()));
  TORCH_CHECK((cos.size(0) == B || cos.size(0) == 1) && cos.size(2) == S, "ltxbench.", op,
              ": cos must have shape (B|1, heads, S, head_dim / 2) = (", num(B), "|1, ", num(H), ", ", num(S), ", ",
              num(cos.size(3)), "), got ", shape(cos.sizes()));
  const Tensor xr = unit_last_stride(x), wr = w.contiguous();
  Tensor c = unit_last_stride(cos), s = unit_last_stride(sin);
  auto strides = [](const Tensor& t) { return std::tuple{row_stride(t, 0), row_stride(t, 1), row_stride(t, 2)}; };
  if (strides(c) != strides(s)) c = c.contiguous(), s = s.contiguous();  // the kernel reads both at one offset
  keep.insert(keep.end(), {xr, wr, c, s});
  RopeSplitParams p;
  p.B = B, p.S = S, p.H = H, p.half = cos.size(3);
  p.q = rows_of_3d(xr), p.wq = wr.data_ptr();
  p.cos = c.data_ptr<float>(), p.sin = s.data_ptr<float>();
  std::tie(p.t_sb, p.t_sh, p.t_ss) = strides(c);
  p.eps = static_cast<float>(eps);
  return p;
}

void run_rope_split(const RopeSplitParams& p, DType dt, const Tensor& x, const char* op) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch_rope_split(p, dt, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
}

Tensor rms_norm_rope_split(const Tensor& x, const Tensor& weight, double eps, const Tensor& cos, const Tensor& sin) {
  const char* op = "rms_norm_rope_split";
  const DType dt = check_primary(x, op, "x");
  std::vector<Tensor> keep;
  RopeSplitParams p = rope_split_params(x, "x", weight, "weight", cos, sin, eps, op, keep);
  Tensor out = at::empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  p.q_out = out.data_ptr();
  run_rope_split(p, dt, x, op);
  return out;
}

// k (checked against q by the caller) and wk beside q for the split-RoPE q/k kernels: wk's checks, then both in p.
void attach_split_key(RopeSplitParams& p, const Tensor& k, const Tensor& wk, const Tensor& q, const char* op,
                      std::vector<Tensor>& keep) {
  check_same(wk, q, op, "wk", "q");
  TORCH_CHECK(wk.dim() == 1 && wk.size(0) == q.size(2), "ltxbench.", op, ": wk must have shape (", num(q.size(2)),
              ",), got ", shape(wk.sizes()));
  keep.push_back(unit_last_stride(k));
  p.k = rows_of_3d(keep.back());
  keep.push_back(wk.contiguous());
  p.wk = keep.back().data_ptr();
}

std::tuple<Tensor, Tensor> qk_rms_norm_rope_split(const Tensor& q, const Tensor& k, const Tensor& wq,
                                                  const Tensor& wk, double eps, const Tensor& cos,
                                                  const Tensor& sin) {
  const char* op = "qk_rms_norm_rope_split";
  const DType dt = check_primary(q, op, "q");
  check_same(k, q, op, "k", "q");
  TORCH_CHECK(k.sizes() == q.sizes(), "ltxbench.", op, ": k has shape ", shape(k.sizes()), " but q has ",
              shape(q.sizes()));
  std::vector<Tensor> keep;
  RopeSplitParams p = rope_split_params(q, "q", wq, "wq", cos, sin, eps, op, keep);
  attach_split_key(p, k, wk, q, op, keep);
  Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(q.sizes(), q.options());
  if (q_out.numel() == 0) return {q_out, k_out};
  p.q_out = q_out.data_ptr(), p.k_out = k_out.data_ptr();
  run_rope_split(p, dt, q, op);
  return {q_out, k_out};
}

Tensor qk_rms_norm_rope_split_pack(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq,
                                   const Tensor& wk, double eps, const Tensor& cos, const Tensor& sin, int64_t parts) {
  const char* op = "qk_rms_norm_rope_split_pack";
  const DType dt = check_primary(q, op, "q");
  for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_same(*t, q, op, name, "q");
    TORCH_CHECK(t->sizes() == q.sizes(), "ltxbench.", op, ": ", name, " has shape ", shape(t->sizes()), " but q has ",
                shape(q.sizes()));
  }
  std::vector<Tensor> keep;
  RopeSplitParams p = rope_split_params(q, "q", wq, "wq", cos, sin, eps, op, keep);
  attach_split_key(p, k, wk, q, op, keep);
  TORCH_CHECK(parts >= 1 && p.H % parts == 0, "ltxbench.", op, ": parts must be >= 1 and divide the heads (",
              num(p.H), "), got ", num(parts));
  keep.push_back(unit_last_stride(v));
  p.v = rows_of_3d(keep.back());
  Tensor packed = at::empty({parts, q.size(0), q.size(1), 3, q.size(2) / parts}, q.options());
  if (packed.numel() == 0) return packed;
  p.packed = packed.data_ptr(), p.parts = parts;
  run_rope_split(p, dt, q, op);
  return packed;
}

// qk_rms_norm_rope_split_pack with part r written to outs[r] (as qk_rms_norm_rope_pack_into).
void qk_rms_norm_rope_split_pack_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq,
                                      const Tensor& wk, double eps, const Tensor& cos, const Tensor& sin,
                                      at::TensorList outs) {
  const char* op = "qk_rms_norm_rope_split_pack_into";
  const DType dt = check_primary(q, op, "q");
  for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_same(*t, q, op, name, "q");
    TORCH_CHECK(t->sizes() == q.sizes(), "ltxbench.", op, ": ", name, " has shape ", shape(t->sizes()), " but q has ",
                shape(q.sizes()));
  }
  std::vector<Tensor> keep;
  RopeSplitParams p = rope_split_params(q, "q", wq, "wq", cos, sin, eps, op, keep);
  attach_split_key(p, k, wk, q, op, keep);
  p.parts = parts_of(outs, p.H, "the heads", op);
  keep.push_back(unit_last_stride(v));
  p.v = rows_of_3d(keep.back());
  attach_parts(p.part_out, p.packed, outs, q, q.size(2) / p.parts, op);
  if (q.numel() == 0) return;
  run_rope_split(p, dt, q, op);
}

std::tuple<Tensor, Tensor> rope_1d(const Tensor& q_in, const Tensor& k_in, const Tensor& cos, const Tensor& sin,
                                   const std::optional<Tensor>& positions, bool interleaved) {
  const char* op = "rope_1d";
  const DType dt = check_primary(q_in, op, "q");
  check_same(k_in, q_in, op, "k", "q");
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4, "ltxbench.", op,
              ": q and k must be 4-D (B, heads, S, head_dim), got ", shape(q_in.sizes()), " and ", shape(k_in.sizes()));
  const int64_t B = q_in.size(0), S = q_in.size(2), hd = q_in.size(3);
  TORCH_CHECK(k_in.size(0) == B && k_in.size(2) == S && k_in.size(3) == hd, "ltxbench.", op, ": k has shape ",
              shape(k_in.sizes()), " but q has ", shape(q_in.sizes()), " (B, S and head_dim must match)");
  for (auto [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_f32_table(*t, q_in, op, name);
    TORCH_CHECK(t->dim() == 2 && t->sizes() == cos.sizes() && 2 * t->size(1) <= hd && t->size(1) > 0, "ltxbench.",
                op, ": ", name, " must be a (positions, rot/2) table with rot <= head_dim = ", num(hd),
                ", got ", shape(t->sizes()));
  }
  Tensor pos;
  if (positions) {
    TORCH_CHECK(positions->device() == q_in.device() && positions->scalar_type() == at::kLong, "ltxbench.", op,
                ": positions must be an int64 tensor on ", dev(q_in));
    TORCH_CHECK(positions->dim() == 2 && (positions->size(0) == B || positions->size(0) == 1) &&
                positions->size(1) == S, "ltxbench.", op, ": positions must have shape (B|1, S) = (", num(B), "|1, ",
                num(S), "), got ", shape(positions->sizes()));
    pos = positions->expand({B, S});
  } else {
    TORCH_CHECK(cos.size(0) == B * S || cos.size(0) == S, "ltxbench.", op, ": without positions, cos/sin must have ",
                "one row per token (B*S = ", num(B * S), ") or per position (S = ", num(S), "), got ",
                num(cos.size(0)), " rows");
  }
  const Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in);
  const Tensor c = cos.contiguous(), s = sin.contiguous();
  // Token-major outputs (B, S, H, hd) seen as (B, H, S, hd): see rope1d_kernel.
  Tensor q_out = at::empty({B, S, q.size(1), hd}, q.options()).transpose(1, 2);
  Tensor k_out = at::empty({B, S, k.size(1), hd}, k.options()).transpose(1, 2);
  Rope1dParams p;
  p.B = B, p.S = S, p.Hq = q.size(1), p.Hk = k.size(1), p.hd = hd, p.half = c.size(1);
  p.q = q.data_ptr(), p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_ss = q.stride(2);
  p.k = k.data_ptr(), p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_ss = k.stride(2);
  p.cos = c.data_ptr<float>(), p.sin = s.data_ptr<float>(), p.table_stride = c.size(1), p.table_rows = c.size(0);
  if (positions) {
    p.pos = pos.data_ptr<int64_t>(), p.pos_sb = pos.stride(0), p.pos_ss = pos.stride(1);
  } else {  // the table row is the token's own: b * S + s, or s when the batch shares the table
    p.pos_sb = c.size(0) == B * S ? S : 0, p.pos_ss = 1;
  }
  p.interleaved = interleaved;
  p.q_out = q_out.data_ptr(), p.k_out = k_out.data_ptr();
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = launch_rope_1d(p, dt, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
  return {q_out, k_out};
}

// ---- activations ------------------------------------------------------------------------------------

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
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch_act(p, dt, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

Tensor gelu_tanh(const Tensor& x) { return activation(x, false, 1, 1, "gelu_tanh"); }
Tensor geglu(const Tensor& x, int64_t gate_half, bool approximate) {
  return activation(x, true, gate_half, approximate ? 1 : 0, "geglu");
}
Tensor swiglu(const Tensor& x, int64_t gate_half) { return activation(x, true, gate_half, 2, "swiglu"); }

// ---- FP8 (e4m3) with per-row scales ---------------------------------------------------------------------

// q: a fresh contiguous float8_e4m3fn tensor of x's shape; x_scale: float32 (..., 1), one scale per row.
std::tuple<Tensor, Tensor> run_fp8(Fp8Params& p, DType dt, const Tensor& x, const char* op) {
  TORCH_CHECK(p.rows.B * p.rows.S <= INT32_MAX, "ltxbench.", op, ": at most 2^31 - 1 rows, got ",
              num(p.rows.B * p.rows.S));
  std::vector<int64_t> scale_shape(x.sizes().begin(), x.sizes().end());
  scale_shape.back() = 1;
  Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  Tensor x_scale = at::empty(scale_shape, x.options().dtype(at::kFloat));
  p.q = q.data_ptr(), p.x_scale = x_scale.data_ptr<float>();
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch_fp8_rows(p, dt, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
  return {q, x_scale};
}

std::tuple<Tensor, Tensor> rms_norm_modulate_fp8(const Tensor& x, const std::optional<Tensor>& weight,
                                                 const Tensor& scale, const Tensor& shift, double eps) {
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

std::tuple<Tensor, Tensor> gelu_tanh_fp8(const Tensor& x) { return fp8_of_rows(x, Fp8Op::GeluTanh, "gelu_tanh_fp8"); }
std::tuple<Tensor, Tensor> quantize_fp8(const Tensor& x) { return fp8_of_rows(x, Fp8Op::Quantize, "quantize_fp8"); }

// ---- FP8 (e4m3) with per-(batch, head) scales: FlashAttention-3's FP8 inputs -------------------------------

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
  const char* op = "qk_rms_norm_rope_fp8";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  check_heads(p.D, heads, op);
  TORCH_CHECK((p.D / heads) % 2 == 0, "ltxbench.", op, ": the head dim D / heads must be even (RoPE pairs), got ",
              num(p.D / heads));
  const auto fp8 = q.options().dtype(at::kFloat8_e4m3fn), f32 = q.options().dtype(at::kFloat);
  Tensor q_out = at::empty(q.sizes(), fp8), k_out = at::empty(q.sizes(), fp8);
  Tensor q_descale = at::empty({p.B, heads}, f32), k_descale = at::empty({p.B, heads}, f32);
  Tensor scale8 = at::empty({2 * heads}, f32);
  p.q_out = q_out.data_ptr(), p.k_out = k_out.data_ptr();
  p.heads = heads, p.scale8 = scale8.data_ptr<float>();
  p.q_descale = q_descale.data_ptr<float>(), p.k_descale = k_descale.data_ptr<float>();
  launch_3d_checked(p, dt, q, op);
  return {q_out, q_descale, k_out, k_descale};
}

// (q, descale (B, heads)): x (B, S, D) in e4m3, one power-of-two scale per (batch, head) from its amax.
std::tuple<Tensor, Tensor> quantize_fp8_heads(const Tensor& x, int64_t heads) {
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
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch_fp8_heads(p, dt, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
  return {q, descale};
}

// ---- attention ----------------------------------------------------------------------------------------

// Is t laid out for `elems`-element loads: data pointer and every stride but the last multiples of that?
bool aligned_for(const Tensor& t, int64_t elems) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % (elems * t.element_size()) != 0) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) % elems != 0) return false;
  return true;
}

Tensor cross_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const std::optional<Tensor>& mask,
                       std::optional<double> scale) {
  const char* op = "cross_attention";
  const DType dt = check_primary(q_in, op, "q");
  check_same(k_in, q_in, op, "k", "q");
  check_same(v_in, q_in, op, "v", "q");
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, "ltxbench.", op,
              ": q, k and v must be 4-D (B, S|L, heads, head_dim), got ", shape(q_in.sizes()), ", ",
              shape(k_in.sizes()), " and ", shape(v_in.sizes()));
  const int64_t B = q_in.size(0), S = q_in.size(1), H = q_in.size(2), hd = q_in.size(3), L = k_in.size(1);
  TORCH_CHECK(k_in.size(0) == B && k_in.size(2) == H && k_in.size(3) == hd, "ltxbench.", op, ": k has shape ",
              shape(k_in.sizes()), " but q has ", shape(q_in.sizes()), " (B, heads and head_dim must match)");
  TORCH_CHECK(v_in.sizes() == k_in.sizes(), "ltxbench.", op, ": v has shape ", shape(v_in.sizes()), " but k has ",
              shape(k_in.sizes()));
  TORCH_CHECK(hd <= 256, "ltxbench.", op, ": head_dim must be <= 256, got ", num(hd));
  TORCH_CHECK(B <= 65535 && H <= 65535, "ltxbench.", op, ": batch and heads must each be <= 65535, got ", num(B),
              " and ", num(H));
  Tensor out = at::empty({B, S, H, hd}, q_in.options());
  if (out.numel() == 0) return out;
  TORCH_CHECK(L > 0, "ltxbench.", op, ": k and v need at least one key (softmax over no keys is undefined)");
  Tensor m;
  if (mask) {
    TORCH_CHECK(mask->device() == q_in.device(), "ltxbench.", op, ": mask is on ", dev(*mask), " but q is on ",
                dev(q_in));
    TORCH_CHECK(mask->scalar_type() == q_in.scalar_type() || mask->scalar_type() == at::kFloat, "ltxbench.", op,
                ": mask must be float32 or q's dtype (", dtype_name(q_in), "), got ", dtype_name(*mask));
    TORCH_CHECK(mask->dim() == 4 && (mask->size(0) == B || mask->size(0) == 1) &&
                    (mask->size(1) == H || mask->size(1) == 1) && mask->size(2) == 1 && mask->size(3) == L,
                "ltxbench.", op, ": mask must be additive per key, shape (B|1, heads|1, 1, L) = (", num(B), "|1, ",
                num(H), "|1, 1, ", num(L), "), got ", shape(mask->sizes()));
    m = unit_last_stride(*mask);
  }
  const int major = compute_capability_major(q_in.get_device());
  const bool mma = xattn_uses_tensor_cores(hd, dt, major);
  auto prepared = [&](const Tensor& t, int64_t elems) {
    const Tensor u = unit_last_stride(t);
    return !mma || aligned_for(u, elems) ? u : u.clone(at::MemoryFormat::Contiguous);
  };
  const Tensor q = prepared(q_in, 8), k = prepared(k_in, 8), v = prepared(v_in, 8);
  XAttnParams p;
  p.B = B, p.S = S, p.L = L, p.H = H, p.hd = hd;
  p.q = q.data_ptr(), p.q_sb = q.stride(0), p.q_ss = q.stride(1), p.q_sh = q.stride(2);
  p.k = k.data_ptr(), p.k_sb = k.stride(0), p.k_sl = k.stride(1), p.k_sh = k.stride(2);
  p.v = v.data_ptr(), p.v_sb = v.stride(0), p.v_sl = v.stride(1), p.v_sh = v.stride(2);
  if (mask) {
    p.mask = m.data_ptr(), p.mask_f32 = m.scalar_type() == at::kFloat;
    p.mask_sb = row_stride(m, 0), p.mask_sh = row_stride(m, 1);
  }
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(hd)));
  p.out = out.data_ptr();
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err =
      launch_cross_attention(p, dt, major, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "ltxbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

// out = act(x @ weight.T + bias) + residual on cuBLASLt with a measured algorithm choice (gemm.cpp). x (..., K) with
// any leading dims; weight (N, K); bias (N) and residual (..., N) optional; activation "none" or "gelu_tanh".
Tensor linear(const Tensor& x_in, const Tensor& weight_in, const std::optional<Tensor>& bias,
              const std::string& activation, const std::optional<Tensor>& residual_in) {
  const char* op = "linear";
  const DType dt = check_primary(x_in, op, "x");
  check_same(weight_in, x_in, op, "weight");
  TORCH_CHECK(activation == "none" || activation == "gelu_tanh", "ltxbench.linear: activation must be 'none' or "
              "'gelu_tanh', got '", activation, "'");
  TORCH_CHECK(x_in.dim() >= 1, "ltxbench.linear: x must have at least one dim (..., in_features)");
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.size(1) == x_in.size(-1), "ltxbench.linear: weight must be "
              "(out_features, in_features) = (N, ", num(x_in.size(-1)), "), got ", shape(weight_in.sizes()));
  const int64_t K = x_in.size(-1), N = weight_in.size(0);
  if (bias) {
    check_same(*bias, x_in, op, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "ltxbench.linear: bias must be (out_features,) = (",
                num(N), ",), got ", shape(bias->sizes()));
  }
  std::vector<int64_t> out_sizes(x_in.sizes().begin(), x_in.sizes().end());
  out_sizes.back() = N;
  const bool gelu = activation == "gelu_tanh";
  if (residual_in) {
    check_same(*residual_in, x_in, op, "residual");
    TORCH_CHECK(residual_in->sizes() == at::IntArrayRef(out_sizes), "ltxbench.linear: residual must have the "
                "output's shape ", shape(out_sizes), ", got ", shape(residual_in->sizes()));
    TORCH_CHECK(!gelu, "ltxbench.linear: residual takes activation 'none' (cuBLASLt would add it before the GELU)");
  }
  int64_t tokens = 1;
  for (int64_t i = 0; i + 1 < x_in.dim(); ++i) tokens *= x_in.size(i);
  if (x_in.numel() == 0 && K > 0) return at::empty(out_sizes, x_in.options());
  if (K == 0 || N == 0) {  // no products to sum: the bias (or zeros), through the activation, plus the residual
    Tensor out = bias ? bias->expand({tokens, N}).contiguous() : at::zeros({tokens, N}, x_in.options());
    if (gelu) out = at::gelu(out, "tanh");
    if (residual_in)
      out = (out.to(at::kFloat) + residual_in->reshape({tokens, N}).to(at::kFloat)).to(out.scalar_type());
    return out.view(out_sizes);
  }
  // cuBLASLt reads rows with unit stride along K at a uniform row pitch; anything else is copied here.
  auto rows = [K](const Tensor& t) {
    return t.stride(1) == 1 && t.stride(0) >= K ? t : t.contiguous();
  };
  const Tensor x = rows(x_in.reshape({-1, K}));
  const Tensor w = rows(weight_in);
  const Tensor b = bias ? bias->contiguous() : Tensor();
  // The residual is read through out's layout (rows of N at pitch N): any other layout is copied here.
  const Tensor residual = residual_in ? residual_in->reshape({tokens, N}).contiguous() : Tensor();
  Tensor out = at::empty({tokens, N}, x_in.options());
  Tensor workspace = at::empty({static_cast<int64_t>(kGemmWorkspaceBytes)}, x_in.options().dtype(at::kByte));
  GemmParams p;
  p.tokens = tokens, p.n = N, p.k = K;
  p.x = x.data_ptr(), p.ldx = x.stride(0);
  p.w = w.data_ptr(), p.ldw = w.stride(0);
  p.bias = bias ? b.data_ptr() : nullptr;
  p.out = out.data_ptr(), p.ldout = N;
  p.residual = residual_in ? residual.data_ptr() : nullptr;
  // fp32: the GELU runs after the GEMM (torch's tanh GELU in place); cuBLASLt's epilogue GELU is within 16-bit
  // rounding but not within fp32's tolerance of the exact tanh form (GPU tests, H100).
  const bool epilogue_gelu = gelu && dt != DType::F32;
  p.act = epilogue_gelu ? 1 : 0;
  p.workspace = workspace.data_ptr();
  const c10::cuda::CUDAGuard guard(x.device());
  const int err = launch_gemm(p, dt, x.get_device(), c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == 0, "ltxbench.linear: cuBLASLt failed for x (", num(tokens), ", ", num(K), ") @ weight.T (",
              num(K), ", ", num(N), "): ", gemm_error_string(err));
  if (gelu && !epilogue_gelu) at::gelu_(out, "tanh");
  return out.view(out_sizes);
}

bool gemm_tuning(bool enabled) { return gemm_set_tuning(enabled); }

std::vector<std::string> gemm_choices() { return gemm_table(); }

std::vector<std::string> gemm_export_choices(int64_t device) { return gemm_export(int(device)); }

int64_t gemm_import_choices(int64_t device, const std::vector<std::string>& records) {
  TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), "ltxbench.gemm_import: device must be a CUDA "
              "device index, got ", num(device));
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return gemm_import(int(device), records);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def("rms_norm(Tensor x, Tensor? weight, float eps, bool cast_before_weight=False) -> Tensor");
  m.def(
      "fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps, bool cast_before_weight=False)"
      " -> (Tensor, Tensor)");
  m.def("rms_norm_modulate(Tensor x, Tensor? weight, Tensor scale, Tensor shift, float eps) -> Tensor");
  m.def("layer_norm_modulate(Tensor x, Tensor scale, Tensor shift, float eps) -> Tensor");
  m.def("gated_residual(Tensor h, Tensor a, Tensor gate) -> Tensor");
  m.def(
      "add_rms_norm_modulate(Tensor h, Tensor a, Tensor? gate, Tensor scale, Tensor shift, float eps)"
      " -> (Tensor, Tensor)");
  m.def(
      "rope_1d(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? positions=None, bool interleaved=False)"
      " -> (Tensor, Tensor)");
  m.def("rope_3d(Tensor q, Tensor k, Tensor? cos, Tensor? sin, Tensor? grid, Tensor? freqs) -> (Tensor, Tensor)");
  m.def(
      "qk_rms_norm_rope(Tensor q, Tensor k, Tensor wq, Tensor wk, float eps, Tensor? cos, Tensor? sin,"
      " Tensor? grid, Tensor? freqs) -> (Tensor, Tensor)");
  m.def(
      "qk_rms_norm_rope_pack(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor? cos, Tensor? sin,"
      " Tensor? grid, Tensor? freqs, int parts) -> Tensor");
  m.def(
      "qk_rms_norm_rope_pack_into(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor? cos,"
      " Tensor? sin, Tensor? grid, Tensor? freqs, Tensor(a!)[] outs) -> ()");
  m.def(
      "qk_rms_norm_rope_kv(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor? cos, Tensor? sin,"
      " Tensor? grid, Tensor? freqs) -> (Tensor, Tensor)");
  m.def("rms_norm_rope_split(Tensor x, Tensor weight, float eps, Tensor cos, Tensor sin) -> Tensor");
  m.def(
      "qk_rms_norm_rope_split(Tensor q, Tensor k, Tensor wq, Tensor wk, float eps, Tensor cos, Tensor sin)"
      " -> (Tensor, Tensor)");
  m.def(
      "qk_rms_norm_rope_split_pack(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor cos,"
      " Tensor sin, int parts) -> Tensor");
  m.def(
      "qk_rms_norm_rope_split_pack_into(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor cos,"
      " Tensor sin, Tensor(a!)[] outs) -> ()");
  m.def("gelu_tanh(Tensor x) -> Tensor");
  m.def("geglu(Tensor x, int gate_half=1, bool approximate=False) -> Tensor");
  m.def("swiglu(Tensor x, int gate_half=0) -> Tensor");
  m.def("cross_attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, float? scale=None) -> Tensor");
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation='none', Tensor? residual=None) -> Tensor");
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
  // Process-wide settings of linear's algorithm choice: no tensors, so one kernel for every dispatch key.
  m.def("gemm_tuning(bool enabled) -> bool", &ltxbench::gemm_tuning);
  m.def("gemm_choices() -> str[]", &ltxbench::gemm_choices);
  m.def("gemm_export(int device) -> str[]", &ltxbench::gemm_export_choices);
  m.def("gemm_import(int device, str[] records) -> int", &ltxbench::gemm_import_choices);
}

// The same entry points serve CUDA and CPU tensors: on CPU their first check names the argument that
// must be on CUDA (a clear error instead of "could not run with arguments from the CPU backend").
#define LTXBENCH_IMPLS(m)                                                    \
  m.impl("rms_norm", &ltxbench::rms_norm);                                   \
  m.impl("fused_add_rms_norm", &ltxbench::fused_add_rms_norm);               \
  m.impl("rms_norm_modulate", &ltxbench::rms_norm_modulate);                 \
  m.impl("layer_norm_modulate", &ltxbench::layer_norm_modulate);             \
  m.impl("gated_residual", &ltxbench::gated_residual);                       \
  m.impl("add_rms_norm_modulate", &ltxbench::add_rms_norm_modulate);         \
  m.impl("rope_1d", &ltxbench::rope_1d);                                     \
  m.impl("rope_3d", &ltxbench::rope_3d);                                     \
  m.impl("qk_rms_norm_rope", &ltxbench::qk_rms_norm_rope);                   \
  m.impl("qk_rms_norm_rope_pack", &ltxbench::qk_rms_norm_rope_pack);         \
  m.impl("qk_rms_norm_rope_pack_into", &ltxbench::qk_rms_norm_rope_pack_into); \
  m.impl("qk_rms_norm_rope_kv", &ltxbench::qk_rms_norm_rope_kv);             \
  m.impl("rms_norm_rope_split", &ltxbench::rms_norm_rope_split);             \
  m.impl("qk_rms_norm_rope_split", &ltxbench::qk_rms_norm_rope_split);       \
  m.impl("qk_rms_norm_rope_split_pack", &ltxbench::qk_rms_norm_rope_split_pack); \
  m.impl("qk_rms_norm_rope_split_pack_into", &ltxbench::qk_rms_norm_rope_split_pack_into); \
  m.impl("gelu_tanh", &ltxbench::gelu_tanh);                                 \
  m.impl("geglu", &ltxbench::geglu);                                         \
  m.impl("swiglu", &ltxbench::swiglu);                                       \
  m.impl("cross_attention", &ltxbench::cross_attention);                     \
  m.impl("linear", &ltxbench::linear);                                       \
  m.impl("rms_norm_modulate_fp8", &ltxbench::rms_norm_modulate_fp8);         \
  m.impl("add_rms_norm_modulate_fp8", &ltxbench::add_rms_norm_modulate_fp8); \
  m.impl("gelu_tanh_fp8", &ltxbench::gelu_tanh_fp8);                         \
  m.impl("quantize_fp8", &ltxbench::quantize_fp8);                           \
  m.impl("qk_rms_norm_rope_fp8", &ltxbench::qk_rms_norm_rope_fp8);           \
  m.impl("quantize_fp8_heads", &ltxbench::quantize_fp8_heads);

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { LTXBENCH_IMPLS(m) }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { LTXBENCH_IMPLS(m) }
