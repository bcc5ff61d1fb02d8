// Element types, fp32 conversions and 16-byte vectors for the kernels. CUDA headers only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "params.h"

namespace ltxbench {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Round-trip through T: what the unfused PyTorch code gets when it stores an intermediate in T.
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_float<T>(from_float<T>(v)); }

// N elements of T loaded/stored as one access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Read-only-path load of one vector (ld.global.nc): inputs are never written by the kernel that reads them.
template <typename T, int N> __device__ __forceinline__ Vec<T, N> load_raw(const T* p) {
  Vec<T, N> v;
  if constexpr (sizeof(Vec<T, N>) == 16) {
    *reinterpret_cast<int4*>(&v) = __ldg(reinterpret_cast<const int4*>(p));
  } else {  // narrower than 16 bytes: the scalar paths, which must work at any element alignment
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = p[k];
  }
  return v;
}

// One vector loaded with an L2 evict_last policy (what Triton emits for eviction_policy='evict_last'): the row
// inputs (x, a, gate) of the row kernels, the activations' inputs, q/k of rope_3d and rope_1d. Measured with
// bench micro's timer resetting persisting L2 lines before each flush (H200): plain, evict-first and read-only-path
// (__ldg) loads instead are 2.2% / 4.3% / 3.2% slower (geomean over 47 row-op and SwiGLU shapes). Left without it,
// slower with it: LayerNorm rows (1.1-4.5% at the LTX shapes), the exact-GELU GEGLU (2%), the fused q/k norm +
// RoPE (16-19%; docs/tuning.md#row-kernels-norms-residuals-modulation). Lines loaded so survive a memset of
// the whole L2: the earlier A/Bs, timed before that reset, partly measured L2 reads (RMSNorm 1x1024x2048
// "7.8 -> 6.4 us"; docs/tuning.md#measuring-method).
template <typename T, int N> __device__ __forceinline__ Vec<T, N> load_raw_keep(const T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return load_raw<T, N>(p);  // cache policies are sm_80+
#else
  if constexpr (sizeof(Vec<T, N>) == 16) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    int4 r;
    asm("ld.global.L1::evict_last.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p), "l"(policy));
    Vec<T, N> v;
    *reinterpret_cast<int4*>(&v) = r;
    return v;
  } else {
    return load_raw<T, N>(p);
  }
#endif
}

// load_raw_keep where KEEP, else load_raw: for kernels whose instantiations differ in whether the hint pays.
template <typename T, int N, bool KEEP> __device__ __forceinline__ Vec<T, N> load_raw_if_keep(const T* p) {
  if constexpr (KEEP) return load_raw_keep<T, N>(p);
  else return load_raw<T, N>(p);
}

template <typename T, int N> __device__ __forceinline__ void to_floats(const Vec<T, N>& raw, float (&out)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_float<T>(raw.v[k]);
}

// Row kernels: bf16 vectors widened a 32-bit word (two elements) at a time, by shift and mask, where sm_90's
// cvt.f32.bf16 takes each element unpacked into a register of its own: the modulated norms 53-55 -> 40-49
// registers (ptxas). Not in the activation kernels, where it cost GEGLU 7% (docs/tuning.md#activations).
template <typename T, int N> __device__ __forceinline__ void widen(const Vec<T, N>& raw, float (&out)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&raw);
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else {
    to_floats<T, N>(raw, out);
  }
}

template <typename T, int N> __device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
  to_floats<T, N>(load_raw<T, N>(p), out);
}

template <typename T, int N> __device__ __forceinline__ void load_vec_keep(const T* p, float (&out)[N]) {
  to_floats<T, N>(load_raw_keep<T, N>(p), out);
}

// N floats rounded to T, packed as one vector.
template <typename T, int N> __device__ __forceinline__ Vec<T, N> pack(const float (&in)[N]) {
  Vec<T, N> raw;
#pragma unroll
  for (int k = 0; k < N; ++k) raw.v[k] = from_float<T>(in[k]);
  return raw;
}

template <typename T, int N> __device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
  if constexpr (sizeof(Vec<T, N>) == 16) {
    *reinterpret_cast<Vec<T, N>*>(p) = pack<T, N>(in);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = from_float<T>(in[k]);
  }
}

// Evict-first ("streaming", st.global.cs) store of one vector, for outputs no later kernel re-reads soon.
template <typename T, int N> __device__ __forceinline__ void store_stream(T* p, const float (&in)[N]) {
  if constexpr (sizeof(Vec<T, N>) == 16) {
    const Vec<T, N> raw = pack<T, N>(in);
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&raw));
  } else {
    store_vec<T, N>(p, in);
  }
}

// N fp32 values: 16-byte loads where N allows (the caller guarantees alignment), else element loads.
template <int N> __device__ __forceinline__ void load_f32(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p + k));
      out[k] = v.x, out[k + 1] = v.y, out[k + 2] = v.z, out[k + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = p[k];
  }
}

// Elements per 16-byte access.
template <typename T> constexpr int vec_width() { return 16 / sizeof(T); }

// Calls f(T{}) with the element type named by dt: one switch for every launcher.
template <typename F> cudaError_t dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: return f(float{});
    case DType::F16: return f(__half{});
    case DType::BF16: return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// bf16 needs sm_80: pre-Ampere device code gets a trapping stub instead (the host refuses bf16 there first).
template <typename T> __device__ constexpr bool unsupported_here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return std::is_same_v<T, __nv_bfloat16>;
#else
  return false;
#endif
}

}  // namespace ltxbench
