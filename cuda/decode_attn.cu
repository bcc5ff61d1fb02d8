// Decode attention: the few query rows of one token over a long key/value cache, grouped-query attention packed as
// transformers packs it for a decode step: q (B, H_kv, G, hd), the G query heads that share key/value head h, over
// k, v (B, H_kv, L, hd) in the static cache's own layout, with a mask per key shared by the heads.
//
// A batch-1 step has H_kv (8 for Llama-3-8B) such groups: one block per group, as flash kernels schedule it, leaves
// most SMs idle and reads the cache at a fraction of the bandwidth (cuDNN: ~16 us a layer for 2.4 MB on an H100). So
// the keys are split: block (split, group) takes keys [split * chunk, (split + 1) * chunk), its four warps a few keys
// each in turn (a tile: their scores summed over the lanes together, one max and one rescale per tile), each query's
// running max and sum (log2 domain) and its fp32 output row spread over the lanes; the warps meet in shared
// memory, and the splits' partial rows are merged by a second kernel (skipped with one split) or, on Hopper, by the
// blocks of a thread block cluster (one cluster per group, at most 16 splits; LTXBENCH_DECODE_CLUSTER=0 turns it off)
// through each other's shared memory. Both merge in the same order with the same fmaf chains: the same bits. Keys
// the mask excludes (false, or an additive -inf) are not read; a warp reads the mask of its next 32 keys at once,
// then their rows a few keys at a time, so that a split costs few memory round trips. The probabilities stay in
// fp32 for the P.V sums (flash kernels round them to the input dtype), and the output is rounded once. A query with
// no key left gets zeros.
#include "common/device.h"
#include "common/dtype.cuh"
#include "common/params.h"
#include "common/source_use.h"
#include "common/tuning.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>

#include <cooperative_groups.h>

namespace ltxbench {
namespace {

constexpr int kWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMinKeysPerSplit = 32;
constexpr int kBlocksPerSm = 4;
constexpr int kMaxSplits = 256;  // the merge holds each split's (max, sum) in shared memory
// Splits merged in a cluster: 16, the largest cluster Hopper allows (non-portable; 8 is portable). Where 17-32
// splits would be chosen, 16 are (a split then takes at most twice the keys, still few), so that the merge kernel,
// ~5 us a layer on an H100 with its launch, goes.
constexpr int kMaxClusterSplits = 16;

// Whether the current device merges the splits in a cluster: compute capability 9 or later, unless
// LTXBENCH_DECODE_CLUSTER=0 (then the merge kernel). Asked once per device.
bool cluster_merge_allowed() {
  constexpr int kMaxDevices = 64;
  static const bool off = tuning_off("LTXBENCH_DECODE_CLUSTER");
  static std::atomic<int> majors[kMaxDevices] = {};
  int device = 0;
  if (off || cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int major = majors[device].load(std::memory_order_relaxed);
  if (major <= 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    majors[device].store(major, std::memory_order_relaxed);
  }
  return major >= 9;
}

// E elements of a head row per lane: contiguous at lane * E (VEC: one to two wide loads), else lane + 32 i.
template <typename T, int E, bool VEC>
__device__ __forceinline__ void load_lane(const T* row, int lane, int64_t hd, float (&x)[E]) {
  if constexpr (VEC) {
    constexpr int kBytes = E * static_cast<int>(sizeof(T));
    T raw[E];
    const T* p = row + lane * E;
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int c = 0; c < kBytes / 16; ++c)
        reinterpret_cast<int4*>(raw)[c] = __ldg(reinterpret_cast<const int4*>(p) + c);
    } else if constexpr (kBytes == 8) {
      *reinterpret_cast<uint2*>(raw) = __ldg(reinterpret_cast<const uint2*>(p));
    } else if constexpr (kBytes == 4) {
      *reinterpret_cast<unsigned*>(raw) = __ldg(reinterpret_cast<const unsigned*>(p));
    } else {
#pragma unroll
      for (int i = 0; i < E; ++i) raw[i] = p[i];
    }
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = to_float<T>(raw[i]);
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t d = lane + 32 * i;
      x[i] = d < hd ? to_float<T>(row[d]) : 0.f;
    }
  }
}

template <int E, bool VEC> __device__ __forceinline__ int64_t lane_index(int lane, int i) {
  return VEC ? lane * E + i : lane + 32 * i;
}

// Key j's additive term in the log2 domain, or false where the mask excludes it (its rows are then not read).
template <typename T>
__device__ __forceinline__ bool key_term(const DecodeAttnParams& p, int64_t b, int64_t j, float& term) {
  term = 0.f;
  if (p.mask == nullptr) return true;
  const int64_t at = b * p.mask_sb + j * p.mask_sl;
  if (p.mask_kind == DecodeMask::Bool) return static_cast<const bool*>(p.mask)[at];
  const float m = p.mask_kind == DecodeMask::F32 ? static_cast<const float*>(p.mask)[at]
                                                 : to_float<T>(static_cast<const T*>(p.mask)[at]);
  term = fmaxf(m * kLog2e, -FLT_MAX);  // a dtype's lowest value (transformers' float masks) times log2(e) stays finite
  return m != -INFINITY;
}

// Sums each of N values (N a power of two, at most 32) over the warp, leaving lane l the total of value
// (l >> (5 - log2 N)) % N: at each step the lanes trade half of the values they still hold, so that N values take
// N - 1 + 5 - log2 N shuffles where N separate sums take 5 N.
template <int COUNT, int OFF, int N>
__device__ __forceinline__ float scatter_sum(float (&v)[N], int lane) {
  if constexpr (OFF == 0) {
    return v[0];
  } else if constexpr (COUNT == 1) {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);
    return scatter_sum<1, OFF / 2>(v, lane);
  } else {
    const bool upper = lane & OFF;
#pragma unroll
    for (int k = 0; k < COUNT / 2; ++k) {
      const float give = upper ? v[k] : v[k + COUNT / 2], keep = upper ? v[k + COUNT / 2] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, give, OFF);
    }
    return scatter_sum<COUNT / 2, OFF / 2>(v, lane);
  }
}

__host__ __device__ constexpr int log2_of(int n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }

// U keys at once (at[u] < 0: none; its rows are zeros) for QT query rows: the QT x U scores summed over the warp
// with scatter_sum, so that lane l holds score (r, u) = l >> SHIFT; the tile's max per row over the lanes of its row;
// each probability computed once, by the lanes that hold its score, and handed to every lane; then one rescale of
// the running sum and output row per tile, not per key.
template <int QT, int U, int E>
__device__ __forceinline__ void accumulate(const float (&q)[QT][E], const float (&kx)[U][E], const float (&vx)[U][E],
                                           const int (&at)[U], float my_term, int lane, float (&m)[QT],
                                           float (&l)[QT], float (&acc)[QT][E]) {
  constexpr int N = QT * U, SHIFT = 5 - log2_of(N);
  static_assert(N <= 32 && (N & (N - 1)) == 0, "scores of a tile: a power of two, at most one per lane");
  float s[N];
#pragma unroll
  for (int r = 0; r < QT; ++r) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[r * U + u] = 0.f;
#pragma unroll
      for (int i = 0; i < E; ++i) s[r * U + u] = fmaf(q[r][i], kx[u][i], s[r * U + u]);
    }
  }
  const float score = scatter_sum<N, 16>(s, lane);
  const int mine = (lane >> SHIFT) & (N - 1), my_row = mine / U, my_key = mine % U;
  int key_lane = at[0];
#pragma unroll
  for (int u = 1; u < U; ++u) key_lane = my_key == u ? at[u] : key_lane;
  const float term = __shfl_sync(0xffffffffu, my_term, key_lane < 0 ? 0 : key_lane);
  const float x = key_lane < 0 ? -INFINITY : score + term;
  float tile_max = x;
#pragma unroll
  for (int off = 1 << SHIFT; off < (U << SHIFT); off <<= 1)
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
  float top[QT], keep[QT], my_top = -INFINITY;
#pragma unroll
  for (int r = 0; r < QT; ++r) {
    top[r] = fmaxf(m[r], __shfl_sync(0xffffffffu, tile_max, (r * U) << SHIFT));  // finite: key at[0] is there
    keep[r] = exp2f(m[r] - top[r]);  // m = -inf at first: keep = 0
    my_top = my_row == r ? top[r] : my_top;
  }
  const float my_p = exp2f(x - my_top);  // no key: exp2(-inf) = 0
#pragma unroll
  for (int r = 0; r < QT; ++r) {
    float pr[U], total = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u) pr[u] = __shfl_sync(0xffffffffu, my_p, (r * U + u) << SHIFT), total += pr[u];
    l[r] = fmaf(l[r], keep[r], total);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      float a = acc[r][i] * keep[r];
#pragma unroll
      for (int u = 0; u < U; ++u) a = fmaf(pr[u], vx[u][i], a);
      acc[r][i] = a;
    }
    m[r] = top[r];
  }
}

// The rows a cluster's blocks left in shared memory (rows[split][r][d], stats[split][r] = (max, sum)), merged as
// decode_attn_merge_kernel merges them: each output element by one thread of the cluster, its splits in order.
template <typename T, int QT, int W>
__device__ __forceinline__ void merge_in_cluster(const DecodeAttnParams& p, int64_t h, int64_t g0, int64_t b,
                                                 int rows, float (&sh_part)[QT][W], float (&sh_stat)[QT][2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's partial rows are written
  const int splits = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  for (int64_t at = rank * static_cast<int64_t>(blockDim.x) + threadIdx.x; at < rows * p.hd;
       at += static_cast<int64_t>(splits) * blockDim.x) {
    const int r = static_cast<int>(at / p.hd), d = static_cast<int>(at % p.hd);
    // Every split's (max, sum) and value loaded before any is used, so that the remote loads are in flight together
    // (a loop that waited for each would cost a round trip per split); then the merge kernel's chains, in its order.
    float m[kMaxClusterSplits], l[kMaxClusterSplits], x[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) {
        const float* stat = cluster.map_shared_rank(&sh_stat[r][0], s);
        m[s] = stat[0], l[s] = stat[1], x[s] = *cluster.map_shared_rank(&sh_part[r][d], s);
      }
    }
    float top = -INFINITY, total = 0.f, sum = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s)
      if (s < splits) top = fmaxf(top, m[s]);
    if (top != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < splits) {
          const float factor = exp2f(m[s] - top);  // a split without keys: exp2(-inf) = 0
          total = fmaf(l[s], factor, total);
          sum = fmaf(x[s], factor, sum);
        }
      }
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    static_cast<T*>(p.out)[((b * p.H + h) * p.G + g0 + r) * p.hd + d] = from_float<T>(sum * inv);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
#else
  __trap();  // launched as a cluster only where the kernel was built for sm_90 (cluster_fits)
#endif
}

// Block (split, group h x query tile, b): QT query rows of group h over the split's keys. With one split the rows
// are final (out, rounded to T); else partial: rows (sum of p v) and (max, sum) per query row and split, in global
// memory for the merge kernel or, CLUSTER, in shared memory for the cluster's merge.
template <typename T, int E, bool VEC, int QT, bool CLUSTER>
__global__ void __launch_bounds__(kWarps * 32) decode_attn_kernel(DecodeAttnParams p, int64_t chunk, int64_t splits,
                                                                  float* part_rows, float* part_stats) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float sh_rows[kWarps][QT][E * 32];
    __shared__ float sh_m[kWarps][QT], sh_l[kWarps][QT];
    __shared__ float sh_part[CLUSTER ? QT : 1][CLUSTER ? E * 32 : 1], sh_stat[CLUSTER ? QT : 1][2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t tiles = (p.G + QT - 1) / QT;
    const int64_t split = blockIdx.x, h = blockIdx.y / tiles, g0 = (blockIdx.y % tiles) * QT, b = blockIdx.z;
    const int rows = p.G - g0 < QT ? static_cast<int>(p.G - g0) : QT;
    const float qscale = p.scale * kLog2e;
    float q[QT][E], acc[QT][E], m[QT], l[QT];
#pragma unroll
    for (int r = 0; r < QT; ++r) {
      if (r < rows) {
        load_lane<T, E, VEC>(static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (g0 + r) * p.q_sg, lane, p.hd,
                             q[r]);
      } else {
#pragma unroll
        for (int i = 0; i < E; ++i) q[r][i] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < E; ++i) q[r][i] *= qscale, acc[r][i] = 0.f;
      m[r] = -INFINITY, l[r] = 0.f;
    }
    const T* keys = static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh;
    const T* values = static_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh;
    const int64_t s0 = split * chunk, s1 = p.L < s0 + chunk ? p.L : s0 + chunk;
    constexpr int U = E >= 8 ? 2 : 4;  // keys whose rows are in flight at once per warp
    // The warp's keys s0 + warp + kWarps n, 32 at a time: lane i reads key i's mask first (one round trip for all),
    // the ballot says which to read, and their rows are loaded U at a time before the first one's shuffles.
    for (int64_t base = s0 + warp; base < s1; base += 32 * kWarps) {
      const int64_t mine = base + static_cast<int64_t>(lane) * kWarps;
      float my_term = 0.f;
      const bool my_use = mine < s1 && key_term<T>(p, b, mine, my_term);
      unsigned todo = __ballot_sync(0xffffffffu, my_use);
      while (todo) {
        int at[U];
        float kx[U][E], vx[U][E];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          at[u] = todo ? __ffs(todo) - 1 : -1;
          todo &= todo ? todo - 1 : 0u;
          if (at[u] >= 0) {
            const int64_t j = base + static_cast<int64_t>(at[u]) * kWarps;
            load_lane<T, E, VEC>(keys + j * p.k_sl, lane, p.hd, kx[u]);
            load_lane<T, E, VEC>(values + j * p.v_sl, lane, p.hd, vx[u]);
          } else {
#pragma unroll
            for (int i = 0; i < E; ++i) kx[u][i] = vx[u][i] = 0.f;  // weight 0 must not meet a stale NaN
          }
        }
        accumulate<QT, U, E>(q, kx, vx, at, my_term, lane, m, l, acc);
      }
    }
#pragma unroll
    for (int r = 0; r < QT; ++r) {
#pragma unroll
      for (int i = 0; i < E; ++i) sh_rows[warp][r][lane * E + i] = acc[r][i];
      if (lane == 0) sh_m[warp][r] = m[r], sh_l[warp][r] = l[r];
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) {
      float top = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) top = fmaxf(top, sh_m[w][r]);
      float total = 0.f, row[E];
#pragma unroll
      for (int i = 0; i < E; ++i) row[i] = 0.f;
      if (top != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float f = exp2f(sh_m[w][r] - top);  // a warp without keys: exp2(-inf) = 0
          total = fmaf(sh_l[w][r], f, total);
#pragma unroll
          for (int i = 0; i < E; ++i) row[i] = fmaf(sh_rows[w][r][lane * E + i], f, row[i]);
        }
      }
      const int64_t g = g0 + r, query = (b * p.H + h) * p.G + g;  // out and the partials are dense (B, H, G, .)
      if constexpr (CLUSTER) {
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const int64_t d = lane_index<E, VEC>(lane, i);
          if (d < p.hd) sh_part[r][d] = row[i];
        }
        if (lane == 0) sh_stat[r][0] = top, sh_stat[r][1] = total;
      } else if (splits == 1) {
        const float inv = total > 0.f ? 1.f / total : 0.f;
        T* out = static_cast<T*>(p.out) + query * p.hd;
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const int64_t d = lane_index<E, VEC>(lane, i);
          if (d < p.hd) out[d] = from_float<T>(row[i] * inv);
        }
      } else {
        float* dst = part_rows + (query * splits + split) * p.hd;
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const int64_t d = lane_index<E, VEC>(lane, i);
          if (d < p.hd) dst[d] = row[i];
        }
        if (lane == 0) {
          part_stats[2 * (query * splits + split)] = top;
          part_stats[2 * (query * splits + split) + 1] = total;
        }
      }
    }
    if constexpr (CLUSTER) merge_in_cluster<T, QT, CLUSTER ? E * 32 : 1>(p, h, g0, b, rows, sh_part, sh_stat);
  }
}

// One block per query row: the splits' partial rows rescaled to the common max, summed, divided by the total. The
// (max, sum) pairs of every split are read into shared memory by all threads at once and each factor exp2(max - top)
// computed once, as a loop of global loads would wait for each load in turn (5.4 of a layer's 14.3 us of decode
// attention in an H200 profile, for ~300 KB); then each channel sums over the splits in order, its loads unrolled so
// that several are in flight. The fmaf chains are the serial merge's, in its order: the same bits.
template <typename T>
__global__ void decode_attn_merge_kernel(DecodeAttnParams p, int64_t splits, const float* part_rows,
                                         const float* part_stats) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float sh_factor[kMaxSplits], sh_sum[kMaxSplits];
    __shared__ float sh_top, sh_inv;
    const int64_t query = blockIdx.x;
    const float* stats = part_stats + 2 * query * splits;
    for (int64_t s = threadIdx.x; s < splits; s += blockDim.x)
      sh_factor[s] = stats[2 * s], sh_sum[s] = stats[2 * s + 1];  // (max, sum) until the factors replace the maxima
    __syncthreads();
    if (threadIdx.x == 0) {
      float top = -INFINITY;
      for (int64_t s = 0; s < splits; ++s) top = fmaxf(top, sh_factor[s]);
      sh_top = top;
    }
    __syncthreads();
    const float top = sh_top;
    for (int64_t s = threadIdx.x; s < splits; s += blockDim.x)
      sh_factor[s] = top != -INFINITY ? exp2f(sh_factor[s] - top) : 0.f;  // a split without keys: exp2(-inf) = 0
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.f;
      if (top != -INFINITY)
        for (int64_t s = 0; s < splits; ++s) total = fmaf(sh_sum[s], sh_factor[s], total);
      sh_inv = total > 0.f ? 1.f / total : 0.f;
    }
    __syncthreads();
    T* out = static_cast<T*>(p.out) + query * p.hd;
    for (int64_t d = threadIdx.x; d < p.hd; d += blockDim.x) {
      const float* row = part_rows + query * splits * p.hd + d;
      float sum = 0.f;
      if (top != -INFINITY) {
#pragma unroll 8
        for (int64_t s = 0; s < splits; ++s) sum = fmaf(row[s * p.hd], sh_factor[s], sum);
      }
      out[d] = from_float<T>(sum * sh_inv);
    }
  }
}

// A launch of `grid` with `splits` blocks a cluster (the attribute lives as long as the config that points at it).
struct ClusterLaunch {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(int64_t splits, dim3 grid, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(splits);
    attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
    config.gridDim = grid, config.blockDim = dim3(kWarps * 32), config.stream = stream;
    config.attrs = &attribute, config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether decode_attn_kernel's cluster form runs here with `splits` blocks a cluster: the device allows it
// (cluster_merge_allowed), the kernel was built for sm_90 (the form is compiled only there), and the occupancy query
// finds room for such a cluster. Asked once per device, instantiation and cluster size (the attribute that allows
// clusters of more than 8 blocks is set per device too).
template <typename T, int E, bool VEC, int QT>
bool cluster_fits(int64_t splits, dim3 grid, cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices][kMaxClusterSplits + 1] = {};  // 0 not asked, 1 fits, -1 does not
  int device = 0;
  if (splits < 2 || splits > kMaxClusterSplits || !cluster_merge_allowed() || cudaGetDevice(&device) != cudaSuccess ||
      device < 0 || device >= kMaxDevices)
    return false;
  int state = known[device][splits].load(std::memory_order_relaxed);
  if (state == 0) {
    auto kernel = decode_attn_kernel<T, E, VEC, QT, true>;
    const ClusterLaunch launch(splits, grid, stream);
    cudaFuncAttributes attributes{};
    int clusters = 0;
    const bool ok = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90 &&
                    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
                    cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters > 0;
    cudaGetLastError();  // a refused query leaves no error for the next launch to report
    state = ok ? 1 : -1;
    known[device][splits].store(state, std::memory_order_relaxed);
  }
  return state > 0;
}

template <typename T, int E, bool VEC, int QT>
cudaError_t launch_with(const DecodeAttnParams& p, int64_t splits, float* part_rows, float* part_stats,
                        cudaStream_t stream) {
  if (splits > kMaxSplits) return cudaErrorInvalidValue;  // decode_attention_splits never asks more
  const int64_t chunk = std::max<int64_t>(1, (p.L + splits - 1) / splits);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.H * ((p.G + QT - 1) / QT)),
                  static_cast<unsigned>(p.B));
  if (cluster_fits<T, E, VEC, QT>(splits, grid, stream)) {
    const ClusterLaunch launch(splits, grid, stream);
    return cudaLaunchKernelEx(&launch.config, decode_attn_kernel<T, E, VEC, QT, true>, p, chunk, splits, part_rows,
                              part_stats);
  }
  decode_attn_kernel<T, E, VEC, QT, false><<<grid, kWarps * 32, 0, stream>>>(p, chunk, splits, part_rows,
                                                                            part_stats);
  if (splits == 1) return cudaGetLastError();
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int threads = static_cast<int>(std::min<int64_t>(256, (p.hd + 31) / 32 * 32));
  decode_attn_merge_kernel<T><<<static_cast<unsigned>(p.B * p.H * p.G), threads, 0, stream>>>(p, splits, part_rows,
                                                                                              part_stats);
  return cudaGetLastError();
}

// Query rows per block: all of a group's where it has at most kSmall (Llama-3: 4; Gemma 3: 2), else tiles of kBig.
template <typename T, int E, bool VEC>
cudaError_t launch_rows(const DecodeAttnParams& p, int64_t splits, float* rows, float* stats, cudaStream_t s) {
  constexpr int kSmall = E >= 8 ? 2 : 4, kBig = 2 * kSmall;
  return p.G <= kSmall ? launch_with<T, E, VEC, kSmall>(p, splits, rows, stats, s)
                       : launch_with<T, E, VEC, kBig>(p, splits, rows, stats, s);
}

template <typename T, int E>
cudaError_t launch_width(const DecodeAttnParams& p, int64_t splits, float* rows, float* stats, cudaStream_t s) {
  return p.vectorized && p.hd == 32 * E ? launch_rows<T, E, true>(p, splits, rows, stats, s)
                                        : launch_rows<T, E, false>(p, splits, rows, stats, s);
}

}  // namespace

int decode_attention_lane_elems(int64_t hd) {
  NOTE_SOURCE_USED();
  const int64_t per_lane = std::max<int64_t>(1, (hd + 31) / 32);
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : 8;
}

int64_t decode_attention_splits(int64_t B, int64_t H, int64_t G, int64_t L, int64_t hd) {
  NOTE_SOURCE_USED();
  const int64_t small = decode_attention_lane_elems(hd) >= 8 ? 2 : 4, tile = G <= small ? small : 2 * small;
  const int64_t groups = std::max<int64_t>(1, B * H * ((G + tile - 1) / tile));
  static const int blocks_per_sm = tuning_knob("LTXBENCH_DECODE_BLOCKS_PER_SM") > 0
                                       ? tuning_knob("LTXBENCH_DECODE_BLOCKS_PER_SM") : kBlocksPerSm;
  static const int min_keys = tuning_knob("LTXBENCH_DECODE_MIN_KEYS") > 0 ? tuning_knob("LTXBENCH_DECODE_MIN_KEYS")
                                                                         : kMinKeysPerSplit;
  const int64_t wanted = (static_cast<int64_t>(blocks_per_sm) * multiprocessor_count() + groups - 1) / groups;
  const int64_t most = std::max<int64_t>(1, (L + min_keys - 1) / min_keys);
  int64_t splits = std::max<int64_t>(1, std::min<int64_t>({wanted, most, kMaxSplits}));
  if (splits > kMaxClusterSplits && splits <= 2 * kMaxClusterSplits && cluster_merge_allowed())
    splits = kMaxClusterSplits;  // merged in a cluster rather than by a second kernel
  const int64_t chunk = std::max<int64_t>(1, (L + splits - 1) / splits);
  return std::max<int64_t>(1, (L + chunk - 1) / chunk);  // no split without keys
}

cudaError_t launch_decode_attention(const DecodeAttnParams& p, DType dtype, int64_t splits, float* part_rows,
                                    float* part_stats, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  return dispatch_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    switch (decode_attention_lane_elems(p.hd)) {
      case 1: return launch_width<T, 1>(p, splits, part_rows, part_stats, stream);
      case 2: return launch_width<T, 2>(p, splits, part_rows, part_stats, stream);
      case 4: return launch_width<T, 4>(p, splits, part_rows, part_stats, stream);
      default: return launch_width<T, 8>(p, splits, part_rows, part_stats, stream);
    }
  });
}

}  // namespace ltxbench
