// LTX-2's q/k RMSNorm over all heads fused with its split RoPE: each head's two halves rotated against each
// other (neox pairs i, i + half) with angles from fp32 tables, for one tensor, q and k together, packed with v, or
// q and k written as FP8 for FP8 attention. All rotation math in fp32.
#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/rope.cuh"
#include "common/source_use.h"

namespace ltxbench {
namespace {

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
// registers across the reduction, as in qk_norm_rope_kernel. FP8 (NT = 2, unpacked): q and k stored as e4m3 times
// their group's scale (scale8, written before by split_fp8_scales_kernel); a pair never spans two groups.
template <typename T, int VEC, int MAXP, int NT, bool FP8 = false>
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
        if constexpr (FP8) {
          const float scale = p.scale8[t * p.groups + head[i] / (p.H / p.groups)];
          uint8_t* out = static_cast<uint8_t*>(outs[t]) + token * D + col;
          store_fp8<VEC>(out, x1, scale);
          store_fp8<VEC>(out + half, x2, scale);
        } else {
          T* out = p.packed != nullptr ? packed_head<T>(p, token, t, head[i]) + chunk[i] * VEC
                                       : static_cast<T*>(outs[t]) + token * D + col;
          store_vec<T, VEC>(out, x1);
          store_vec<T, VEC>(out + half, x2);
        }
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

template <typename T, int VEC, int MAXP> cudaError_t launch_split_with(const RopeSplitParams& p, cudaStream_t s) {
  const int64_t per_row = (p.H * (p.half / VEC) + MAXP - 1) / MAXP;
  if (per_row > kMaxRowThreads) return cudaErrorInvalidValue;  // the binding rejects such D first
  const int tpr = threads_per_row(per_row);
  const int rows_per_block = tpr >= kBlockThreads ? 1 : kBlockThreads / tpr;
  const int64_t blocks = (p.B * p.S + rows_per_block - 1) / rows_per_block;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidValue;  // grid.x limit
  const float inv_d = inverse_count(2 * p.half * p.H);
  const unsigned grid = static_cast<unsigned>(blocks), block = static_cast<unsigned>(rows_per_block * tpr);
  if (p.scale8 != nullptr) {
    rope_split_kernel<T, VEC, MAXP, 2, true><<<grid, block, 0, s>>>(p, tpr, inv_d);
  } else if (p.k.ptr) {
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

// Each group's FP8 scale for q (blockIdx.y 0) and k (1) and their reciprocals (weight_bound_scale).
template <typename T>
__global__ void split_fp8_scales_kernel(RopeSplitParams p) {
  weight_bound_scale<T>(p.wq, p.wk, p.H * 2 * p.half, p.groups, p.B, p.scale8, p.q_descale, p.k_descale);
}

}  // namespace

cudaError_t launch_rope_split(const RopeSplitParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.scale8 != nullptr && p.groups > 0) {  // the FP8 scales first (descales too where there are no tokens)
    const cudaError_t err = dispatch_dtype(dtype, [&](auto tag) {
      split_fp8_scales_kernel<decltype(tag)><<<dim3(static_cast<unsigned>(p.groups), 2), 32, 0, stream>>>(p);
      return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
  }
  if (p.B * p.S == 0 || p.H * p.half == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_split<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
