// RMSNorm, fused add + RMSNorm, the gated residual, RMSNorm + AdaLN modulation and (rows up to 512 vectors)
// LayerNorm + modulation on 16-byte-aligned rows of 32 to 512 x VPT vectors. One row per block, the block
// indexed by (s, b) so no thread divides to find its row; the weight, when present, is chosen at compile time
// and loaded together with x, before the reduction, so the only wait a row has is the one for its own loads.
// The general kernels (norm.cu) take every other case (wider LayerNorm, weight and modulation together,
// unaligned or very wide rows).
#include "common/dtype.cuh"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/row_math.cuh"
#include "common/tuning.h"

namespace ltxbench {
namespace {

constexpr int kLeanMaxThreads = 512;

// Blocks of kLeanMaxThreads that must fit an SM: 3 caps one-input bf16/fp32 rows at 40 registers (75%
// occupancy, no spills: bf16 is widened by shift and mask), which bought the modulated norms 8-14% on the
// H200; 0 (no cap) for fp16, which spills under it, and for residual rows, which spilled and lost 6%
// (results/h200/tuning/lean-minb-*).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kOneInputMinBlocks = 0;  // Turing: 1024 threads per SM leave no room for the cap
#else
constexpr int kOneInputMinBlocks = 3;
#endif
template <typename T> constexpr int lean_min_blocks(int arity) {
  return arity == 1 && !std::is_same_v<T, __half> ? kOneInputMinBlocks : 0;
}

// What follows the normalization: nothing, the (D,) weight, or AdaLN's * (1 + scale) + shift.
enum class Affine : int { None, Weight, Modulate };

// ARITY: 1 x, 2 x + a, 3 x + a * gate. LAYER: no-affine LayerNorm; else RMSNorm, or no norm when p.norm is None.
template <typename T, int VEC, int VPT, int ARITY, Affine AFF, bool LAYER = false>
__global__ void __launch_bounds__(kLeanMaxThreads, lean_min_blocks<T>(ARITY)) row_op_lean(RowOpParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    constexpr bool kMod = AFF == Affine::Modulate;
    __shared__ float smem[32 * 3];
    const int64_t b = blockIdx.y, s = blockIdx.x;
    const int64_t row = b * p.S + s;
    const int nvec = static_cast<int>(p.D / VEC);
    RowPtrs<T> r;
    r.x = row_of<T>(p.x, b, s);
    r.a = ARITY >= 2 ? row_of<T>(p.a, b, s) : nullptr;
    r.gate = ARITY >= 3 ? row_of<T>(p.gate, b, s) : nullptr;
    r.scale = kMod ? row_of<T>(p.scale, b, s) : nullptr;
    r.shift = kMod ? row_of<T>(p.shift, b, s) : nullptr;

    bool valid[VPT];
    RawH<T, VEC> raw[VPT];
    Vec<T, VEC> w[VPT], sh[VPT];  // the weight, or scale and shift
#pragma unroll
    for (int i = 0; i < VPT; ++i) {  // every load of the row, the weight's included, before any arithmetic
      const int j = threadIdx.x + i * blockDim.x;
      valid[i] = j < nvec;
      if (!valid[i]) continue;
      raw[i] = load_raw_h<T, VEC, ARITY>(r, static_cast<int64_t>(j) * VEC);
      if constexpr (AFF == Affine::Weight) w[i] = load_raw<T, VEC>(static_cast<const T*>(p.weight) + j * VEC);
    }
    T* out = static_cast<T*>(p.out) + row * p.D;
    T* h_out = p.h_out ? static_cast<T*>(p.h_out) + row * p.D : nullptr;
    float h[VPT][VEC];
    float s1[1] = {0.f};
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!valid[i]) continue;
      combine_h<T, VEC, ARITY>(raw[i], h[i]);
      if (h_out) store_vec<T, VEC>(h_out + (threadIdx.x + i * blockDim.x) * VEC, h[i]);
      s1[0] += first_pass_term<VEC>(p.norm, h[i]);
    }
    float mean = 0.f, rstd = 1.f;
    if constexpr (LAYER) {  // one reduction: each thread's own (count, mean, M2), merged across the row
      MeanM2 own;
#pragma unroll
      for (int i = 0; i < VPT; ++i) own.n += valid[i] ? VEC : 0;
      own.mean = own.n > 0.f ? __fdividef(s1[0], own.n) : 0.f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) own.m2 += valid[i] ? (h[i][k] - own.mean) * (h[i][k] - own.mean) : 0.f;
      }
      const MeanM2 row_stats = row_group_mean_m2(own, blockDim.x, smem);
      mean = row_stats.mean;
      rstd = 1.f / sqrtf(row_stats.m2 / static_cast<float>(p.D) + p.eps);  // m2: a sum of non-negative terms
    } else if (p.norm == NormKind::RMS) {
      row_group_sum<1>(s1, blockDim.x, smem);
      rstd = rms_stats(s1[0], static_cast<float>(p.D), p.eps).rstd;
    }
    // scale/shift after the reduction: loaded with x they cost registers, and occupancy, that the wait for
    // them (L1/L2 hits: one (D,) pair per batch) does not repay (results/h200/tuning/mod-lean-*).
    if constexpr (kMod) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        if (!valid[i]) continue;
        w[i] = load_raw<T, VEC>(r.scale + j * VEC);
        sh[i] = load_raw<T, VEC>(r.shift + j * VEC);
      }
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!valid[i]) continue;
      float n[VEC], f[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) n[k] = (h[i][k] - mean) * rstd;
      if constexpr (AFF == Affine::Weight) {
        widen<T, VEC>(w[i], f);
        apply_weight<T, VEC>(n, f, p.cast_before_weight);
      }
      if constexpr (kMod) {
        float g[VEC];
        widen<T, VEC>(w[i], f);
        widen<T, VEC>(sh[i], g);
        modulate<VEC>(n, f, g);
      }
      store_vec<T, VEC>(out + (threadIdx.x + i * blockDim.x) * VEC, n);
    }
  }
}

template <typename T, int VPT, int ARITY, Affine AFF, bool LAYER = false>
cudaError_t launch_lean(const RowOpParams& p, int threads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.S), static_cast<unsigned>(p.B));
  row_op_lean<T, vec_width<T>(), VPT, ARITY, AFF, LAYER><<<grid, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int VPT, Affine AFF>
cudaError_t launch_arity(const RowOpParams& p, int threads, cudaStream_t stream) {
  if (p.a.ptr == nullptr) return launch_lean<T, VPT, 1, AFF>(p, threads, stream);
  if (p.gate.ptr == nullptr) return launch_lean<T, VPT, 2, AFF>(p, threads, stream);
  return launch_lean<T, VPT, 3, AFF>(p, threads, stream);
}

template <typename T, int VPT> cudaError_t launch_vpt(const RowOpParams& p, int threads, cudaStream_t stream) {
  if (p.norm == NormKind::Layer) return launch_lean<T, VPT, 1, Affine::Modulate, true>(p, threads, stream);
  if (p.scale.ptr) return launch_arity<T, VPT, Affine::Modulate>(p, threads, stream);
  if (p.weight) return launch_arity<T, VPT, Affine::Weight>(p, threads, stream);
  return launch_arity<T, VPT, Affine::None>(p, threads, stream);
}

// Vectors per thread: 2 (H100 bf16 sweep, notes/kernel-tuning.md). LTXBENCH_ROW_VPT=1 overrides (sweeps);
// LTXBENCH_ROW_LEAN=0 turns this path off, LTXBENCH_MOD_LEAN=0 only for the modulated ops.
int lean_vpt() {
  static const int forced = tuning_knob("LTXBENCH_ROW_VPT");
  return forced == 1 ? 1 : 2;
}

// RMSNorm (or no norm) with a weight, with modulation (not both), or neither; LayerNorm of x alone with
// modulation (LTX's final norm) on rows of up to 512 vectors: H200 2x8064x2048 62.6 -> 58.0 us (tuning/ln-*);
// wider rows lost here (2x8064x4096 115.1 -> 131.9) until the register cap and the division-free merge, then won
// (114.5 -> 108.0, 2x4096x3072 46.9 -> 42.5, tuning/ln-lean512-*). LTXBENCH_LN_LEAN=0 turns it off.
bool lean_serves(const RowOpParams& p, int64_t nvec) {
  static const bool mod_off = tuning_off("LTXBENCH_MOD_LEAN");
  static const bool ln_off = tuning_off("LTXBENCH_LN_LEAN");
  if (p.norm == NormKind::Layer) return !ln_off && nvec <= 512 && p.scale.ptr && !p.a.ptr && !p.weight;
  return !p.scale.ptr || (!mod_off && !p.weight);
}

template <typename T> bool try_lean(const RowOpParams& p, cudaStream_t stream, cudaError_t* err) {
  static const bool disabled = tuning_off("LTXBENCH_ROW_LEAN");
  const int64_t nvec = p.D / vec_width<T>();
  if (disabled || !lean_serves(p, nvec) || !vectorizable<T>(p)) return false;
  if (p.B > 65535 || p.S > 0x7fffffff) return false;
  const int vpt = lean_vpt();
  const int64_t threads = ((nvec + vpt - 1) / vpt + 31) / 32 * 32;
  if (nvec < 32 || threads > kLeanMaxThreads) return false;
  const int t = static_cast<int>(threads);
  *err = vpt == 1 ? launch_vpt<T, 1>(p, t, stream) : launch_vpt<T, 2>(p, t, stream);
  return true;
}

}  // namespace

bool try_launch_row_op_lean(const RowOpParams& p, DType dtype, cudaStream_t stream, cudaError_t* err) {
  bool launched = false;
  *err = dispatch_dtype(dtype, [&](auto tag) {
    cudaError_t e = cudaSuccess;
    launched = try_lean<decltype(tag)>(p, stream, &e);
    return e;
  });
  return launched;
}

}  // namespace ltxbench
