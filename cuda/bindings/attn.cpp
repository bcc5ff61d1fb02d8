// Cross-attention (attn.cu): softmax(q k^T * scale + mask) v per (batch, head), the mask additive per key; decode
// attention (decode_attn.cu): a decode step's packed query heads over the key/value cache, split over the keys.
#include "bindings/checks.h"

#include <ATen/ops/empty.h>

#include <cmath>
#include <cstdint>
#include <optional>

namespace ltxbench {
namespace {

// Is t laid out for `elems`-element loads: data pointer and every stride but the last multiples of that?
bool aligned_for(const Tensor& t, int64_t elems) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % (elems * t.element_size()) != 0) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) % elems != 0) return false;
  return true;
}

// q, k and v of one CUDA dtype and device, each 4-D (`layout` says how, in the error); returns the dtype.
DType check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const char* op, const char* layout) {
  const DType dt = check_primary(q, op, "q");
  check_same(k, q, op, "k", "q");
  check_same(v, q, op, "v", "q");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "ltxbench.", op, ": ", layout, ", got ",
              shape(q.sizes()), ", ", shape(k.sizes()), " and ", shape(v.sizes()));
  return dt;
}

Tensor cross_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const std::optional<Tensor>& mask,
                       std::optional<double> scale) {
  NOTE_SOURCE_USED();
  const char* op = "cross_attention";
  const DType dt = check_attention_inputs(q_in, k_in, v_in, op, "q, k and v must be 4-D (B, S|L, heads, head_dim)");
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
  launch_checked(q, op, [&](cudaStream_t stream) { return launch_cross_attention(p, dt, major, stream); });
  return out;
}

Tensor decode_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const std::optional<Tensor>& mask,
                        std::optional<double> scale) {
  NOTE_SOURCE_USED();
  const char* op = "decode_attention";
  const DType dt = check_attention_inputs(q_in, k_in, v_in, op,
                                          "q must be (B, kv_heads, groups, head_dim) and k, v (B, kv_heads, L, "
                                          "head_dim)");
  const int64_t B = q_in.size(0), H = q_in.size(1), G = q_in.size(2), hd = q_in.size(3), L = k_in.size(2);
  TORCH_CHECK(k_in.size(0) == B && k_in.size(1) == H && k_in.size(3) == hd, "ltxbench.", op, ": k has shape ",
              shape(k_in.sizes()), " but q has ", shape(q_in.sizes()), " (B, kv_heads and head_dim must match)");
  TORCH_CHECK(v_in.sizes() == k_in.sizes(), "ltxbench.", op, ": v has shape ", shape(v_in.sizes()), " but k has ",
              shape(k_in.sizes()));
  TORCH_CHECK(hd <= 256, "ltxbench.", op, ": head_dim must be <= 256, got ", num(hd));
  TORCH_CHECK(B <= 65535 && H * G <= 65535, "ltxbench.", op, ": batch and query heads must each be <= 65535, got ",
              num(B), " and ", num(H * G));
  DecodeAttnParams p;
  if (mask) {
    TORCH_CHECK(mask->device() == q_in.device(), "ltxbench.", op, ": mask is on ", dev(*mask), " but q is on ",
                dev(q_in));
    const auto type = mask->scalar_type();
    TORCH_CHECK(type == at::kBool || type == at::kFloat || type == q_in.scalar_type(), "ltxbench.", op,
                ": mask must be bool (true keeps a key), float32 or q's dtype (", dtype_name(q_in), "), got ",
                dtype_name(*mask));
    TORCH_CHECK(mask->dim() == 4 && (mask->size(0) == B || mask->size(0) == 1) && mask->size(1) == 1 &&
                    mask->size(2) == 1 && mask->size(3) == L,
                "ltxbench.", op, ": mask must be per key, shared by heads and queries: (B|1, 1, 1, L) = (", num(B),
                "|1, 1, 1, ", num(L), "), got ", shape(mask->sizes()));
    p.mask = mask->data_ptr();
    p.mask_kind = type == at::kBool ? DecodeMask::Bool : type == at::kFloat ? DecodeMask::F32 : DecodeMask::SameAsQ;
    p.mask_sb = row_stride(*mask, 0), p.mask_sl = mask->stride(3);
  }
  Tensor out = at::empty({B, H, G, hd}, q_in.options());
  if (out.numel() == 0) return out;
  const Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in), v = unit_last_stride(v_in);
  const int64_t elems = decode_attention_lane_elems(hd);
  p.B = B, p.H = H, p.G = G, p.L = L, p.hd = hd;
  p.q = q.data_ptr(), p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_sg = q.stride(2);
  p.k = k.data_ptr(), p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_sl = k.stride(2);
  p.v = v.data_ptr(), p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_sl = v.stride(2);
  p.vectorized = hd == 32 * elems && aligned_for(q, elems) && aligned_for(k, elems) && aligned_for(v, elems);
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(hd)));
  p.out = out.data_ptr();
  const int64_t splits = decode_attention_splits(B, H, G, L, hd);
  Tensor part;  // the splits' partial rows, then their (max, sum) pairs
  if (splits > 1) part = at::empty({B * H * G * splits * (hd + 2)}, q_in.options().dtype(at::kFloat));
  float* rows = splits > 1 ? part.data_ptr<float>() : nullptr;
  float* stats = splits > 1 ? rows + B * H * G * splits * hd : nullptr;
  launch_checked(q, op, [&](cudaStream_t stream) {
    return launch_decode_attention(p, dt, splits, rows, stats, stream);
  });
  return out;
}

void register_attn(torch::Library& m) {
  m.impl("cross_attention", &cross_attention);
  m.impl("decode_attention", &decode_attention);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def("cross_attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, float? scale=None) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, float? scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_attn(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_attn(m); }
