// Device helpers shared by the row-op kernels (norm.cu: the general kernels, norm_lean.cu: one row per block).
// CUDA headers only.
#pragma once
#include <cstdint>

#include "dtype.cuh"
#include "params.h"

namespace ltxbench {

template <typename T> struct RowPtrs {
  const T *x, *a, *gate, *scale, *shift;
  T *out, *h_out;
};

template <typename T> __device__ __forceinline__ const T* row_of(const Rows3& r, int64_t b, int64_t s) {
  return r.ptr ? static_cast<const T*>(r.ptr) + b * r.sb + s * r.ss : nullptr;
}

template <typename T> __device__ __forceinline__ RowPtrs<T> row_ptrs(const RowOpParams& p, int64_t row) {
  const int64_t b = row / p.S, s = row - b * p.S;
  RowPtrs<T> r;
  r.x = row_of<T>(p.x, b, s);
  r.a = row_of<T>(p.a, b, s);
  r.gate = row_of<T>(p.gate, b, s);
  r.scale = row_of<T>(p.scale, b, s);
  r.shift = row_of<T>(p.shift, b, s);
  r.out = p.out ? static_cast<T*>(p.out) + row * p.D : nullptr;  // none: fp8.cu writes its own output
  r.h_out = p.h_out ? static_cast<T*>(p.h_out) + row * p.D : nullptr;
  return r;
}

// The raw inputs of one vector of h: loaded together, before any arithmetic or store, so that all of a
// thread's loads are in flight at once.
template <typename T, int VEC> struct RawH {
  Vec<T, VEC> x, a, gate;
};

// ARITY: 1 = x only, 2 = x + a, 3 = x + a * gate; fixed at compile time so unused operands cost no registers.
// KEEP: loads with the L2 evict_last policy (load_raw_keep).
template <typename T, int VEC, int ARITY, bool KEEP = false>
__device__ __forceinline__ RawH<T, VEC> load_raw_h(const RowPtrs<T>& r, int64_t col) {
  RawH<T, VEC> raw;
  raw.x = load_raw_if_keep<T, VEC, KEEP>(r.x + col);
  if constexpr (ARITY >= 2) raw.a = load_raw_if_keep<T, VEC, KEEP>(r.a + col);
  if constexpr (ARITY >= 3) raw.gate = load_raw_if_keep<T, VEC, KEEP>(r.gate + col);
  return raw;
}

// h = x + a * gate (or x + a), rounded to T as the unfused model stores it before normalizing.
template <typename T, int VEC, int ARITY>
__device__ __forceinline__ void combine_h(const RawH<T, VEC>& raw, float (&h)[VEC]) {
  widen<T, VEC>(raw.x, h);
  if constexpr (ARITY == 1) return;
  float a[VEC];
  widen<T, VEC>(raw.a, a);
  if constexpr (ARITY == 3) {
    float g[VEC];
    widen<T, VEC>(raw.gate, g);
#pragma unroll
    for (int k = 0; k < VEC; ++k) h[k] += a[k] * g[k];
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) h[k] += a[k];
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) h[k] = round_to<T>(h[k]);
}

template <typename T, int VEC, int ARITY>
__device__ __forceinline__ void load_h(const RowPtrs<T>& r, int64_t col, float (&h)[VEC]) {
  combine_h<T, VEC, ARITY>(load_raw_h<T, VEC, ARITY>(r, col), h);
}

template <int VEC> __device__ __forceinline__ float first_pass_term(NormKind norm, const float (&h)[VEC]) {
  float acc = 0.f;  // Σh for LayerNorm (its mean), Σh² for RMSNorm
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc += norm == NormKind::Layer ? h[k] : h[k] * h[k];
  return acc;
}

// n * weight in fp32; cast_before_weight rounds n to T first and the product again (LlamaRMSNorm's order:
// weight * x.to(dtype)).
template <typename T, int VEC>
__device__ __forceinline__ void apply_weight(float (&n)[VEC], const float (&w)[VEC], bool cast_before_weight) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) n[k] = cast_before_weight ? round_to<T>(round_to<T>(n[k]) * w[k]) : n[k] * w[k];
}

// AdaLN modulation of a normalized value in fp32, c * rstd * (1 + scale) + shift with c = h - mean (h for
// RMSNorm), folded into one factor per channel: two instructions per element (the lean kernels). The general
// kernels (norm.cu) keep modulate() on n * rstd after the optional weight: the folded form there, for rows
// without a weight, cost 4-30 more registers per instantiation (ptxas -v), for rare shapes.
__device__ __forceinline__ float modulate_normalized(float c, float rstd, float scale, float shift) {
  return fmaf(c, fmaf(rstd, scale, rstd), shift);
}

// AdaLN modulation in fp32 of an already normalized (and weighted) n: n * (1 + scale) + shift.
template <int VEC>
__device__ __forceinline__ void modulate(float (&n)[VEC], const float (&scale)[VEC], const float (&shift)[VEC]) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) n[k] = n[k] * (1.f + scale[k]) + shift[k];
}

template <int VEC>
__device__ __forceinline__ void add_centered(const float (&h)[VEC], float mean, float (&s)[2]) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float d = h[k] - mean;
    s[0] += d;
    s[1] += d * d;
  }
}

struct RowStats {
  float mean = 0.f, rstd = 1.f;
};

// RMSNorm: rstd from Σh². IEEE sqrt and division: rsqrtf is off by up to 2 ulp.
__device__ __forceinline__ RowStats rms_stats(float sum_sq, float D, float eps) {
  return RowStats{0.f, 1.f / sqrtf(sum_sq / D + eps)};
}

// LayerNorm, corrected two-pass: with d = h - mean0, the variance is (Σd² - (Σd)²/D) / D and the mean
// is refined by Σd / D — accurate even when |mean| >> std.
__device__ __forceinline__ RowStats layer_stats(float mean0, const float (&s)[2], float D, float eps) {
  const float var = fmaxf((s[1] - s[0] * s[0] / D) / D, 0.f);
  return RowStats{mean0 + s[0] / D, 1.f / sqrtf(var + eps)};
}

inline bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// 16-byte accesses are legal only if every row of every operand starts on a 16-byte boundary.
template <typename T> inline bool vectorizable(const RowOpParams& p) {
  constexpr int V = vec_width<T>();
  if (p.D % V != 0) return false;
  for (const Rows3* r : {&p.x, &p.a, &p.gate, &p.scale, &p.shift}) {
    if (r->ptr && (!aligned(r->ptr, 16) || r->sb % V != 0 || r->ss % V != 0)) return false;
  }
  for (const void* ptr : {p.weight, static_cast<const void*>(p.out), static_cast<const void*>(p.h_out)}) {
    if (ptr && !aligned(ptr, 16)) return false;
  }
  return true;
}

// norm_lean.cu: launches the one-row-per-block kernel when `p` suits it; false leaves `p` to norm.cu.
bool try_launch_row_op_lean(const RowOpParams& p, DType dtype, cudaStream_t stream, cudaError_t* err);

}  // namespace ltxbench
