// LTX-Video's 3-D RoPE (rope_3d.cu): interleaved pairs over the whole inner dim, alone or after the q/k RMSNorm,
// with the packed q/k/v outputs of the Ulysses and ring exchanges.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <optional>
#include <tuple>
#include <vector>

#include "bindings/rope.h"

namespace ltxbench {
namespace {

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
      // (B|1, S, D), or (B|1, S, P) repeated across the row: P even, dividing D (Wan's tables, one head wide)
      const int64_t P = t->dim() == 3 ? t->size(2) : -1;
      TORCH_CHECK(t->dim() == 3 && (t->size(0) == B || t->size(0) == 1) && t->size(1) == S &&
                      (P == D || (P > 0 && P % 2 == 0 && D % P == 0)),
                  "ltxbench.", op, ": ", name, " must have shape (B|1, S, D) = (", num(B), "|1, ", num(S), ", ",
                  num(D), ") or (B|1, S, P) with P even dividing D, got ", shape(t->sizes()));
      TORCH_CHECK(p.table_period == 0 || p.table_period == P, "ltxbench.", op,
                  ": cos and sin must have the same width, got ", num(p.table_period), " and ", num(P));
      p.table_period = P;
      keep.push_back(unit_last_stride(*t).expand({B, S, P}));
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
  check_like(k, q, op, "k", "q");
  TORCH_CHECK(q.size(2) % 2 == 0, "ltxbench.", op, ": the inner dim D must be even (pairs), got ", num(q.size(2)));
  keep.push_back(unit_last_stride(q));
  keep.push_back(unit_last_stride(k));
  Rope3dParams p;
  p.B = q.size(0), p.S = q.size(1), p.D = q.size(2);
  p.q = rows_of_3d(keep[keep.size() - 2]);
  p.k = rows_of_3d(keep.back());
  return p;
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
  NOTE_SOURCE_USED();
  const char* op = "rope_3d";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = rope_3d_params(q, k, op, keep);
  attach_ltx_angles(p, q, cos, sin, grid, freqs, op, keep);
  return run_rope_3d(p, dt, q, op);
}

}  // namespace

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

void launch_3d_checked(const Rope3dParams& p, DType dt, const Tensor& q, const char* op) {
  launch_checked(q, op, [&](cudaStream_t stream) { return launch_rope_3d(p, dt, stream); });
}

namespace {

std::tuple<Tensor, Tensor> qk_rms_norm_rope(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk,
                                            double eps, const std::optional<Tensor>& cos,
                                            const std::optional<Tensor>& sin, const std::optional<Tensor>& grid,
                                            const std::optional<Tensor>& freqs) {
  NOTE_SOURCE_USED();
  const char* op = "qk_rms_norm_rope";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope3dParams p = qk_norm_rope_params(q, k, wq, wk, eps, cos, sin, grid, freqs, op, keep);
  return run_rope_3d(p, dt, q, op);
}

// v (B, S, D) beside q for the packed outputs, copied as it is: its checks, then its rows in the params.
void attach_v(Rope3dParams& p, const Tensor& v, const Tensor& q, const char* op, std::vector<Tensor>& keep) {
  check_like(v, q, op, "v", "q");
  keep.push_back(unit_last_stride(v));
  p.v = rows_of_3d(keep.back());
}

Tensor qk_rms_norm_rope_pack(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                             double eps, const std::optional<Tensor>& cos, const std::optional<Tensor>& sin,
                             const std::optional<Tensor>& grid, const std::optional<Tensor>& freqs, int64_t parts) {
  NOTE_SOURCE_USED();
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

// qk_rms_norm_rope_pack with part r written to outs[r] instead of one fresh buffer: a rank of a Ulysses exchange
// writes its peers' parts straight into their receive buffers.
void qk_rms_norm_rope_pack_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wq, const Tensor& wk,
                                double eps, const std::optional<Tensor>& cos, const std::optional<Tensor>& sin,
                                const std::optional<Tensor>& grid, const std::optional<Tensor>& freqs,
                                at::TensorList outs) {
  NOTE_SOURCE_USED();
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
  NOTE_SOURCE_USED();
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

void register_rope_3d(torch::Library& m) {
  m.impl("rope_3d", &rope_3d);
  m.impl("qk_rms_norm_rope", &qk_rms_norm_rope);
  m.impl("qk_rms_norm_rope_pack", &qk_rms_norm_rope_pack);
  m.impl("qk_rms_norm_rope_pack_into", &qk_rms_norm_rope_pack_into);
  m.impl("qk_rms_norm_rope_kv", &qk_rms_norm_rope_kv);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
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
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_rope_3d(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_rope_3d(m); }
