// The modulated LayerNorm and the gated residual with float32 modulation over 16-bit rows: Wan's blocks keep their
// AdaLN tables and time embedding in float32 and round once, after the modulation or the gated add, where the row
// ops of norm.cu / norm_lean.cu take scale, shift and gate in the rows' dtype. One row per block; the row stays in
// registers between its statistics and its output.
//   LayerNorm: out = round((x - mean) * rstd * (1 + scale) + shift)   (mean, rstd in fp32, corrected two-pass)
//   residual:  out = round(x + a * gate)
// The products and sums are IEEE single roundings in torch's order (no fused multiply-add), as Wan's fp32 ops run.
#include "common/dtype.cuh"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/row_math.cuh"
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

constexpr int kMaxThreads = 1024;
static_assert(kMaxF32ModulationRow <= 8 * kMaxThreads, "a row must fit 8 values per thread unvectorized");

__device__ __forceinline__ const float* f32_row(const Rows3& r, int64_t b, int64_t s) {
  return static_cast<const float*>(r.ptr) + b * r.sb + s * r.ss;
}

// Every thread holds VPT vectors of VEC values, vector i at column (i * blockDim.x + threadIdx.x) * VEC.
template <typename T, int VEC, int VPT, bool LAYER>
__global__ void __launch_bounds__(kMaxThreads) f32_modulation_kernel(const RowOpParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    const int64_t s = blockIdx.x, b = blockIdx.y;
    const T* x = static_cast<const T*>(p.x.ptr) + b * p.x.sb + s * p.x.ss;
    T* out = static_cast<T*>(p.out) + (b * p.S + s) * p.D;
    float h[VPT][VEC];
    bool valid[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
      valid[i] = col < p.D;
      if (valid[i]) load_vec<T, VEC>(x + col, h[i]);
    }
    if constexpr (!LAYER) {
      const T* a = static_cast<const T*>(p.a.ptr) + b * p.a.sb + s * p.a.ss;
      const float* gate = f32_row(p.gate, b, s);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (!valid[i]) continue;
        const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
        float av[VEC], g[VEC];
        load_vec<T, VEC>(a + col, av);
        load_f32<VEC>(gate + col, g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) h[i][k] = __fadd_rn(h[i][k], __fmul_rn(av[k], g[k]));
        store_vec<T, VEC>(out + col, h[i]);
      }
    } else {
      __shared__ float smem[32 * 2];
      const float inv_d = 1.f / static_cast<float>(p.D);
      float sum[1] = {0.f};
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (!valid[i]) continue;
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum[0] += h[i][k];
      }
      row_group_sum<1>(sum, blockDim.x, smem);
      const float first = sum[0] * inv_d;
      float dq[2] = {0.f, 0.f};  // Σd and Σd² around the first mean: exact even where |mean| >> std
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (valid[i]) add_centered<VEC>(h[i], first, dq);
      }
      row_group_sum<2>(dq, blockDim.x, smem);
      const float mean = first + dq[0] * inv_d;
      const float var = fmaxf((dq[1] - dq[0] * dq[0] * inv_d) * inv_d, 0.f);
      const float rstd = 1.f / sqrtf(var + p.eps);
      const float* scale = f32_row(p.scale, b, s);
      const float* shift = f32_row(p.shift, b, s);
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (!valid[i]) continue;
        const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
        float sc[VEC], sh[VEC];
        load_f32<VEC>(scale + col, sc);
        load_f32<VEC>(shift + col, sh);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float n = __fmul_rn(h[i][k] - mean, rstd);
          h[i][k] = __fadd_rn(__fmul_rn(n, __fadd_rn(1.f, sc[k])), sh[k]);
        }
        store_vec<T, VEC>(out + col, h[i]);
      }
    }
  }
}

// Vectors a thread holds: 4 for the LayerNorm rows, whatever their width (an H200 sweep of 1/2/4/8 on Wan's bf16
// rows, 32760 x 1536 / 5120: 4 won both, 68.3 / 208.2 us against 106.4 / 433.1 at one vector a thread, whose wide
// blocks spend their time in the two block-wide reductions); the gated residual, with no reduction, holds one.
// LTXBENCH_F32_MOD_VPT=1/2/4/8 overrides it (docs/tuning.md).
constexpr int kLayerNormVectors = 4;

template <typename T, int VEC, bool LAYER> cudaError_t launch_vec(const RowOpParams& p, cudaStream_t stream) {
  static const int knob = tuning_knob("LTXBENCH_F32_MOD_VPT");
  const int64_t vectors = (p.D + VEC - 1) / VEC;
  const int64_t held = knob > 0 ? (knob < 8 ? knob : 8) : (LAYER ? kLayerNormVectors : 1);
  const int64_t wanted = (vectors + held - 1) / held;
  const int threads = static_cast<int>(wanted >= kMaxThreads ? kMaxThreads : (wanted + 31) / 32 * 32);
  const int64_t per_thread = (vectors + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(p.S), static_cast<unsigned>(p.B));
  if (per_thread <= 1) f32_modulation_kernel<T, VEC, 1, LAYER><<<grid, threads, 0, stream>>>(p);
  else if (per_thread <= 2) f32_modulation_kernel<T, VEC, 2, LAYER><<<grid, threads, 0, stream>>>(p);
  else if (per_thread <= 4) f32_modulation_kernel<T, VEC, 4, LAYER><<<grid, threads, 0, stream>>>(p);
  else if (per_thread <= 8) f32_modulation_kernel<T, VEC, 8, LAYER><<<grid, threads, 0, stream>>>(p);
  else return cudaErrorInvalidValue;  // wider rows are refused by the binding first (kMaxF32ModulationRow)
  return cudaGetLastError();
}

// 16-byte rows (8 values of a 16-bit type) where every row of every operand starts on 16 bytes; else one value per
// access. (row_math.cuh's vectorizable takes every operand in the rows' dtype.)
template <typename T> bool vectorizable_f32_modulation(const RowOpParams& p, bool layer) {
  constexpr int V = vec_width<T>();
  if (p.D % V != 0 || !aligned(p.out, 16)) return false;
  const Rows3* rows16[] = {&p.x, layer ? nullptr : &p.a};
  for (const Rows3* r : rows16) {
    if (r && (!aligned(r->ptr, 16) || r->sb % V != 0 || r->ss % V != 0)) return false;
  }
  const Rows3* rows32[] = {layer ? &p.scale : &p.gate, layer ? &p.shift : nullptr};
  for (const Rows3* r : rows32) {  // float32: V values are 2 x 16 bytes, so 4-element strides keep the alignment
    if (r && (!aligned(r->ptr, 16) || r->sb % 4 != 0 || r->ss % 4 != 0)) return false;
  }
  return true;
}

}  // namespace

cudaError_t launch_row_op_f32_modulation(const RowOpParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.B == 0 || p.S == 0 || p.D == 0) return cudaSuccess;
  const bool layer = p.norm == NormKind::Layer;
  return dispatch_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (sizeof(T) != 2) {
      return cudaErrorInvalidValue;  // float32 rows take the row ops of norm.cu
    } else {
      constexpr int V = vec_width<T>();
      if (vectorizable_f32_modulation<T>(p, layer)) {
        return layer ? launch_vec<T, V, true>(p, stream) : launch_vec<T, V, false>(p, stream);
      }
      return layer ? launch_vec<T, 1, true>(p, stream) : launch_vec<T, 1, false>(p, stream);
    }
  });
}

}  // namespace ltxbench
