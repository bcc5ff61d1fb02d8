// LTX-Video's 3-D RoPE over the whole inner dim D (interleaved pairs 2i, 2i + 1), alone or fused with the q/k
// RMSNorm that precedes it; the fused form also writes the packed q/k/v of the Ulysses and ring exchanges, or FP8.
// All rotation math in fp32. Angles from coordinates: the accurate sincosf for fp32 outputs (as torch's
// cos/sin); for 16-bit outputs a two-constant range reduction and the hardware sin/cos (see angle_sincos).
#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/rope.cuh"
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

// sin/cos of an angle. fp32 outputs: sincosf, within an ulp of torch's. 16-bit outputs: reduce to [-pi, pi]
// with 2*pi split in two (the product k * hi is exact in the fma), then MUFU sin/cos; the absolute error,
// < 1e-6 for the |angle| < 2e4 of LTX's grid, is 1/1000 of an fp16 ulp at 1 and the sincos was the
// kernel's bottleneck (qk norm + RoPE from coordinates at 55-66% of copy bandwidth).
template <typename T> __device__ __forceinline__ void angle_sincos(float x, float* s, float* c) {
  if constexpr (sizeof(T) == 4) {
    sincosf(x, s, c);
  } else {
    constexpr float kInv2Pi = 0.159154943091895335768883763372514362f;
    constexpr float k2PiHi = 6.28318548202514648437500f;           // float(2*pi)
    constexpr float k2PiLo = -1.74845553146951715018691e-07f;      // 2*pi - k2PiHi
    const float k = rintf(x * kInv2Pi);
    const float r = fmaf(-k, k2PiLo, fmaf(-k, k2PiHi, x));
    __sincosf(r, s, c);
  }
}

// cos/sin of channels [col, col + VEC) of token (b, s): from the precomputed tables, or from the grid.
// AXIS_BY_SELECT: a pair's grid axis picked by selects rather than by indexing g3 (a run-time index puts g3 in
// local memory): rope_3d 5-8% faster (H200, 2x2688 to 2x8064 tokens), the fused q/k norm + RoPE 1-3% slower
// (docs/tuning.md#rope).
template <typename T, int VEC, bool FROM_GRID, bool AXIS_BY_SELECT = false>
__device__ __forceinline__ void ltx_angles(const Rope3dParams& p, int64_t b, int64_t s, int64_t col,
                                           float (&c)[VEC], float (&sn)[VEC]) {
  if constexpr (FROM_GRID) {
    const float* g = at_row<float>(p.grid, b, s);
    const float g3[3] = {g[0], g[1], g[2]};
    // 32-bit channel math: D < 2^31, and 64-bit divisions cost more than the sincos they index.
    const int pad = p.pad, col32 = static_cast<int>(col);
#pragma unroll
    for (int m = 0; m < VEC; m += 2) {
      const int ch = col32 + m;
      float cv = 1.f, sv = 0.f;  // the D % 6 leading channels are padding: cos 1, sin 0
      if (ch >= pad) {
        const int pair = (ch - pad) >> 1;
        const int f = pair / 3;
        const int axis = pair - 3 * f;
        const float gv = AXIS_BY_SELECT ? (axis == 0 ? g3[0] : axis == 1 ? g3[1] : g3[2]) : g3[axis];
        const float t = gv * 2.f - 1.f;  // same two roundings as diffusers: grid*2-1, freqs*t
        angle_sincos<T>(__fmul_rn(__ldg(p.freqs + f), t), &sv, &cv);
      }
      c[m] = c[m + 1] = cv;
      sn[m] = sn[m + 1] = sv;
    }
  } else {
    // Tables narrower than the row repeat every table_period channels (VEC divides it: the launch checks)
    const int64_t tc = p.table_period == p.D ? col : col % p.table_period;
    load_f32<VEC>(at_row<float>(p.cos, b, s) + tc, c);
    load_f32<VEC>(at_row<float>(p.sin, b, s) + tc, sn);
  }
}

// Interleaved pairs, each channel with its own cos/sin (diffusers' apply_rotary_emb):
// out[2i] = x[2i] c[2i] - x[2i+1] s[2i];  out[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1].
template <int VEC>
__device__ __forceinline__ void rotate_interleaved(float (&x)[VEC], const float (&c)[VEC], const float (&sn)[VEC]) {
#pragma unroll
  for (int m = 0; m < VEC; m += 2) {
    const float x0 = x[m], x1 = x[m + 1];
    x[m] = x0 * c[m] - x1 * sn[m];
    x[m + 1] = x1 * c[m + 1] + x0 * sn[m + 1];
  }
}

// Plain 3-D RoPE: one thread per (token, VEC channels) of both q and k, angles computed once for both.
template <typename T, int VEC, bool FROM_GRID>
__global__ void rope3d_kernel(Rope3dParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    const int64_t chunks = p.D / VEC, total = p.B * p.S * chunks;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t token = i / chunks, col = (i - token * chunks) * VEC;
      const int64_t b = token / p.S, s = token - b * p.S;
      const Vec<T, VEC> rq = load_raw_keep<T, VEC>(at_row<T>(p.q, b, s) + col);
      const Vec<T, VEC> rk = load_raw_keep<T, VEC>(at_row<T>(p.k, b, s) + col);
      float c[VEC], sn[VEC], q[VEC], k[VEC];
      ltx_angles<T, VEC, FROM_GRID, true>(p, b, s, col, c, sn);
      to_floats<T, VEC>(rq, q);
      to_floats<T, VEC>(rk, k);
      rotate_interleaved<VEC>(q, c, sn);
      rotate_interleaved<VEC>(k, c, sn);
      store_vec<T, VEC>(static_cast<T*>(p.q_out) + token * p.D + col, q);
      store_vec<T, VEC>(static_cast<T*>(p.k_out) + token * p.D + col, k);
    }
  }
}

// Columns col..col+VEC-1 of row `token` into slot `slot` (q 0, k 1, v 2; with 2 slots k 0, v 1) of the packed
// (parts, rows, slots, chunk) output: one vector store when the columns stay in one part, else one per column.
template <typename T, int VEC>
__device__ __forceinline__ void store_packed(const Rope3dParams& p, int64_t token, int64_t col, int slot,
                                             const float (&x)[VEC]) {
  const int64_t part_size = p.B * p.S * p.slots * p.chunk, row = (token * p.slots + slot) * p.chunk;
  if (p.chunk % VEC == 0) {
    const int64_t part = col / p.chunk;
    store_vec<T, VEC>(packed_part<T>(p.packed, p.part_out, part, part_size) + row + (col - part * p.chunk), x);
    return;
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int64_t c = col + e, part = c / p.chunk;
    packed_part<T>(p.packed, p.part_out, part, part_size)[row + (c - part * p.chunk)] = from_float<T>(x[e]);
  }
}

// RMSNorm of q and k over D (weights wq, wk), then the 3-D RoPE: one read and one write of each.
// Rows are cached in registers (MAXV vectors per thread), q and k reduced together.
// From the grid: two blocks of 512 (four of 256) per SM, 71 -> 64 registers, H100 bf16 2x8064x2048 103.0 -> 99.7
// us; the 8 bytes it then spilled went when q and k stayed packed across the reduction: H200 bf16 2.4-2.9% faster
// at the LTX shapes, fp16 -0.3 to +1.4% (docs/tuning.md#rope). With tables the same cap spills 100-170 bytes.
// FP8: q and k written as e4m3, each head's values times its scale (scale8, written before by
// fp8_head_scales_kernel); a vector never spans two heads (VEC divides the head dim).
template <typename T, int VEC, int MAXV, bool FROM_GRID, bool FP8 = false>
__global__ void __launch_bounds__(kMaxRowThreads, FROM_GRID ? 2 : 1)
    qk_norm_rope_kernel(Rope3dParams p, int tpr, float inv_d) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float smem[(kBlockThreads / 64) * 32 * 2];
    const int64_t rows = p.B * p.S;
    const int64_t token = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
    const int lane = threadIdx.x % tpr;
    const bool active = token < rows;
    const int64_t b = active ? token / p.S : 0, s = active ? token - b * p.S : 0;
    const int64_t nvec = p.D / VEC;
    const T* qrow = at_row<T>(p.q, b, s);
    const T* krow = at_row<T>(p.k, b, s);

    bool valid[MAXV];
    Vec<T, VEC> rq[MAXV], rk[MAXV];
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      const int64_t j = lane + static_cast<int64_t>(i) * tpr;
      valid[i] = active && j < nvec;
      if (valid[i]) {
        rq[i] = load_raw<T, VEC>(qrow + j * VEC);  // not load_raw_keep: 16-19% slower with it (H200)
        rk[i] = load_raw<T, VEC>(krow + j * VEC);
      }
    }
    // The angles do not depend on the loads: computing them here hides the sincos behind the load latency.
    float c[MAXV][VEC], sn[MAXV][VEC];
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      if (valid[i]) ltx_angles<T, VEC, FROM_GRID>(p, b, s, (lane + static_cast<int64_t>(i) * tpr) * VEC, c[i], sn[i]);
    }
    // q and k stay packed in T across the reduction and are widened twice (for the sums, then for the output):
    // float copies of both rows beside the angles spilled under the register cap.
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      if (!valid[i]) continue;
      float q[VEC], k[VEC];
      widen<T, VEC>(rq[i], q);
      widen<T, VEC>(rk[i], k);
#pragma unroll
      for (int e = 0; e < VEC; ++e) sums[0] += q[e] * q[e], sums[1] += k[e] * k[e];
    }
    row_group_sum<2>(sums, tpr, smem);
    // 16-bit outputs: rsqrtf (MUFU, <= 2 ulp of fp32, as torch.rsqrt in the model's own RMSNorm) on the mean
    // from 1 / D rounded once on the host; fp32 keeps the IEEE division and sqrt. The two IEEE pairs cost ~60
    // instructions per thread in a kernel that issues ~28 per element: H200 bf16 2x2688 / 2x8064 x2048 / 2x8064x4096
    // 33.41 / 82.37 / 159.68 -> 32.32 / 80.22 / 154.66 us, fp16 5-6% faster (docs/tuning.md#rope).
    float rq_std, rk_std;
    if constexpr (sizeof(T) == 2) {
      rq_std = rsqrtf(fmaf(sums[0], inv_d, p.eps)), rk_std = rsqrtf(fmaf(sums[1], inv_d, p.eps));
    } else {
      const float D = static_cast<float>(p.D);
      rq_std = 1.f / sqrtf(sums[0] / D + p.eps), rk_std = 1.f / sqrtf(sums[1] / D + p.eps);
    }
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      if (!valid[i]) continue;
      const int64_t col = (lane + static_cast<int64_t>(i) * tpr) * VEC;
      float q[VEC], k[VEC], wq[VEC], wk[VEC];
      widen<T, VEC>(rq[i], q);
      widen<T, VEC>(rk[i], k);
      load_vec<T, VEC>(static_cast<const T*>(p.wq) + col, wq);
      load_vec<T, VEC>(static_cast<const T*>(p.wk) + col, wk);
#pragma unroll
      for (int e = 0; e < VEC; ++e) q[e] *= rq_std * wq[e], k[e] *= rk_std * wk[e];
      rotate_interleaved<VEC>(q, c[i], sn[i]);
      rotate_interleaved<VEC>(k, c[i], sn[i]);
      if constexpr (FP8) {
        const int64_t head = col / (p.D / p.heads);
        store_fp8<VEC>(static_cast<uint8_t*>(p.q_out) + token * p.D + col, q, p.scale8[head]);
        store_fp8<VEC>(static_cast<uint8_t*>(p.k_out) + token * p.D + col, k, p.scale8[p.heads + head]);
      } else if (p.packed != nullptr) {
        float v[VEC];
        load_vec<T, VEC>(at_row<T>(p.v, b, s) + col, v);
        const int first = p.slots - 2;  // k's slot: 1 after q, or 0 with q in its own rows
        if (first == 0)
          store_vec<T, VEC>(static_cast<T*>(p.q_out) + token * p.D + col, q);
        else
          store_packed<T, VEC>(p, token, col, 0, q);
        store_packed<T, VEC>(p, token, col, first, k);
        store_packed<T, VEC>(p, token, col, first + 1, v);
      } else {
        store_vec<T, VEC>(static_cast<T*>(p.q_out) + token * p.D + col, q);
        store_vec<T, VEC>(static_cast<T*>(p.k_out) + token * p.D + col, k);
      }
    }
    if (p.part_out[0] != nullptr) __threadfence_system();  // parts in peers' memory: stored before the barrier
  }
}

// Vectors per thread of the fused q/k norm + RoPE. LTXBENCH_QK_VPT=1|2 overrides it, for tuning sweeps.
int qk_vectors_per_thread() {
  static const int forced = tuning_knob("LTXBENCH_QK_VPT");
  return forced == 1 ? 1 : 2;
}

// Each head's FP8 scale for q (blockIdx.y 0) and k (1) and their reciprocals (weight_bound_scale, one head a group).
template <typename T>
__global__ void fp8_head_scales_kernel(Rope3dParams p) {
  weight_bound_scale<T>(p.wq, p.wk, p.D, p.heads, p.B, p.scale8, p.q_descale, p.k_descale);
}

template <typename T, int VEC, int MAXV, bool FROM_GRID>
cudaError_t launch_3d_with(const Rope3dParams& p, cudaStream_t stream) {
  if (!p.norm) {
    rope3d_kernel<T, VEC, FROM_GRID><<<grid_for(p.B * p.S * (p.D / VEC)), kBlockThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const int64_t per_row = (p.D / VEC + MAXV - 1) / MAXV;
  if (per_row > kMaxRowThreads) return cudaErrorInvalidValue;  // the binding rejects such D first
  const int tpr = threads_per_row(per_row);
  const int rows_per_block = tpr >= kBlockThreads ? 1 : kBlockThreads / tpr;
  const int64_t blocks = (p.B * p.S + rows_per_block - 1) / rows_per_block;
  const dim3 grid(static_cast<unsigned>(blocks)), block(rows_per_block * tpr);
  if (p.scale8 == nullptr) {
    qk_norm_rope_kernel<T, VEC, MAXV, FROM_GRID><<<grid, block, 0, stream>>>(p, tpr, inverse_count(p.D));
  } else {
    qk_norm_rope_kernel<T, VEC, MAXV, FROM_GRID, true><<<grid, block, 0, stream>>>(p, tpr, inverse_count(p.D));
  }
  return cudaGetLastError();
}

template <typename T, bool FROM_GRID> cudaError_t launch_3d_typed(const Rope3dParams& p, cudaStream_t stream) {
  constexpr int V = vec_width<T>();
  const bool vec = p.D % V == 0 && rows_aligned(p.q, V) && rows_aligned(p.k, V) && aligned16(p.q_out) &&
                   (p.scale8 == nullptr || (p.D / p.heads) % V == 0) &&
                   aligned16(p.k_out) && aligned16(p.wq) && aligned16(p.wk) &&
                   // Parts are stored per column unless the chunk holds whole vectors: only then must each align.
                   (p.packed == nullptr || (rows_aligned(p.v, V) && aligned16(p.packed) &&
                                             (p.chunk % V != 0 || parts_aligned16(p.packed, p.part_out)))) &&
                   (FROM_GRID || (rows_aligned(p.cos, 4) && rows_aligned(p.sin, 4) && p.table_period % V == 0));
  // Rows too wide for the vectorized register cache (fp32 beyond 4096) take the pair path (up to 8192).
  if (vec && (!p.norm || p.D / V <= 2 * kMaxRowThreads)) {
    if (p.norm && qk_vectors_per_thread() == 1 && p.D / V <= kMaxRowThreads)
      return launch_3d_with<T, V, 1, FROM_GRID>(p, stream);
    return launch_3d_with<T, V, 2, FROM_GRID>(p, stream);
  }
  return launch_3d_with<T, 2, 8, FROM_GRID>(p, stream);  // one interleaved pair per vector
}

template <typename T> cudaError_t launch_3d(const Rope3dParams& p, cudaStream_t stream) {
  return p.grid.ptr ? launch_3d_typed<T, true>(p, stream) : launch_3d_typed<T, false>(p, stream);
}

}  // namespace

cudaError_t launch_rope_3d(const Rope3dParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.scale8 != nullptr && p.heads > 0) {  // the FP8 scales first (descales too where there are no tokens)
    const cudaError_t err = dispatch_dtype(dtype, [&](auto tag) {
      fp8_head_scales_kernel<decltype(tag)><<<dim3(static_cast<unsigned>(p.heads), 2), 32, 0, stream>>>(p);
      return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
  }
  if (p.B * p.S == 0 || p.D == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_3d<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
