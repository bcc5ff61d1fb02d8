// Rotary position embeddings: LTX-Video's 3-D RoPE over the inner dim (optionally fused with the q/k
// RMSNorm that precedes it), LTX-2's q/k RMSNorm fused with its split (per-head neox) RoPE, and the 1-D RoPE
// of LLMs (neox or interleaved pairs, tables + positions).
// All rotation math in fp32. Angles from coordinates: the accurate sincosf for fp32 outputs (as torch's
// cos/sin); for 16-bit outputs a two-constant range reduction and the hardware sin/cos (see angle_sincos).
#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/tuning.h"

namespace ltxbench {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kMaxRowThreads = 512;

template <typename T> __device__ __forceinline__ const T* at_row(const Rows3& r, int64_t b, int64_t s) {
  return static_cast<const T*>(r.ptr) + b * r.sb + s * r.ss;
}

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
    load_f32<VEC>(at_row<float>(p.cos, b, s) + col, c);
    load_f32<VEC>(at_row<float>(p.sin, b, s) + col, sn);
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
// Part `part` of the packed output: at a pointer of its own, or after the parts before it in one buffer.
template <typename T>
__device__ __forceinline__ T* packed_part(void* packed, void* const* part_out, int64_t part, int64_t size) {
  return part_out[0] != nullptr ? static_cast<T*>(part_out[part]) : static_cast<T*>(packed) + part * size;
}

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

// Head `head`'s row of slot `slot` (q 0, k 1, v 2) of `token` in the packed (parts, B·S, 3, D / parts) output.
template <typename T>
__device__ __forceinline__ T* packed_head(const RopeSplitParams& p, int64_t token, int slot, int64_t head) {
  const int64_t per_part = p.H / p.parts, hd = 2 * p.half, width = per_part * hd, part = head / per_part;
  return packed_part<T>(p.packed, p.part_out, part, p.B * p.S * 3 * width) + (token * 3 + slot) * width +
         (head - part * per_part) * hd;
}

// LTX-2: RMSNorm over the whole inner dim D (fp32 statistics, times the weight in fp32), then the split RoPE per
// head, one read and one write of each tensor. One row (token) per `tpr` threads; NT = 2 normalizes q and k together
// (one reduction, one table read for both), NT = 1 one tensor (the cross-attentions: q and k of other lengths and
// tables). A thread owns MAXP pairs: a VEC-chunk of a head's first half and its partner `half` channels on, so the
// rotation needs no shuffle; pair j is head j / (half / VEC), chunk j % (half / VEC). The pairs stay packed in
// registers across the reduction, as in qk_norm_rope_kernel.
template <typename T, int VEC, int MAXP, int NT>
__global__ void __launch_bounds__(kMaxRowThreads) rope_split_kernel(RopeSplitParams p, int tpr, float inv_d) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float smem[(kBlockThreads / 64) * 32 * NT];
    const int64_t token = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
    const int lane = threadIdx.x % tpr;
    const bool active = token < p.B * p.S;
    const int64_t b = active ? token / p.S : 0, s = active ? token - b * p.S : 0;
    const int chunks = static_cast<int>(p.half / VEC), pairs = static_cast<int>(p.H) * chunks;
    const int64_t half = p.half, hd = 2 * half, D = p.H * hd;
    const Rows3 in[2] = {p.q, p.k};
    const void* const weights[2] = {p.wq, p.wk};
    void* const outs[2] = {p.q_out, p.k_out};

    bool valid[MAXP];
    int head[MAXP], chunk[MAXP];
    Vec<T, VEC> raw[NT][MAXP][2];
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
      const int j = lane + i * tpr;
      valid[i] = active && j < pairs;
      if (!valid[i]) continue;
      head[i] = j / chunks, chunk[i] = j - head[i] * chunks;
      const int64_t col = head[i] * hd + chunk[i] * VEC;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const T* row = at_row<T>(in[t], b, s);
        raw[t][i][0] = load_raw<T, VEC>(row + col);
        raw[t][i][1] = load_raw<T, VEC>(row + col + half);
      }
    }
    // The table loads do not depend on the row loads: issued before the reduction, their latency overlaps it.
    float c[MAXP][VEC], sn[MAXP][VEC];
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
      if (!valid[i]) continue;
      const int64_t off = b * p.t_sb + head[i] * p.t_sh + s * p.t_ss + chunk[i] * VEC;
      load_f32<VEC>(p.cos + off, c[i]);
      load_f32<VEC>(p.sin + off, sn[i]);
    }
    float sums[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) sums[t] = 0.f;
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
      if (!valid[i]) continue;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float x1[VEC], x2[VEC];
        widen<T, VEC>(raw[t][i][0], x1);
        widen<T, VEC>(raw[t][i][1], x2);
#pragma unroll
        for (int e = 0; e < VEC; ++e) sums[t] += x1[e] * x1[e] + x2[e] * x2[e];
      }
    }
    row_group_sum<NT>(sums, tpr, smem);
    // 16-bit outputs: rsqrtf on the mean from 1 / D rounded once on the host; fp32 keeps the IEEE division and
    // sqrt (qk_norm_rope_kernel says why).
    float rstd[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if constexpr (sizeof(T) == 2) {
        rstd[t] = rsqrtf(fmaf(sums[t], inv_d, p.eps));
      } else {
        rstd[t] = 1.f / sqrtf(sums[t] / static_cast<float>(D) + p.eps);
      }
    }
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
      if (!valid[i]) continue;
      const int64_t col = head[i] * hd + chunk[i] * VEC;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const T* w = static_cast<const T*>(weights[t]);
        float x1[VEC], x2[VEC], w1[VEC], w2[VEC];
        widen<T, VEC>(raw[t][i][0], x1);
        widen<T, VEC>(raw[t][i][1], x2);
        load_vec<T, VEC>(w + col, w1);
        load_vec<T, VEC>(w + col + half, w2);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {  // torch.nn.RMSNorm's order, (x * rstd) * w, then the rotation
          const float a = x1[e] * rstd[t] * w1[e], a2 = x2[e] * rstd[t] * w2[e];
          x1[e] = a * c[i][e] - a2 * sn[i][e];
          x2[e] = a2 * c[i][e] + a * sn[i][e];
        }
        T* out = p.packed != nullptr ? packed_head<T>(p, token, t, head[i]) + chunk[i] * VEC
                                     : static_cast<T*>(outs[t]) + token * D + col;
        store_vec<T, VEC>(out, x1);
        store_vec<T, VEC>(out + half, x2);
      }
      if (NT == 2 && p.packed != nullptr) {  // v's columns of this pair, copied as they are
        const T* vrow = at_row<T>(p.v, b, s) + col;
        T* out = packed_head<T>(p, token, 2, head[i]) + chunk[i] * VEC;
        float v1[VEC], v2[VEC];
        load_vec<T, VEC>(vrow, v1);
        load_vec<T, VEC>(vrow + half, v2);
        store_vec<T, VEC>(out, v1);
        store_vec<T, VEC>(out + half, v2);
      }
    }
    if (p.part_out[0] != nullptr) __threadfence_system();  // parts in peers' memory: stored before the barrier
  }
}

// 1-D RoPE. Rows in token order (a token's q heads, then its k heads), outputs laid out (B, S, H, hd) like the
// q/k projections they come from: reads and writes both stream, the token's cos/sin row is shared by all its
// heads, and SDPA's output needs no transpose copy (with head-major q, cuDNN's output is head-major and
// transformers copies it back to token order). Work items per row: neox, half / VEC pairs (a first-half chunk
// and its second-half partner: each x and cos/sin value read once); interleaved, rot / VEC chunks of whole
// pairs; then (hd - rot) / VEC pass-through chunks. VEC divides `half` on the paths that use it. Index math in
// I = uint32_t when the sizes fit (64-bit divisions cost more than the access). Measured (H100): evict-first
// stores, faster in Llama-3-8B prefill; neox pairs instead of one chunk per thread re-reading partner and table,
// 2x8064 tokens x 2048: 69.5 -> 64.4 us (docs/tuning.md#rope).

// Work items of one row: the rotary ones (neox pairs of chunks or interleaved chunks), then the pass-through
// chunks (ceil: an odd head_dim leaves a short last one on the VEC = 2 interleaved path). In I, as the caller
// indexes (uint32_t in the kernels when the sizes fit).
template <int VEC, bool INTERLEAVED, typename I>
__host__ __device__ __forceinline__ I rope1d_rot_items(const Rope1dParams& p) {
  return static_cast<I>(INTERLEAVED ? 2 * p.half : p.half) / VEC;
}

template <int VEC, bool INTERLEAVED, typename I>
__host__ __device__ __forceinline__ I rope1d_items(const Rope1dParams& p) {
  return rope1d_rot_items<VEC, INTERLEAVED, I>(p) + static_cast<I>(p.hd - 2 * p.half + VEC - 1) / VEC;
}

// One work item j (a neox pair of chunks, an interleaved chunk, or a pass-through chunk) of head h (q heads
// first, then k heads) of token (b, s).
template <typename T, int VEC, bool INTERLEAVED, typename I>
__device__ __forceinline__ void rope1d_item(const Rope1dParams& p, I b, I s, I token, I h, I j) {
  const I Hq = static_cast<I>(p.Hq), Hk = static_cast<I>(p.Hk), hd = static_cast<I>(p.hd);
  const I half = static_cast<I>(p.half), rot = 2 * half;
  const I rot_items = rope1d_rot_items<VEC, INTERLEAVED, I>(p);
  const bool is_q = h < Hq;
  if (!is_q) h -= Hq;
  const T* x = is_q ? static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + s * p.q_ss
                    : static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh + s * p.k_ss;
  const int64_t out_row = token * (is_q ? Hq : Hk) + h;  // < total: fits I
  T* out = static_cast<T*>(is_q ? p.q_out : p.k_out) + out_row * p.hd;
  float y[VEC];
  if (j >= rot_items) {  // pass-through channels beyond the rotary dim
    const I col = rot + (j - rot_items) * VEC;
    if (col + VEC <= hd) {
      load_vec_keep<T, VEC>(x + col, y);
      store_stream<T, VEC>(out + col, y);
    } else {
      for (I c = col; c < hd; ++c) out[c] = x[c];
    }
    return;
  }
  const I col = j * VEC;
  float partner[VEC];  // neox: the chunk `half` channels on
  load_vec_keep<T, VEC>(x + col, y);
  if constexpr (!INTERLEAVED) load_vec_keep<T, VEC>(x + col + half, partner);
  const int64_t pos = p.pos ? p.pos[b * p.pos_sb + s * p.pos_ss] : b * p.pos_sb + s * p.pos_ss;
  const float* cos_row = p.cos + pos * p.table_stride;
  const float* sin_row = p.sin + pos * p.table_stride;
  if (pos < 0 || pos >= p.table_rows) {  // out-of-range position: poison the output, never read OOB
#pragma unroll
    for (int e = 0; e < VEC; ++e) y[e] = partner[e] = __int_as_float(0x7fc00000);
  } else if constexpr (INTERLEAVED) {
    float c2[VEC / 2], s2[VEC / 2];
    load_f32<VEC / 2>(cos_row + col / 2, c2);
    load_f32<VEC / 2>(sin_row + col / 2, s2);
#pragma unroll
    for (int m = 0; m < VEC; m += 2) {
      const float c = c2[m / 2], sv = s2[m / 2], x0 = y[m], x1 = y[m + 1];
      y[m] = x0 * c - x1 * sv;
      y[m + 1] = x1 * c + x0 * sv;
    }
  } else {
    float c[VEC], sv[VEC];
    load_f32<VEC>(cos_row + col, c);
    load_f32<VEC>(sin_row + col, sv);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float x0 = y[e], x1 = partner[e];
      y[e] = x0 * c[e] - x1 * sv[e];
      partner[e] = x1 * c[e] + x0 * sv[e];
    }
  }
  store_stream<T, VEC>(out + col, y);
  if constexpr (!INTERLEAVED) store_stream<T, VEC>(out + col + half, partner);
}

template <typename T, int VEC, bool INTERLEAVED, typename I>
__global__ void rope1d_kernel(Rope1dParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    const I S = static_cast<I>(p.S), heads = static_cast<I>(p.Hq + p.Hk);
    const I items = rope1d_items<VEC, INTERLEAVED, I>(p);
    const I total = static_cast<I>(p.B) * S * heads * items;
    for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<I>(gridDim.x) * blockDim.x) {
      const I row = i / items, j = i - row * items;
      const I token = row / heads, h = row - token * heads;
      const I b = token / S, s = token - b * S;
      rope1d_item<T, VEC, INTERLEAVED, I>(p, b, s, token, h, j);
    }
  }
}

// The same work with no index division: one block per token (grid (S, B)), threadIdx.x the item and
// threadIdx.y the head, for tokens whose items x heads fit one block (Llama-3-8B: 8 x 40). neox only: on the
// H200, 2x8064x2048 with positions went 49.0 -> 47.2 us without the flat kernel's three 32-bit divisions per
// item, while interleaved chunks lost (50.4 -> 53.1 us; docs/tuning.md#rope).
// LTXBENCH_ROPE1D_TOKEN=0 turns it off (A/B).
template <typename T, int VEC>
__global__ void rope1d_token_kernel(Rope1dParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    const uint32_t s = blockIdx.x, b = blockIdx.y;
    rope1d_item<T, VEC, false, uint32_t>(p, b, s, b * static_cast<uint32_t>(p.S) + s, threadIdx.y, threadIdx.x);
  }
}

bool aligned16(const void* ptr) { return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool rows_aligned(const Rows3& r, int v) { return aligned16(r.ptr) && r.sb % v == 0 && r.ss % v == 0; }
// Every part of a packed output 16-byte aligned (a part at a pointer of its own may start anywhere).
bool parts_aligned16(const void* packed, void* const* part_out) {
  for (int r = 0; r < kMaxPackParts; ++r)
    if (!aligned16(part_out[r])) return false;
  return aligned16(packed);
}

int grid_for(int64_t total) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t wanted = (total + kBlockThreads - 1) / kBlockThreads, cap = static_cast<int64_t>(sms) * 16;
  return static_cast<int>(wanted < cap ? wanted : cap);
}

// Vectors per thread of the fused q/k norm + RoPE. LTXBENCH_QK_VPT=1|2 overrides it, for tuning sweeps.
int qk_vectors_per_thread() {
  static const int forced = tuning_knob("LTXBENCH_QK_VPT");
  return forced == 1 ? 1 : 2;
}

int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Each head's FP8 scale for q (blockIdx.y 0) and k (1): fp8_pow2_scale of sqrt(D) · max |w| over the head's
// channels (the bound in Rope3dParams), and its reciprocal for every batch element.
template <typename T>
__global__ void fp8_head_scales_kernel(Rope3dParams p) {
  const int64_t h = blockIdx.x, hd = p.D / p.heads;
  const T* w = static_cast<const T*>(blockIdx.y ? p.wk : p.wq) + h * hd;
  float m = 0.f;
  for (int64_t j = threadIdx.x; j < hd; j += 32) m = fmaxf(m, fabsf(to_float<T>(w[j])));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float scale = fp8_pow2_scale(__fmul_rn(__fsqrt_rn(static_cast<float>(p.D)), m));
  if (threadIdx.x == 0) p.scale8[blockIdx.y * p.heads + h] = scale;
  float* descale = blockIdx.y ? p.k_descale : p.q_descale;
  for (int64_t b = threadIdx.x; b < p.B; b += 32) descale[b * p.heads + h] = 1.f / scale;
}

template <typename T, int VEC, int MAXV, bool FROM_GRID>
cudaError_t launch_3d_with(const Rope3dParams& p, cudaStream_t stream) {
  if (!p.norm) {
    rope3d_kernel<T, VEC, FROM_GRID><<<grid_for(p.B * p.S * (p.D / VEC)), kBlockThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const int64_t per_row = (p.D / VEC + MAXV - 1) / MAXV;
  if (per_row > kMaxRowThreads) return cudaErrorInvalidValue;  // the binding rejects such D first
  const int tpr = per_row <= 32 ? next_pow2(per_row) : static_cast<int>((per_row + 31) / 32 * 32);
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
                   (FROM_GRID || (rows_aligned(p.cos, 4) && rows_aligned(p.sin, 4)));
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

template <typename T, int VEC, bool INTERLEAVED> cudaError_t launch_1d_with(const Rope1dParams& p, cudaStream_t s) {
  const int64_t items = rope1d_items<VEC, INTERLEAVED, int64_t>(p);
  const int64_t total = (p.B * p.Hq * p.S + p.B * p.Hk * p.S) * items;
  static const bool token_blocks_off = tuning_off("LTXBENCH_ROPE1D_TOKEN");
  if constexpr (!INTERLEAVED) {
    const int64_t heads = p.Hq + p.Hk;
    if (!token_blocks_off && items * heads <= 1024 && p.B <= 65535 && total < (int64_t{1} << 31)) {  // S < 2^31 too
      const dim3 grid(static_cast<unsigned>(p.S), static_cast<unsigned>(p.B));
      const dim3 block(static_cast<unsigned>(items), static_cast<unsigned>(heads));
      rope1d_token_kernel<T, VEC><<<grid, block, 0, s>>>(p);
      return cudaGetLastError();
    }
  }
  if (total < (int64_t{1} << 31)) {  // so that i + grid stride cannot wrap either
    // neox pairs: one item per thread (the full grid measured 64.4 vs 66.2 us over the grid-stride cap).
    // Interleaved chunks keep the cap: the former per-chunk neox kernel lost with the full grid (72.7 vs 69.5 us).
    const int grid = INTERLEAVED ? grid_for(total) : static_cast<int>((total + kBlockThreads - 1) / kBlockThreads);
    rope1d_kernel<T, VEC, INTERLEAVED, uint32_t><<<grid, kBlockThreads, 0, s>>>(p);
  } else {
    rope1d_kernel<T, VEC, INTERLEAVED, int64_t><<<grid_for(total), kBlockThreads, 0, s>>>(p);
  }
  return cudaGetLastError();
}

template <typename T> cudaError_t launch_1d(const Rope1dParams& p, cudaStream_t stream) {
  constexpr int V = vec_width<T>();
  const bool vec = p.half % V == 0 && p.hd % V == 0 && aligned16(p.cos) && aligned16(p.sin) && aligned16(p.q) &&
                   aligned16(p.k) && aligned16(p.q_out) &&
                   aligned16(p.k_out) && p.q_sb % V == 0 && p.q_sh % V == 0 && p.q_ss % V == 0 &&
                   p.k_sb % V == 0 && p.k_sh % V == 0 && p.k_ss % V == 0;
  if (vec) return p.interleaved ? launch_1d_with<T, V, true>(p, stream) : launch_1d_with<T, V, false>(p, stream);
  return p.interleaved ? launch_1d_with<T, 2, true>(p, stream) : launch_1d_with<T, 1, false>(p, stream);
}

template <typename T, int VEC, int MAXP> cudaError_t launch_split_with(const RopeSplitParams& p, cudaStream_t s) {
  const int64_t per_row = (p.H * (p.half / VEC) + MAXP - 1) / MAXP;
  if (per_row > kMaxRowThreads) return cudaErrorInvalidValue;  // the binding rejects such D first
  const int tpr = per_row <= 32 ? next_pow2(per_row) : static_cast<int>((per_row + 31) / 32 * 32);
  const int rows_per_block = tpr >= kBlockThreads ? 1 : kBlockThreads / tpr;
  const int64_t blocks = (p.B * p.S + rows_per_block - 1) / rows_per_block;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidValue;  // grid.x limit
  const float inv_d = inverse_count(2 * p.half * p.H);
  const unsigned grid = static_cast<unsigned>(blocks), block = static_cast<unsigned>(rows_per_block * tpr);
  if (p.k.ptr) {
    rope_split_kernel<T, VEC, MAXP, 2><<<grid, block, 0, s>>>(p, tpr, inv_d);
  } else {
    rope_split_kernel<T, VEC, MAXP, 1><<<grid, block, 0, s>>>(p, tpr, inv_d);
  }
  return cudaGetLastError();
}

// 16-byte vectors where every operand allows (half a multiple of the width, rows, weights and tables aligned),
// one pair per thread (two for fp32 rows beyond 4096); else one element per chunk, eight pairs per thread: any
// half (odd included) and any alignment, D <= 8192 in 512 threads.
template <typename T> cudaError_t launch_split(const RopeSplitParams& p, cudaStream_t stream) {
  constexpr int V = vec_width<T>();
  const bool tables = aligned16(p.cos) && aligned16(p.sin) && p.t_sb % 4 == 0 && p.t_sh % 4 == 0 && p.t_ss % 4 == 0;
  const bool vec = p.half % V == 0 && rows_aligned(p.q, V) && rows_aligned(p.k, V) && aligned16(p.wq) &&
                   aligned16(p.wk) && aligned16(p.q_out) && aligned16(p.k_out) && tables &&
                   (p.packed == nullptr || (rows_aligned(p.v, V) && parts_aligned16(p.packed, p.part_out)));
  if (vec) {
    return p.H * (p.half / V) <= kMaxRowThreads ? launch_split_with<T, V, 1>(p, stream)
                                                 : launch_split_with<T, V, 2>(p, stream);
  }
  return launch_split_with<T, 1, 8>(p, stream);
}

}  // namespace

cudaError_t launch_rope_3d(const Rope3dParams& p, DType dtype, cudaStream_t stream) {
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

cudaError_t launch_rope_1d(const Rope1dParams& p, DType dtype, cudaStream_t stream) {
  if (p.B * p.S == 0 || p.hd == 0 || p.Hq + p.Hk == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_1d<decltype(tag)>(p, stream); });
}

cudaError_t launch_rope_split(const RopeSplitParams& p, DType dtype, cudaStream_t stream) {
  if (p.B * p.S == 0 || p.H * p.half == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_split<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
