// The 1-D RoPE of LLMs (rope_1d.cu): neox or interleaved pairs, angles from tables gathered at positions.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <optional>
#include <tuple>
#include <vector>

namespace ltxbench {
namespace {

// q (B, Hq, S, hd) and k (B, Hk, S, hd) with their tables, gathered at positions or per token: the checks, then the
// params without outputs. Tensors that must outlive the launch go to `keep`.
Rope1dParams rope1d_params(const Tensor& q_in, const Tensor& k_in, const Tensor& cos, const Tensor& sin,
                           const std::optional<Tensor>& positions, bool interleaved, const char* op,
                           std::vector<Tensor>& keep) {
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
  keep.insert(keep.end(), {q, k, c, s, pos});
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
  return p;
}

void run_rope_1d(const Rope1dParams& p, DType dt, const Tensor& q, const char* op) {
  launch_checked(q, op, [&](cudaStream_t stream) { return launch_rope_1d(p, dt, stream); });
}

std::tuple<Tensor, Tensor> rope_1d(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                                   const std::optional<Tensor>& positions, bool interleaved) {
  NOTE_SOURCE_USED();
  const char* op = "rope_1d";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope1dParams p = rope1d_params(q, k, cos, sin, positions, interleaved, op, keep);
  // Token-major outputs (B, S, H, hd) seen as (B, H, S, hd): see rope1d_kernel.
  Tensor q_out = at::empty({p.B, p.S, p.Hq, p.hd}, q.options()).transpose(1, 2);
  Tensor k_out = at::empty({p.B, p.S, p.Hk, p.hd}, k.options()).transpose(1, 2);
  p.q_out = q_out.data_ptr(), p.k_out = k_out.data_ptr();
  run_rope_1d(p, dt, q, op);
  return {q_out, k_out};
}

// rope_1d without positions, its k and v written into a static KV cache at rows offset + s instead of returned
// (a decode step: one kernel for the rotation and both cache writes): returns q rotated, as rope_1d does.
Tensor rope_1d_cache(const Tensor& q, const Tensor& k, const Tensor& v_in, const Tensor& cos, const Tensor& sin,
                     Tensor& k_cache, Tensor& v_cache, const Tensor& offset, bool interleaved) {
  NOTE_SOURCE_USED();
  const char* op = "rope_1d_cache";
  const DType dt = check_primary(q, op, "q");
  std::vector<Tensor> keep;
  Rope1dParams p = rope1d_params(q, k, cos, sin, std::nullopt, interleaved, op, keep);
  check_same(v_in, q, op, "v", "q");
  TORCH_CHECK(v_in.sizes() == k.sizes(), "ltxbench.", op, ": v must have k's shape ", shape(k.sizes()), ", got ",
              shape(v_in.sizes()));
  for (auto [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    check_same(*t, q, op, name, "q");
    TORCH_CHECK(t->dim() == 4 && t->size(0) == p.B && t->size(1) == p.Hk && t->size(3) == p.hd && t->is_contiguous(),
                "ltxbench.", op, ": ", name, " must be a contiguous (B, Hk, length, head_dim) = (", num(p.B), ", ",
                num(p.Hk), ", length, ", num(p.hd), ") cache, got ", shape(t->sizes()));
  }
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "ltxbench.", op, ": v_cache has shape ", shape(v_cache.sizes()),
              " but k_cache has ", shape(k_cache.sizes()));
  TORCH_CHECK(offset.device() == q.device() && offset.scalar_type() == at::kLong && offset.numel() == 1,
              "ltxbench.", op, ": offset must be one int64 value on ", dev(q));
  const Tensor v = unit_last_stride(v_in), off = offset.reshape({1});
  Tensor q_out = at::empty({p.B, p.S, p.Hq, p.hd}, q.options()).transpose(1, 2);
  p.v = v.data_ptr(), p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_ss = v.stride(2);
  p.q_out = q_out.data_ptr();
  p.k_cache = k_cache.data_ptr(), p.v_cache = v_cache.data_ptr();
  p.cache_offset = off.data_ptr<int64_t>(), p.cache_len = k_cache.size(2);
  run_rope_1d(p, dt, q, op);
  return q_out;
}

void register_rope_1d(torch::Library& m) {
  m.impl("rope_1d", &rope_1d);
  m.impl("rope_1d_cache", &rope_1d_cache);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def(
      "rope_1d(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? positions=None, bool interleaved=False)"
      " -> (Tensor, Tensor)");
  m.def(
      "rope_1d_cache(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache,"
      " Tensor offset, bool interleaved=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_rope_1d(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_rope_1d(m); }
