// The row-wise normalization family: RMSNorm / LayerNorm (no affine), optional residual add with gate,
// optional weight, optional AdaLN modulation, configured by RowOpParams (common/params.h). Rows that suit
// it go to the one-row-per-block kernel of norm_lean.cu; the general kernels here take every other case.
//
// Each row is handled by `tpr` threads. When the row fits, every thread keeps its share
// in registers (MAXV vectors), so the input is read from memory exactly once; wider rows are streamed
// twice (or three times for LayerNorm) and rely on L2 for the re-reads.
#include "common/dtype.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/row_math.cuh"
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

constexpr int kBlockThreads = 256;       // block size when several rows share a block
constexpr int kMaxRowsWithSmem = 8;      // rows per block when tpr > 32 (256 / 64 = 4, so 8 is ample)
constexpr int kMaxCachedThreads = 512;   // keeps the register budget at 128 so the cached row never spills

// out = modulate(weight * norm(h)), all in fp32, rounded once on store.
template <typename T, int VEC>
__device__ __forceinline__ void finish_store(const RowOpParams& p, const RowPtrs<T>& r, int64_t col,
                                             const float (&h)[VEC], float mean, float rstd) {
  float n[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) n[k] = p.norm == NormKind::None ? h[k] : (h[k] - mean) * rstd;
  if (p.weight) {
    float w[VEC];
    load_vec<T, VEC>(static_cast<const T*>(p.weight) + col, w);
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[k] += p.weight_offset;
    apply_weight<T, VEC>(n, w, p.cast_before_weight);
  }
  if (r.scale) {
    float sc[VEC], sh[VEC];
    load_vec<T, VEC>(r.scale + col, sc);
    load_vec<T, VEC>(r.shift + col, sh);
    modulate<VEC>(n, sc, sh);
  }
  store_vec<T, VEC>(r.out + col, n);
}

// Row cached in registers: MAXV vectors of VEC elements per thread.
template <typename T, int VEC, int MAXV, int ARITY>
__global__ void __launch_bounds__(kMaxCachedThreads) row_op_cached(RowOpParams p, int tpr) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float smem[kMaxRowsWithSmem * 32 * 2];
    const int64_t rows = p.B * p.S;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
    const int lane = threadIdx.x % tpr;
    const bool active = row < rows;  // inactive threads still join the block-wide reductions
    const int64_t nvec = p.D / VEC;
    const RowPtrs<T> r = row_ptrs<T>(p, active ? row : 0);

    bool valid[MAXV];
    RawH<T, VEC> raw[MAXV];
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {  // every load of the row first, so that all are in flight together
      const int64_t j = lane + static_cast<int64_t>(i) * tpr;
      valid[i] = active && j < nvec;
      if (valid[i]) raw[i] = load_raw_h<T, VEC, ARITY, true>(r, j * VEC);
    }
    float h[MAXV][VEC];
    float s1[1] = {0.f};
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      if (!valid[i]) continue;
      combine_h<T, VEC, ARITY>(raw[i], h[i]);
      if (r.h_out) store_vec<T, VEC>(r.h_out + (lane + static_cast<int64_t>(i) * tpr) * VEC, h[i]);
      s1[0] += first_pass_term<VEC>(p.norm, h[i]);
    }
    RowStats st;
    if (p.norm != NormKind::None) {
      const float D = static_cast<float>(p.D);
      row_group_sum<1>(s1, tpr, smem);
      if (p.norm == NormKind::Layer) {
        float s2[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < MAXV; ++i) {
          if (valid[i]) add_centered<VEC>(h[i], s1[0] / D, s2);
        }
        row_group_sum<2>(s2, tpr, smem);
        st = layer_stats(s1[0] / D, s2, D, p.eps);
      } else {
        st = rms_stats(s1[0], D, p.eps);
      }
    }
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      if (valid[i])
        finish_store<T, VEC>(p, r, (lane + static_cast<int64_t>(i) * tpr) * VEC, h[i], st.mean, st.rstd);
    }
  }
}

// Rows too wide for registers: one block per row, the inputs re-read for each pass.
template <typename T, int VEC, int ARITY>
__global__ void __launch_bounds__(1024) row_op_streamed(RowOpParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float smem[32 * 2];
    const int tpr = blockDim.x;
    const int64_t nvec = p.D / VEC;
    const RowPtrs<T> r = row_ptrs<T>(p, blockIdx.x);
    float h[VEC];
    float s1[1] = {0.f};
    for (int64_t j = threadIdx.x; j < nvec; j += tpr) {
      load_h<T, VEC, ARITY>(r, j * VEC, h);
      if (r.h_out) store_vec<T, VEC>(r.h_out + j * VEC, h);
      s1[0] += first_pass_term<VEC>(p.norm, h);
    }
    RowStats st;
    if (p.norm != NormKind::None) {
      const float D = static_cast<float>(p.D);
      row_group_sum<1>(s1, tpr, smem);
      if (p.norm == NormKind::Layer) {
        float s2[2] = {0.f, 0.f};
        for (int64_t j = threadIdx.x; j < nvec; j += tpr) {
          load_h<T, VEC, ARITY>(r, j * VEC, h);
          add_centered<VEC>(h, s1[0] / D, s2);
        }
        row_group_sum<2>(s2, tpr, smem);
        st = layer_stats(s1[0] / D, s2, D, p.eps);
      } else {
        st = rms_stats(s1[0], D, p.eps);
      }
    }
    for (int64_t j = threadIdx.x; j < nvec; j += tpr) {
      load_h<T, VEC, ARITY>(r, j * VEC, h);
      finish_store<T, VEC>(p, r, j * VEC, h, st.mean, st.rstd);
    }
  }
}

template <typename T, int VEC, int MAXV, int ARITY>
cudaError_t launch_with(const RowOpParams& p, cudaStream_t stream) {
  const int64_t rows = p.B * p.S;
  const int64_t nvec = p.D / VEC;
  if (nvec <= static_cast<int64_t>(kMaxCachedThreads) * MAXV) {
    // Every thread holds MAXV vectors, e.g. 96 threads for a 3072-wide bf16 row rather than 128.
    const int64_t per_row = (nvec + MAXV - 1) / MAXV;
    const int tpr = threads_per_row(per_row);
    const int rows_per_block = tpr >= kBlockThreads ? 1 : kBlockThreads / tpr;
    const int threads = rows_per_block * tpr;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    row_op_cached<T, VEC, MAXV, ARITY><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p, tpr);
  } else {
    row_op_streamed<T, VEC, ARITY><<<static_cast<unsigned>(rows), 1024, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T, int VEC, int MAXV> cudaError_t launch_arity(const RowOpParams& p, cudaStream_t stream) {
  if (p.a.ptr == nullptr) return launch_with<T, VEC, MAXV, 1>(p, stream);
  if (p.gate.ptr == nullptr) return launch_with<T, VEC, MAXV, 2>(p, stream);
  return launch_with<T, VEC, MAXV, 3>(p, stream);
}

// Vectors each thread keeps in registers: 4 for one input, 2 when a residual (and gate) is added, which
// holds two or three raw vectors per slot (H100 bf16 sweep, docs/tuning.md#row-kernels-norms-residuals-modulation:
// 4 won every one-input shape, 2 every residual shape, e.g. fused add 8192x4096 99.0 -> 97.2 us; 4 spills there
// with the bf16 widening). LTXBENCH_ROW_VPT=2 overrides it for one-input rows.
template <typename T> cudaError_t launch_typed(const RowOpParams& p, cudaStream_t stream) {
  static const bool vpt2 = tuning_knob("LTXBENCH_ROW_VPT") == 2;
  constexpr int V = vec_width<T>();
  if (!vectorizable<T>(p)) return launch_arity<T, 1, 8>(p, stream);
  if (p.a.ptr) return launch_arity<T, V, 2>(p, stream);
  return vpt2 ? launch_with<T, V, 2, 1>(p, stream) : launch_with<T, V, 4, 1>(p, stream);
}

}  // namespace

cudaError_t launch_row_op(const RowOpParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.B * p.S == 0 || p.D == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (try_launch_row_op_lean(p, dtype, stream, &err)) return err;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
