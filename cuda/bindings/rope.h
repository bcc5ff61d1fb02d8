// Shared by the RoPE bindings: the packed q/k/v outputs written through `outs` (rope_3d.cpp, rope_split.cpp), and
// the fused q/k norm + 3-D RoPE's checks and launch, defined in rope_3d.cpp and reused by its FP8 form (fp8.cpp).
#pragma once
#include <ATen/ops/empty.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings/checks.h"

namespace ltxbench {

// The FP8 outputs of the q/k norm + RoPE kernels (fp8.cpp, rope_split.cpp): e4m3 q and k of q's shape, their
// descales (B, groups) and the 2 · groups scales the kernels' first launch writes (q's, then k's).
struct Fp8QkOutputs {
  Tensor q, q_descale, k, k_descale, scales;
};

// The outputs made and attached to the params `p` (Rope3dParams or RopeSplitParams: their q_out, k_out, scale8,
// q_descale and k_descale), for `groups` groups of heads over p.B batch elements.
template <typename Params>
Fp8QkOutputs fp8_qk_outputs(Params& p, const Tensor& q, int64_t groups) {
  const auto fp8 = q.options().dtype(at::kFloat8_e4m3fn), f32 = q.options().dtype(at::kFloat);
  Fp8QkOutputs o{at::empty(q.sizes(), fp8), at::empty({p.B, groups}, f32), at::empty(q.sizes(), fp8),
                 at::empty({p.B, groups}, f32), at::empty({2 * groups}, f32)};
  p.q_out = o.q.data_ptr(), p.k_out = o.k.data_ptr(), p.scale8 = o.scales.data_ptr<float>();
  p.q_descale = o.q_descale.data_ptr<float>(), p.k_descale = o.k_descale.data_ptr<float>();
  return o;
}

// `outs` as the parts of a packed q/k/v output, each (B, S, 3, chunk), contiguous, q's dtype, on q's device (a peer
// GPU's memory mapped here counts as q's device): their pointers into part_out, the first also as `packed`.
inline void attach_parts(void** part_out, void*& packed, at::TensorList outs, const Tensor& q, int64_t chunk,
                         const char* op) {
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
inline int64_t parts_of(at::TensorList outs, int64_t total, const char* what, const char* op) {
  const auto parts = static_cast<int64_t>(outs.size());
  TORCH_CHECK(parts >= 1 && parts <= kMaxPackParts && total % parts == 0, "ltxbench.", op, ": outs must hold 1 to ",
              num(kMaxPackParts), " tensors, as many as divide ", what, " (", num(total), "), got ", num(parts));
  return parts;
}

// qk_rms_norm_rope's checks and params (outputs not yet attached). Tensors that must outlive the launch go to `keep`.
Rope3dParams qk_norm_rope_params(const Tensor& q, const Tensor& k, const Tensor& wq, const Tensor& wk, double eps,
                                 const std::optional<Tensor>& cos, const std::optional<Tensor>& sin,
                                 const std::optional<Tensor>& grid, const std::optional<Tensor>& freqs, const char* op,
                                 std::vector<Tensor>& keep);

// The launch on q's device and stream, with its error named after the op.
void launch_3d_checked(const Rope3dParams& p, DType dt, const Tensor& q, const char* op);

}  // namespace ltxbench
