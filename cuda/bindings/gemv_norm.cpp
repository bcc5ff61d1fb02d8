// An RMSNorm and the projection after it as one op: a decode step's input norm + q/k/v, and its residual add +
// post-attention norm + gate/up [+ SwiGLU] (gemv.cu, the GEMV with the norm folded into its loads), and the input norm +
// q/k/v ending in the RoPE and the static KV cache's writes. Other inputs (more rows than a decode step's, rows that
// are not whole 16-byte vectors) take the same math through ATen in fp32.
#include "bindings/checks.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ltxbench {

cudaError_t launch_norm_gemv(const GemmParams& p, const void* residual, void* h_out, const void* gamma,
                             float weight_offset, float eps, bool swiglu, DType dtype, cudaStream_t stream);  // gemv.cu
cudaError_t launch_norm_gemv_rope_cache(const GemmParams& p, const void* gamma, float weight_offset, float eps,
                                        int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t seq,
                                        const float* cos, const float* sin, int64_t table_rows, void* k_cache,
                                        void* v_cache, const int64_t* offset, int64_t cache_len, DType dtype,
                                        cudaStream_t stream);  // gemv.cu

namespace {

// The operands' shapes and dtypes; returns (tokens, K, N).
std::tuple<int64_t, int64_t, int64_t> check_norm_linear(const Tensor& x, const std::optional<Tensor>& residual,
                                                        const Tensor& norm_weight, const Tensor& weight,
                                                        const char* op) {
  check_primary(x, op, "x");
  TORCH_CHECK(x.dim() >= 1, "ltxbench.", op, ": x must have at least one dim (..., in_features)");
  const int64_t K = x.size(-1);
  if (residual) check_like(*residual, x, op, "residual", "x");
  check_same(norm_weight, x, op, "norm_weight");
  TORCH_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == K, "ltxbench.", op, ": norm_weight must be (", num(K),
              ",), got ", shape(norm_weight.sizes()));
  check_same(weight, x, op, "weight");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == K, "ltxbench.", op, ": weight must be (out_features, "
              "in_features) = (N, ", num(K), "), got ", shape(weight.sizes()));
  return {K ? x.numel() / K : 0, K, weight.size(0)};
}

// The same math through ATen in fp32, for the inputs the GEMV does not take.
Tensor norm_linear_aten(const Tensor& h, const Tensor& norm_weight, double eps, const Tensor& weight,
                        double weight_offset, bool swiglu) {
  const Tensor hf = h.to(at::kFloat);
  const Tensor rstd = hf.mul(hf).mean({-1}, true).add(eps).rsqrt();
  const Tensor normed = hf.mul(rstd).mul(norm_weight.to(at::kFloat).add(weight_offset));
  const Tensor out = at::linear(normed, weight.to(at::kFloat)).to(h.scalar_type());
  if (!swiglu) return out;
  const int64_t half = out.size(-1) / 2;  // [gate | up], each rounded as the GEMV stores it, then silu(gate) * up
  return at::silu(out.narrow(-1, 0, half).to(at::kFloat)).mul(out.narrow(-1, half, half).to(at::kFloat))
      .to(h.scalar_type());
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// out = rms_norm(h) @ weight.T [through a SwiGLU], h = x [+ residual] (returned as h_out when residual is given).
std::tuple<Tensor, Tensor> norm_linear(const Tensor& x, const std::optional<Tensor>& residual,
                                       const Tensor& norm_weight, double eps, const Tensor& weight,
                                       double weight_offset, const std::string& activation, const char* op) {
  const auto [tokens, K, N] = check_norm_linear(x, residual, norm_weight, weight, op);
  const DType dt = dtype_of(x, op, "x");
  TORCH_CHECK(activation == "none" || activation == "swiglu", "ltxbench.", op, ": activation must be 'none' or "
              "'swiglu', got '", activation, "'");
  const bool swiglu = activation == "swiglu";
  TORCH_CHECK(!swiglu || N % 2 == 0, "ltxbench.", op, ": activation 'swiglu' takes weight [gate | up] with an even "
              "number of rows, got ", num(N));
  const int64_t width = swiglu ? N / 2 : N;
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = width;
  Tensor h_out = residual ? at::empty(x.sizes(), x.options()) : Tensor();
  if (tokens == 0 || N == 0 || K == 0) {
    if (residual && tokens > 0) h_out.copy_(x.to(at::kFloat).add(residual->to(at::kFloat)).to(x.scalar_type()));
    // K = 0: rms of no elements; the sum over K is empty, so the product is zero whatever the scale
    return {at::zeros(out_sizes, x.options()), h_out};
  }
  const Tensor xr = x.reshape({tokens, K}).contiguous();
  const Tensor rr = residual ? residual->reshape({tokens, K}).contiguous() : Tensor();
  const Tensor g = norm_weight.contiguous();
  const Tensor w = weight.stride(1) == 1 && weight.stride(0) >= K ? weight : weight.contiguous();
  Tensor out = at::empty({tokens, width}, x.options());
  GemmParams p;
  p.tokens = tokens, p.n = N, p.k = K;
  p.x = xr.data_ptr(), p.ldx = K;
  p.w = w.data_ptr(), p.ldw = w.stride(0);
  p.out = out.data_ptr(), p.ldout = width;
  const int elem = static_cast<int>(x.element_size());
  const bool takes = tokens <= kGemvMaxRows && gemv_takes(p, elem) && aligned16(g.data_ptr()) &&
                     (!residual || (aligned16(rr.data_ptr()) && aligned16(h_out.data_ptr())));
  if (!takes) {
    const Tensor h = residual ? xr.to(at::kFloat).add(rr.to(at::kFloat)).to(x.scalar_type()) : xr;
    if (residual) h_out.copy_(h.view(x.sizes()));
    return {norm_linear_aten(h, g, eps, w, weight_offset, swiglu).view(out_sizes), h_out};
  }
  launch_checked(x, op, [&](cudaStream_t stream) {
    return launch_norm_gemv(p, residual ? rr.data_ptr() : nullptr, residual ? h_out.data_ptr() : nullptr,
                            g.data_ptr(), static_cast<float>(weight_offset), static_cast<float>(eps), swiglu, dt,
                            stream);
  });
  return {out.view(out_sizes), h_out};
}

Tensor rms_norm_linear(const Tensor& x, const Tensor& norm_weight, double eps, const Tensor& weight,
                       double weight_offset) {
  NOTE_SOURCE_USED();
  return std::get<0>(norm_linear(x, std::nullopt, norm_weight, eps, weight, weight_offset, "none", "rms_norm_linear"));
}

std::tuple<Tensor, Tensor> add_rms_norm_linear(const Tensor& x, const Tensor& residual, const Tensor& norm_weight,
                                               double eps, const Tensor& weight, double weight_offset,
                                               const std::string& activation) {
  NOTE_SOURCE_USED();
  return norm_linear(x, residual, norm_weight, eps, weight, weight_offset, activation, "add_rms_norm_linear");
}

// A decode step's input norm, q/k/v projection, neox RoPE (whole heads, per-token tables as rope_1d_cache takes them)
// and static KV cache writes as one op: x (B, S, K), weight [q | k | v] ((Hq + 2 Hk) hd, K), caches (B, Hk, L, hd);
// returns q rotated as rope_1d_cache does ((B, S, Hq, hd) seen as (B, Hq, S, hd)); k and v go to rows offset + s.
Tensor rms_norm_qkv_rope_cache(const Tensor& x, const Tensor& norm_weight, double eps, const Tensor& weight,
                               const Tensor& cos, const Tensor& sin, Tensor& k_cache, Tensor& v_cache,
                               const Tensor& offset, double weight_offset) {
  NOTE_SOURCE_USED();
  const char* op = "rms_norm_qkv_rope_cache";
  const auto [tokens, K, N] = check_norm_linear(x, std::nullopt, norm_weight, weight, op);
  const DType dt = dtype_of(x, op, "x");
  check_3d(x, op, "x");
  const int64_t B = x.size(0), S = x.size(1);
  for (auto [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    check_same(*t, x, op, name);
    TORCH_CHECK(t->dim() == 4 && t->size(0) == B && t->size(3) > 0 && t->size(3) % 2 == 0 && t->is_contiguous(),
                "ltxbench.", op, ": ", name, " must be a contiguous (B, Hk, length, head_dim) = (", num(B),
                ", Hk, length, even head_dim) cache, got ", shape(t->sizes()));
  }
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "ltxbench.", op, ": v_cache has shape ", shape(v_cache.sizes()),
              " but k_cache has ", shape(k_cache.sizes()));
  const int64_t Hk = k_cache.size(1), hd = k_cache.size(3), half = hd / 2, L = k_cache.size(2);
  TORCH_CHECK(Hk > 0 && N % hd == 0 && N / hd > 2 * Hk, "ltxbench.", op, ": weight must be [q | k | v] with ",
              "Hq + 2 Hk heads of head_dim ", num(hd), " rows (Hk = ", num(Hk), " from the cache), got ", num(N),
              " rows");
  const int64_t Hq = N / hd - 2 * Hk;
  for (auto [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_f32_table(*t, x, op, name, "x");
    TORCH_CHECK(t->dim() == 2 && t->sizes() == cos.sizes() && t->size(1) == half &&
                (t->size(0) == B * S || t->size(0) == S), "ltxbench.", op, ": ", name, " must be a per-token (",
                num(B * S), " or ", num(S), ", head_dim / 2 = ", num(half), ") table, got ", shape(t->sizes()));
  }
  TORCH_CHECK(offset.device() == x.device() && offset.scalar_type() == at::kLong && offset.numel() == 1,
              "ltxbench.", op, ": offset must be one int64 value on ", dev(x));
  Tensor q_out = at::empty({B, S, Hq, hd}, x.options());
  if (tokens == 0) return q_out.transpose(1, 2);
  const Tensor xr = x.reshape({tokens, K}).contiguous(), g = norm_weight.contiguous();
  const Tensor w = weight.stride(1) == 1 && weight.stride(0) >= K ? weight : weight.contiguous();
  const Tensor c = cos.contiguous(), sn = sin.contiguous(), off = offset.reshape({1});
  GemmParams p;
  p.tokens = tokens, p.n = N, p.k = K;
  p.x = xr.data_ptr(), p.ldx = K;
  p.w = w.data_ptr(), p.ldw = w.stride(0);
  p.out = q_out.data_ptr(), p.ldout = Hq * hd;
  if (tokens <= kGemvMaxRows && K > 0 && hd % 4 == 0 && gemv_takes(p, static_cast<int>(x.element_size())) &&
      aligned16(g.data_ptr())) {
    launch_checked(x, op, [&](cudaStream_t stream) {
      return launch_norm_gemv_rope_cache(p, g.data_ptr(), static_cast<float>(weight_offset), static_cast<float>(eps),
                                         Hq, Hk, hd, S, c.data_ptr<float>(), sn.data_ptr<float>(), c.size(0),
                                         k_cache.data_ptr(), v_cache.data_ptr(), off.data_ptr<int64_t>(), L, dt,
                                         stream);
    });
    return q_out.transpose(1, 2);
  }
  // The same math through ATen: the projection rounded as the GEMV stores it, the rotation in fp32, then the writes.
  const Tensor qkv = K ? norm_linear_aten(xr, g, eps, w, weight_offset, false) : at::zeros({tokens, N}, x.options());
  const auto table = [&](const Tensor& t) { return t.view({t.size(0) == S ? 1 : B, S, 1, half}); };
  const auto rotate = [&](const Tensor& t) {  // (B, S, heads, hd) -> rotated, in x's dtype
    const Tensor tf = t.to(at::kFloat), a = tf.narrow(-1, 0, half), b = tf.narrow(-1, half, half);
    const std::vector<Tensor> halves{a.mul(table(c)).sub(b.mul(table(sn))), b.mul(table(c)).add(a.mul(table(sn)))};
    return at::cat(halves, -1).to(x.scalar_type());
  };
  const Tensor heads = qkv.view({B, S, Hq + 2 * Hk, hd});
  q_out.copy_(rotate(heads.narrow(2, 0, Hq)));
  const Tensor rows = at::arange(S, off.options()).add(off);
  k_cache.index_copy_(2, rows, rotate(heads.narrow(2, Hq, Hk)).transpose(1, 2));
  v_cache.index_copy_(2, rows, heads.narrow(2, Hq + Hk, Hk).transpose(1, 2));
  return q_out.transpose(1, 2);
}

void register_gemv_norm(torch::Library& m) {
  m.impl("rms_norm_linear", &rms_norm_linear);
  m.impl("add_rms_norm_linear", &add_rms_norm_linear);
  m.impl("rms_norm_qkv_rope_cache", &rms_norm_qkv_rope_cache);
}

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.norm_linear");
  m.def("rms_norm_linear(Tensor x, Tensor norm_weight, float eps, Tensor weight, float weight_offset=0.0) -> Tensor");
  m.def("add_rms_norm_linear(Tensor x, Tensor residual, Tensor norm_weight, float eps, Tensor weight, "
        "float weight_offset=0.0, str activation='none') -> (Tensor, Tensor)");
  m.def("rms_norm_qkv_rope_cache(Tensor x, Tensor norm_weight, float eps, Tensor weight, Tensor cos, Tensor sin, "
        "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor offset, float weight_offset=0.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_gemv_norm(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_gemv_norm(m); }
