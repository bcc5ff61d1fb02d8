// LTX-2's q/k RMSNorm over all heads fused with its split RoPE (rope_split.cu): each head's halves rotated, alone,
// for q and k together, or packed with v for the Ulysses exchange.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <tuple>
#include <vector>

#include "bindings/rope.h"

namespace ltxbench {
namespace {

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

// q and k (and v for the packed outputs), all of q's shape, with the weights wq and wk: the checks, then the
// params without outputs.
RopeSplitParams qk_split_params(const Tensor& q, const Tensor& k, const Tensor* v, const Tensor& wq, const Tensor& wk,
                                double eps, const Tensor& cos, const Tensor& sin, const char* op,
                                std::vector<Tensor>& keep) {
  check_like(k, q, op, "k", "q");
  if (v) check_like(*v, q, op, "v", "q");
  RopeSplitParams p = rope_split_params(q, "q", wq, "wq", cos, sin, eps, op, keep);
  check_same(wk, q, op, "wk", "q");
  TORCH_CHECK(wk.dim() == 1 && wk.size(0) == q.size(2), "ltxbench.", op, ": wk must have shape (", num(q.size(2)),
              ",), got ", shape(wk.sizes()));
  keep.push_back(unit_last_stride(k));
  p.k = rows_of_3d(keep.back());
  keep.push_back(wk.contiguous());
  p.wk = keep.back().data_ptr();
  if (v) {
    keep.push_back(unit_last_stride(*v));
    p.v = rows_of_3d(keep.back());
  }
  return p;
}

void run_rope_split(const RopeSplitParams& p, DType dt, const Tensor& x, const char* op) {
  launch_checked(x, op, [&](cudaStream_t stream) { return launch_rope_split(p, dt, stream); });
}

Tensor rms_norm_rope_split(const Tensor& x, const Tensor& weight, double eps, const Tensor& cos, const Tensor& sin) {
  NOTE_SOURCE_USED();
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

std::tuple<Tensor, Tensor> qk_rms_norm_rope_split(const Tensor& q, const Tensor& k, const Tensor& wq,
                                                  const Tensor& wk, double eps, const Tensor& cos,
                                                  const Tensor& sin) {
  NOTE_SOURCE_USED();
  const char* op = "qk_rms_norm_rope_split";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  RopeSplitParams p = qk_split_params(q, k, nullptr, wq, wk, eps, cos, sin, op, keep);
  Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(q.sizes(), q.options());
  if (q_out.numel() == 0) return {q_out, k_out};
  p.q_out = q_out.data_ptr(), p.k_out = k_out.data_ptr();
  run_rope_split(p, dt, q, op);
  return {q_out, k_out};
}

Tensor qk_rms_norm_rope_split_pack(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq,
                                   const Tensor& wk, double eps, const Tensor& cos, const Tensor& sin, int64_t parts) {
  NOTE_SOURCE_USED();
  const char* op = "qk_rms_norm_rope_split_pack";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  RopeSplitParams p = qk_split_params(q, k, &v, wq, wk, eps, cos, sin, op, keep);
  TORCH_CHECK(parts >= 1 && p.H % parts == 0, "ltxbench.", op, ": parts must be >= 1 and divide the heads (",
              num(p.H), "), got ", num(parts));
  Tensor packed = at::empty({parts, q.size(0), q.size(1), 3, q.size(2) / parts}, q.options());
  if (packed.numel() == 0) return packed;
  p.packed = packed.data_ptr(), p.parts = parts;
  run_rope_split(p, dt, q, op);
  return packed;
}

// qk_rms_norm_rope_split written as e4m3 with one power-of-two scale per group of heads, bound by the norm weights:
// (q8, q_descale (B, groups), k8, k_descale), the inputs of FP8 attention (cuDNN's: groups = 1).
std::tuple<Tensor, Tensor, Tensor, Tensor> qk_rms_norm_rope_split_fp8(const Tensor& q, const Tensor& k,
                                                                      const Tensor& wq, const Tensor& wk, double eps,
                                                                      const Tensor& cos, const Tensor& sin,
                                                                      int64_t groups) {
  NOTE_SOURCE_USED();
  const char* op = "qk_rms_norm_rope_split_fp8";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  RopeSplitParams p = qk_split_params(q, k, nullptr, wq, wk, eps, cos, sin, op, keep);
  TORCH_CHECK(groups >= 1 && p.H % groups == 0, "ltxbench.", op, ": groups must be >= 1 and divide the heads of cos (",
              num(p.H), "), got ", num(groups));
  p.groups = groups;
  const Fp8QkOutputs o = fp8_qk_outputs(p, q, groups);
  run_rope_split(p, dt, q, op);
  return {o.q, o.q_descale, o.k, o.k_descale};
}

// qk_rms_norm_rope_split_pack with part r written to outs[r] (as qk_rms_norm_rope_pack_into).
void qk_rms_norm_rope_split_pack_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq,
                                      const Tensor& wk, double eps, const Tensor& cos, const Tensor& sin,
                                      at::TensorList outs) {
  NOTE_SOURCE_USED();
  const char* op = "qk_rms_norm_rope_split_pack_into";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  RopeSplitParams p = qk_split_params(q, k, &v, wq, wk, eps, cos, sin, op, keep);
  p.parts = parts_of(outs, p.H, "the heads", op);
  attach_parts(p.part_out, p.packed, outs, q, q.size(2) / p.parts, op);
  if (q.numel() == 0) return;
  run_rope_split(p, dt, q, op);
}

void register_rope_split(torch::Library& m) {
  m.impl("rms_norm_rope_split", &rms_norm_rope_split);
  m.impl("qk_rms_norm_rope_split", &qk_rms_norm_rope_split);
  m.impl("qk_rms_norm_rope_split_pack", &qk_rms_norm_rope_split_pack);
  m.impl("qk_rms_norm_rope_split_fp8", &qk_rms_norm_rope_split_fp8);
  m.impl("qk_rms_norm_rope_split_pack_into", &qk_rms_norm_rope_split_pack_into);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def("rms_norm_rope_split(Tensor x, Tensor weight, float eps, Tensor cos, Tensor sin) -> Tensor");
  m.def(
      "qk_rms_norm_rope_split(Tensor q, Tensor k, Tensor wq, Tensor wk, float eps, Tensor cos, Tensor sin)"
      " -> (Tensor, Tensor)");
  m.def(
      "qk_rms_norm_rope_split_pack(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor cos,"
      " Tensor sin, int parts) -> Tensor");
  m.def(
      "qk_rms_norm_rope_split_fp8(Tensor q, Tensor k, Tensor wq, Tensor wk, float eps, Tensor cos, Tensor sin,"
      " int groups) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "qk_rms_norm_rope_split_pack_into(Tensor q, Tensor k, Tensor v, Tensor wq, Tensor wk, float eps, Tensor cos,"
      " Tensor sin, Tensor(a!)[] outs) -> ()");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_rope_split(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_rope_split(m); }
