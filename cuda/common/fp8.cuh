// FP8 (e4m3) stores and scales shared by the kernels that write FP8: fp8.cu (per-row and per-head scales), and
// rope_3d.cu and rope_split.cu (the q/k norm + RoPE writing FP8 attention's inputs).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "dtype.cuh"

namespace ltxbench {

constexpr float kFp8Max = 448.f;  // largest finite e4m3

// VEC values times `mul` to e4m3 (round to nearest even, saturated), stored as one access.
template <int VEC> struct alignas(VEC) Fp8Vec {
  uint8_t v[VEC];
};

template <int VEC> __device__ __forceinline__ void store_fp8(uint8_t* q, const float (&y)[VEC], float mul) {
  Fp8Vec<VEC> out;
  if constexpr (VEC % 2 == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 2) {
      const __nv_fp8x2_storage_t pair =
          __nv_cvt_float2_to_fp8x2(make_float2(y[k] * mul, y[k + 1] * mul), __NV_SATFINITE, __NV_E4M3);
      out.v[k] = static_cast<uint8_t>(pair & 0xffu);
      out.v[k + 1] = static_cast<uint8_t>(pair >> 8);
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = __nv_cvt_float_to_fp8(y[k] * mul, __NV_SATFINITE, __NV_E4M3);
  }
  *reinterpret_cast<Fp8Vec<VEC>*>(q) = out;
}

// The power of two s with bound · s in (224, 448] (1 for a zero, NaN or infinite bound): values up to `bound` times
// s fit e4m3 unsaturated, and the descale 1 / s is exact, so data · descale is the quantized value itself. e4m3 is
// a float format: a scale up to 2x below amax-based costs range at the bottom (15 binades remain), not resolution.
// IEEE division, as torch computes 448 / bound in the reference.
__device__ __forceinline__ float fp8_pow2_scale(float bound) {
  if (!(bound > 0.f) || !isfinite(bound)) return 1.f;
  const float ratio = __fdiv_rn(kFp8Max, bound);
  if (!isfinite(ratio)) return 0x1p126f;
  int e = 0;
  frexpf(ratio, &e);  // ratio = m · 2^e, m in [0.5, 1)
  return ldexpf(1.f, max(-126, min(126, e - 1)));
}

// Block (g, t) of a launch over (groups, 2) with one warp a block: group g's FP8 scale for q (t = 0, norm weight wq)
// or k (t = 1, wk), fp8_pow2_scale of √D · max |w| over the group's D / groups channels (RMSNorm over D bounds a
// normalized value by √D · |w|, and the rotation keeps a pair's length, its channels in one group), into
// scale8[t · groups + g], and its reciprocal for every batch element into descale (B, groups) of q or k.
template <typename T>
__device__ __forceinline__ void weight_bound_scale(const void* wq, const void* wk, int64_t D, int64_t groups,
                                                   int64_t B, float* scale8, float* q_descale, float* k_descale) {
  const int64_t g = blockIdx.x, width = D / groups;
  const T* w = static_cast<const T*>(blockIdx.y ? wk : wq) + g * width;
  float m = 0.f;
  for (int64_t j = threadIdx.x; j < width; j += 32) m = fmaxf(m, fabsf(to_float<T>(w[j])));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float scale = fp8_pow2_scale(__fmul_rn(__fsqrt_rn(static_cast<float>(D)), m));
  if (threadIdx.x == 0) scale8[blockIdx.y * groups + g] = scale;
  float* descale = blockIdx.y ? k_descale : q_descale;
  for (int64_t b = threadIdx.x; b < B; b += 32) descale[b * groups + g] = 1.f / scale;
}

}  // namespace ltxbench
