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
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

constexpr int kLeanMaxThreads = 512;

// Blocks of kLeanMaxThreads that must fit an SM: 3 caps one-input bf16/fp32 rows at 40 registers (75%
// occupancy, no spills: bf16 is widened by shift and mask), which bought the modulated norms 8-14% on the
// H200; 0 (no cap) for fp16, which spills under it, and for residual rows, which spilled and lost 6%
// (docs/tuning.md#row-kernels-norms-residuals-modulation).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kOneInputMinBlocks = 0;  // Turing: 1024 threads per SM leave no room for the cap
#else
constexpr int kOneInputMinBlocks = 3;
#endif
template <typename T> __host__ __device__ constexpr int lean_min_blocks(int arity) {
  return arity == 1 && !std::is_same_v<T, __half> ? kOneInputMinBlocks : 0;
}

// What follows the normalization: nothing, the (D,) weight, or AdaLN's * (1 + scale) + shift.
enum class Affine : int { None, Weight, Modulate };

// A row's statistics from its mean and its sum of squares around it (1 / D rounded once on the host). 16-bit
// outputs take rsqrtf (MUFU, <= 2 ulp of fp32, far below their rounding) instead of the IEEE sqrt and division,
// ~25 instructions per thread of a few hundred; fp32 outputs keep the IEEE form (row_math.cuh, rms_stats).
template <typename T, bool FAST>
__device__ __forceinline__ RowStats row_stats(float mean, float sum_sq, float inv_d, float eps) {
  const float var = fmaf(sum_sq, inv_d, eps);
  if constexpr (FAST && sizeof(T) == 2) return RowStats{mean, rsqrtf(var)};
  else return RowStats{mean, 1.f / sqrtf(var)};
}

// LayerNorm statistics of a row held in registers by whole warps: each warp's mean from a warp sum, refined
// by the residual sum of the second pass (corrected two-pass: the first sum rounds at n * |mean|), its M2
// around that mean from the registers, then the warps' (count, mean, M2) combined around warp 0's mean. Two
// shuffle chains and one barrier pair, where the pairwise Chan merge it replaced shuffled three floats with a
// branchy update at every level: H200 2x8064x2048 50.8 -> 44.9 us, 2x8064x4096 108.2 -> 86.1 (before the
// refinement), as fast as a shifted single pass. The warps' triples are combined by butterfly shuffles rather
// than a loop over shared memory in every thread: 2x8064x4096 86.5 -> 75.6 us, 2x8064x2048 43.2 -> 39.5
// (docs/tuning.md#row-kernels-norms-residuals-modulation). smem: 3 floats per warp.
// FULL: every thread holds VPT valid vectors, so each warp holds 32 * VPT * VEC values (a power of two) and
// the divisions by the count are exact multiplications.
template <typename T, int VEC, int VPT, bool FULL, bool FAST>
__device__ __forceinline__ RowStats lean_layer_stats(const float (&h)[VPT][VEC], const bool (&valid)[VPT],
                                                     float sum, float* smem, float inv_d, float eps) {
  int count = 32 * VPT * VEC;  // values held by this warp, exact
  if constexpr (!FULL) {
    count = 0;
#pragma unroll
    for (int i = 0; i < VPT; ++i) count += VEC * __popc(__ballot_sync(0xffffffffu, valid[i]));
  }
  float s[1] = {sum};
  warp_sum<1>(s);
  const float n = static_cast<float>(count);
  const auto per_value = [&](float total) {
    if constexpr (FULL) return total * (1.f / (32 * VPT * VEC));
    else return count > 0 ? __fdividef(total, n) : 0.f;
  };
  const float first = per_value(s[0]);
  float dq[2] = {0.f, 0.f};  // Σd and Σd² with d = h - first
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (!valid[i]) continue;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = h[i][k] - first;
      dq[0] += d;
      dq[1] = fmaf(d, d, dq[1]);
    }
  }
  warp_sum<2>(dq);
  const float correction = per_value(dq[0]);
  const float warp_mean = first + correction;
  const float warp_m2 = fmaxf(dq[1] - dq[0] * correction, 0.f);
  const int warps = blockDim.x >> 5;
  if (warps == 1) return row_stats<T, FAST>(warp_mean, warp_m2, inv_d, eps);
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    float* slot = smem + 3 * (threadIdx.x >> 5);
    slot[0] = n;
    slot[1] = warp_mean;
    slot[2] = warp_m2;
  }
  __syncthreads();
  // Lane w of every warp takes warp w's triple and butterfly shuffles combine them: every thread gets the same
  // bits, with no serial loop over shared memory. (Shuffling over only `warps` lanes, a runtime width, compiles
  // to a loop that issues more instructions than the five unrolled levels.)
  const float base = smem[1];  // warp 0's mean: deviations from it stay small where Σ n_w mean_w would round
  float nw = 0.f, mw = base, m2w = 0.f;
  if (lane < warps) {
    nw = smem[3 * lane];
    mw = smem[3 * lane + 1];
    m2w = smem[3 * lane + 2];
  }
  float deviation[1] = {nw * (mw - base)};
  warp_sum<1>(deviation);
  const float mean = fmaf(deviation[0], inv_d, base);
  const float d = mw - mean;
  float m2[1] = {fmaf(nw * d, d, m2w)};  // Σ M2_w + n_w (mean_w - mean)²: every term non-negative
  warp_sum<1>(m2);
  return row_stats<T, FAST>(mean, m2[0], inv_d, eps);
}

// The sum of one value per thread over the block (one row, whole warps); every thread gets the same bits.
// smem holds a float per warp. row_group_sum<1>(v, blockDim.x, smem) computes the same with a row division and
// a second barrier, which the one-row block does not need. (The butterfly combine of lean_layer_stats made
// rms_norm_modulate spill 16 bytes under the register cap and lose 8%:
// docs/tuning.md#row-kernels-norms-residuals-modulation.)
__device__ __forceinline__ float block_sum(float v, float* smem) {
  float s[1] = {v};
  warp_sum<1>(s);
  const int warps = blockDim.x >> 5;
  if (warps == 1) return s[0];
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = s[0];
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += smem[w];
  return total;
}

// ARITY: 1 x, 2 x + a, 3 x + a * gate (h_out, the sum, stored when given). NORM: RMSNorm, no-affine LayerNorm,
// or none (the gated residual). The modulated norms are issue-bound rather than DRAM-bound (ncu, H200: SM
// throughput 76-86%, DRAM 48-64%), so the norm kind is fixed at compile time and the modulation folded into one
// factor per channel, every instruction per element counting: rms_norm_modulate 2x8064x4096 75.3 -> 70.5 us,
// layer_norm_modulate 86.5 -> 82.1 (docs/tuning.md#row-kernels-norms-residuals-modulation).
// FULL (LayerNorm rows only, where the per-thread statistics work dominates): D = VPT x VEC x blockDim.x, so no
// thread checks its vectors' bounds or counts the warp's values. With rsqrtf, ~20% fewer instructions per thread
// (sm_90 SASS): H200 layer_norm_modulate 2x8064x4096 bf16 75.36 -> 72.42 us, fp16 87.62 -> 72.99; 1x1024x2048 to
// 2x4096x3072 1-4% faster in bf16, fp16 within +-2% below 2x4096x3072
// (docs/tuning.md#row-kernels-norms-residuals-modulation).
template <typename T, int VEC, int VPT, int ARITY, Affine AFF, NormKind NORM, bool FULL = false>
__global__ void __launch_bounds__(kLeanMaxThreads, lean_min_blocks<T>(ARITY)) row_op_lean(RowOpParams p, float inv_d) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    constexpr bool kMod = AFF == Affine::Modulate;
    constexpr bool kLayer = NORM == NormKind::Layer;
    // One-input rows under the 40-register cap (FULL LayerNorm rows aside) keep the IEEE rstd and a run-time
    // h_out test: rsqrtf and the compile-time test spilled 4-8 bytes there, bf16 rms_norm_modulate 1.5-3.7%
    // slower (H200). Elsewhere they save instructions: fp16 rms_norm_modulate 2.5-11.5% faster at 2x2688x2048
    // and up (docs/tuning.md#row-kernels-norms-residuals-modulation).
    constexpr bool kTight = lean_min_blocks<T>(ARITY) > 0 && !(kLayer && FULL);
    constexpr bool kMayStoreH = kTight || ARITY >= 2;  // without a residual h is x and no op asks for h_out
    __shared__ float smem[3 * kLeanMaxThreads / 32];
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
      valid[i] = FULL || j < nvec;
      if (!valid[i]) continue;
      raw[i] = load_raw_h<T, VEC, ARITY, !kLayer>(r, static_cast<int64_t>(j) * VEC);  // see load_raw_keep
      if constexpr (AFF == Affine::Weight) w[i] = load_raw<T, VEC>(static_cast<const T*>(p.weight) + j * VEC);
    }
    T* out = static_cast<T*>(p.out) + row * p.D;
    T* h_out = kMayStoreH && p.h_out ? static_cast<T*>(p.h_out) + row * p.D : nullptr;
    float h[VPT][VEC];
    float s1 = 0.f;  // Σh for LayerNorm (its mean), Σh² for RMSNorm
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (!valid[i]) continue;
      combine_h<T, VEC, ARITY>(raw[i], h[i]);
      if (h_out) store_vec<T, VEC>(h_out + (threadIdx.x + i * blockDim.x) * VEC, h[i]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (kLayer) s1 += h[i][k];
        if constexpr (NORM == NormKind::RMS) s1 = fmaf(h[i][k], h[i][k], s1);
      }
    }
    float mean = 0.f, rstd = 1.f;
    if constexpr (kLayer) {
      const RowStats st = lean_layer_stats<T, VEC, VPT, FULL, !kTight>(h, valid, s1, smem, inv_d, p.eps);
      mean = st.mean;
      rstd = st.rstd;
    } else if constexpr (NORM == NormKind::RMS) {
      rstd = row_stats<T, !kTight>(0.f, block_sum(s1, smem), inv_d, p.eps).rstd;
    }
    // scale/shift after the reduction: loaded with x they cost registers, and occupancy, that the wait for
    // them (L1/L2 hits: one (D,) pair per batch) does not repay
    // (docs/tuning.md#row-kernels-norms-residuals-modulation).
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
      for (int k = 0; k < VEC; ++k) n[k] = kLayer ? h[i][k] - mean : h[i][k];
      if constexpr (kMod) {  // (h - mean) * (rstd * (1 + scale)) + shift: two instructions per element
        float g[VEC];
        widen<T, VEC>(w[i], f);
        widen<T, VEC>(sh[i], g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) n[k] = modulate_normalized(n[k], rstd, f[k], g[k]);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) n[k] *= rstd;
        if constexpr (AFF == Affine::Weight) {
          widen<T, VEC>(w[i], f);
#pragma unroll
          for (int k = 0; k < VEC; ++k) f[k] += p.weight_offset;
          apply_weight<T, VEC>(n, f, p.cast_before_weight);
        }
      }
      store_vec<T, VEC>(out + (threadIdx.x + i * blockDim.x) * VEC, n);
    }
  }
}

template <typename T, int VPT, int ARITY, Affine AFF, NormKind NORM = NormKind::RMS, bool FULL = false>
cudaError_t launch_lean(const RowOpParams& p, int threads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.S), static_cast<unsigned>(p.B));
  row_op_lean<T, vec_width<T>(), VPT, ARITY, AFF, NORM, FULL><<<grid, threads, 0, stream>>>(p, inverse_count(p.D));
  return cudaGetLastError();
}

template <typename T, int VPT, Affine AFF>
cudaError_t launch_arity(const RowOpParams& p, int threads, cudaStream_t stream) {
  if (p.a.ptr == nullptr) return launch_lean<T, VPT, 1, AFF>(p, threads, stream);
  if (p.gate.ptr == nullptr) return launch_lean<T, VPT, 2, AFF>(p, threads, stream);
  return launch_lean<T, VPT, 3, AFF>(p, threads, stream);
}

template <typename T, int VPT> cudaError_t launch_vpt(const RowOpParams& p, int threads, cudaStream_t stream) {
  if (p.norm == NormKind::Layer) {
    if (p.D == static_cast<int64_t>(VPT) * vec_width<T>() * threads)
      return launch_lean<T, VPT, 1, Affine::Modulate, NormKind::Layer, true>(p, threads, stream);
    return launch_lean<T, VPT, 1, Affine::Modulate, NormKind::Layer>(p, threads, stream);
  }
  if (p.norm == NormKind::None) return launch_lean<T, VPT, 3, Affine::None, NormKind::None>(p, threads, stream);
  if (p.scale.ptr) return launch_arity<T, VPT, Affine::Modulate>(p, threads, stream);
  if (p.weight) return launch_arity<T, VPT, Affine::Weight>(p, threads, stream);
  return launch_arity<T, VPT, Affine::None>(p, threads, stream);
}

// Vectors per thread: 2 (H100 bf16 sweep, docs/tuning.md#row-kernels-norms-residuals-modulation).
// LTXBENCH_ROW_VPT=1 overrides (sweeps); LTXBENCH_ROW_LEAN=0 turns this path off, LTXBENCH_MOD_LEAN=0 only for the
// modulated ops.
int lean_vpt() {
  static const int forced = tuning_knob("LTXBENCH_ROW_VPT");
  return forced == 1 ? 1 : 2;
}

// RMSNorm (or no norm) with a weight, with modulation (not both), or neither; LayerNorm of x alone with
// modulation (LTX's final norm) on rows of up to 512 vectors: H200 2x8064x2048 62.6 -> 58.0 us; wider rows lost
// here (2x8064x4096 115.1 -> 131.9) until the register cap and the division-free merge, then won (114.5 -> 108.0,
// 2x4096x3072 46.9 -> 42.5; docs/tuning.md#row-kernels-norms-residuals-modulation).
// LTXBENCH_LN_LEAN=0 turns it off.
bool lean_serves(const RowOpParams& p, int64_t nvec) {
  static const bool mod_off = tuning_off("LTXBENCH_MOD_LEAN");
  static const bool ln_off = tuning_off("LTXBENCH_LN_LEAN");
  if (p.norm == NormKind::Layer) return !ln_off && nvec <= 512 && p.scale.ptr && !p.a.ptr && !p.weight;
  if (p.norm == NormKind::None) return p.gate.ptr && !p.scale.ptr && !p.weight;  // the gated residual only
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
  NOTE_SOURCE_USED();
  bool launched = false;
  *err = dispatch_dtype(dtype, [&](auto tag) {
    cudaError_t e = cudaSuccess;
    launched = try_lean<decltype(tag)>(p, stream, &e);
    return e;
  });
  return launched;
}

}  // namespace ltxbench
