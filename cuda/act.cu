// Activations of the feed-forward blocks: GELU (exact or tanh) and SiLU, plain or gated (GEGLU, SwiGLU).
// Elementwise over (rows, H) outputs; the gated forms read the value and the gate halves of 2H-wide rows.
#include "common/dtype.cuh"
#include "common/params.h"
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

enum Act : int { kGeluErf = 0, kGeluTanh = 1, kSilu = 2 };

// fp32 math with the accurate libm functions, as PyTorch computes these in fp32 "opmath". FAST (16-bit outputs
// only): GELU-tanh as g * sigmoid(2u) and SiLU as g * sigmoid(g), each one MUFU exp and one MUFU reciprocal
// (__expf, __fdividef: a few fp32 ulp, far below the 2^-8 / 2^-11 of the rounded result) instead of tanhf /
// expf + IEEE division, which left these kernels instruction-bound on the H200.
template <int ACT, bool FAST> __device__ __forceinline__ float activate(float g) {
  if constexpr (ACT == kGeluErf) {
    return 0.5f * g * (1.f + erff(g * 0.70710678118654752f));
  } else if constexpr (ACT == kGeluTanh) {
    const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
    if constexpr (FAST) return __fdividef(g, 1.f + __expf(-2.f * inner));
    return 0.5f * g * (1.f + tanhf(inner));
  } else {
    if constexpr (FAST) return __fdividef(g, 1.f + __expf(-g));
    return g / (1.f + expf(-g));
  }
}

// One VEC-wide output chunk per thread. Activation and gating are compile-time and ungated contiguous rows
// are one flat array (no row/column division): GELU-tanh sits near the instruction limit on H100, and with the
// run-time switch and the division it reached 86% of the copy peak at 2x8064x8192, now 98% (as torch's F.gelu).
template <typename T, int VEC, int ACT, bool GATED, bool FAST>
__global__ void act_kernel(ActParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    const int64_t chunks = p.H / VEC;
    const int64_t total = p.rows * chunks;
    const bool small = total < (int64_t{1} << 32);
    const bool flat = !GATED && (p.row_stride == p.H || p.rows == 1);
    const T* x = static_cast<const T*>(p.x);
    T* out = static_cast<T*>(p.out);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float y[VEC];
      if (flat) {
        load_vec_keep<T, VEC>(x + i * VEC, y);
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = activate<ACT, FAST>(y[k]);
        store_vec<T, VEC>(out + i * VEC, y);
        continue;
      }
      // 32-bit division where it fits: 64-bit division costs ~70 instructions.
      const int64_t row = small ? static_cast<uint32_t>(i) / static_cast<uint32_t>(chunks) : i / chunks;
      const int64_t col = (i - row * chunks) * VEC;
      const T* xr = x + row * p.row_stride;
      if constexpr (GATED) {
        float v[VEC], g[VEC];
        const int64_t value_off = p.gate_half == 0 ? p.H : 0;
        const int64_t gate_off = p.gate_half == 0 ? 0 : p.H;
        // Both loads issued first. The L2 hint (load_raw_keep) makes SwiGLU 2% faster (4096 tokens) and the
        // exact-GELU GEGLU, the instruction-bound one, 2% slower (H200,
        // docs/tuning.md#row-kernels-norms-residuals-modulation).
        constexpr bool keep = ACT != kGeluErf;
        const Vec<T, VEC> rv = load_raw_if_keep<T, VEC, keep>(xr + value_off + col);
        const Vec<T, VEC> rg = load_raw_if_keep<T, VEC, keep>(xr + gate_off + col);
        to_floats<T, VEC>(rv, v);
        to_floats<T, VEC>(rg, g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = v[k] * activate<ACT, FAST>(g[k]);
      } else {
        load_vec_keep<T, VEC>(xr + col, y);
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = activate<ACT, FAST>(y[k]);
      }
      store_vec<T, VEC>(out + row * p.H + col, y);
    }
  }
}

template <typename T> bool vectorizable(const ActParams& p) {
  constexpr int V = vec_width<T>();
  return p.H % V == 0 && p.row_stride % V == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
}

// The fast forms for 16-bit outputs; LTXBENCH_ACT_FAST=0 keeps the libm forms everywhere (A/B sweeps).
bool fast_math_off() {
  static const bool off = tuning_off("LTXBENCH_ACT_FAST");
  return off;
}

template <typename T, int VEC, int ACT, bool GATED>
cudaError_t launch_act_with(const ActParams& p, cudaStream_t stream) {
  constexpr int threads = 256;
  const int64_t total = p.rows * (p.H / VEC);
  const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
  // One vector per thread: the loads of all resident blocks are in flight while others compute.
  if constexpr (sizeof(T) == 2 && ACT != kGeluErf) {
    if (!fast_math_off()) {
      act_kernel<T, VEC, ACT, GATED, true><<<blocks, threads, 0, stream>>>(p);
      return cudaGetLastError();
    }
  }
  act_kernel<T, VEC, ACT, GATED, false><<<blocks, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int VEC> cudaError_t launch_with(const ActParams& p, cudaStream_t stream) {
  if (p.gated) {
    if (p.act == kGeluErf) return launch_act_with<T, VEC, kGeluErf, true>(p, stream);
    if (p.act == kGeluTanh) return launch_act_with<T, VEC, kGeluTanh, true>(p, stream);
    return launch_act_with<T, VEC, kSilu, true>(p, stream);
  }
  if (p.act != kGeluTanh) return cudaErrorInvalidValue;  // the bindings pair ungated only with GELU-tanh
  return launch_act_with<T, VEC, kGeluTanh, false>(p, stream);
}

template <typename T> cudaError_t launch_typed(const ActParams& p, cudaStream_t stream) {
  return vectorizable<T>(p) ? launch_with<T, vec_width<T>()>(p, stream) : launch_with<T, 1>(p, stream);
}

}  // namespace

cudaError_t launch_act(const ActParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.rows == 0 || p.H == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
