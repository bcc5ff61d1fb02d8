// Attention of many queries over a short key sequence with an additive per-key mask: LTX-Video's cross-attention
// (2 x 32 heads x 2688-8064 video tokens over <= 128 text tokens, head dim 64; 13B: head dim 128).
//
// 16-bit inputs with head dim 64 or 128 (sm_80+) run on the tensor cores (mma.sync m16n8k16, fp32 accumulators),
// flash-attention style: blocks of 8 warps per (batch, head) hold up to 128 keys and the mask in shared memory,
// each warp takes 16-query tiles in turn; scores in steps of 64 keys with a running max and sum per query row
// (exp2 of log2-scaled scores); P rounded to the input dtype for the P.V product, as cuDNN and flash-attention do.
// Everything else (fp32, other head dims, pre-Ampere) runs the scalar kernel: one warp per query row, fp32 math.
#include "common/device.h"
#include "common/dtype.cuh"
#include "common/params.h"
#include "common/source_use.h"

#include <algorithm>

namespace ltxbench {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 8;          // warps per block of the tensor-core kernel, 16 query rows each
constexpr int kKeyChunk = 64;      // keys per S = Q K^T step (32 score registers per thread)
constexpr int kResident = 128;     // keys held in shared memory at a time
constexpr int kScalarWarps = 4;    // query rows per block of the scalar kernel

template <typename T> __device__ __forceinline__ float mask_value(const void* mask, int64_t i, bool f32) {
  return f32 ? static_cast<const float*>(mask)[i] : to_float<T>(static_cast<const T*>(mask)[i]);
}

// ---- tensor-core kernel ---------------------------------------------------------------------------------

// 2^x on the MUFU unit, subnormal results flushed to 0 (x <= 0 here: scores minus the running max). exp2f adds a
// compare and two multiplies around the same instruction to keep subnormals, which P in 16 bits cannot hold anyway.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// d += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                               uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// Four 8x8 b16 matrices from shared memory; lane t addresses row t % 8 of matrix t / 8 and receives element
// (t / 4, 2 (t % 4) + j) of each (.trans: element (2 (t % 4) + j, t / 4)).
template <bool TRANS> __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row_address));
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  }
#endif
}

// 16 bytes global -> shared without registers; src_bytes 0 writes zeros (rows past S).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

// Shared-memory rows padded by 8 elements (16 bytes): rows 4 banks apart, so 8 rows of one ldmatrix phase (or of
// the quad-wise fragment stores) touch 32 distinct banks.
template <typename T, int HD> struct KeySmem {
  T k[kResident][HD + 8];
  T v[kResident][HD + 8];
  float mask[kResident];      // log2-scaled additive mask; -inf past the last key
  T q[kWarps][2][16][HD + 8];  // per warp: this tile's Q (then its O, for coalesced stores) and the next tile's Q
};

// Keys key0 .. key0 + kResident (zeros and a -inf mask past L) into shared memory: every load issued before the
// first store.
template <typename T, int HD>
__device__ __forceinline__ void stage_keys(KeySmem<T, HD>& sm, const T* k, const T* v, const XAttnParams& p,
                                           int64_t b, int64_t h, int64_t key0) {
  constexpr int kVecs = HD / 8, kPer = kResident * kVecs / (kWarps * 32);
  int4 kv[kPer], vv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kWarps * 32, r = i / kVecs, col = (i % kVecs) * 8;
    kv[j] = vv[j] = make_int4(0, 0, 0, 0);
    if (key0 + r < p.L) {
      kv[j] = __ldg(reinterpret_cast<const int4*>(k + (key0 + r) * p.k_sl + col));
      vv[j] = __ldg(reinterpret_cast<const int4*>(v + (key0 + r) * p.v_sl + col));
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kWarps * 32, r = i / kVecs, col = (i % kVecs) * 8;
    *reinterpret_cast<int4*>(&sm.k[r][col]) = kv[j];
    *reinterpret_cast<int4*>(&sm.v[r][col]) = vv[j];
  }
  for (int r = threadIdx.x; r < kResident; r += kWarps * 32) {
    float mv = -INFINITY;
    if (key0 + r < p.L) {
      mv = p.mask ? mask_value<T>(p.mask, b * p.mask_sb + h * p.mask_sh + key0 + r, p.mask_f32) * kLog2e : 0.f;
    }
    sm.mask[r] = mv;
  }
}

// One warp's 16 query rows row0 .. row0 + 15 into its shared buffer (cp.async, one commit group; zeros past S).
template <typename T, int HD>
__device__ __forceinline__ void prefetch_q(T (&dst)[16][HD + 8], const T* q, int64_t q_ss, int64_t row0, int64_t S,
                                           int lane) {
#pragma unroll
  for (int i = lane; i < 16 * (HD / 8); i += 32) {
    const int r = i / (HD / 8), col = (i % (HD / 8)) * 8;
    const bool in = row0 + r < S;
    cp_async16(&dst[r][col], in ? q + (row0 + r) * q_ss + col : q, in ? 16 : 0);
  }
  cp_async_commit();
}

// Grid (ctas per (b, h), H, B). Each warp takes the 16-query tiles blockIdx.x * kWarps + warp + n * warps_per_bh of
// its (b, h). With L <= kResident every key stays in shared memory for all of a block's tiles and the warps run
// without barriers (a warp leaves when its tiles are done); longer key sequences are staged kResident keys at a
// time, with barriers, so there every warp runs the same number of tiles (those past S compute and store nothing).
// The next tile's Q is fetched by cp.async while this one computes; Q and K fragments come from shared memory by
// ldmatrix, and O leaves through the warp's Q buffer as 16-byte row chunks.
// Two blocks per SM at head dim 64 (128 registers), one at 128.
template <typename T, int HD>
__global__ void __launch_bounds__(kWarps * 32, HD == 64 ? 2 : 1) xattn_mma_kernel(XAttnParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // the host runs the scalar kernel below sm_80
#else
    extern __shared__ __align__(16) unsigned char smem_raw[];
    KeySmem<T, HD>& sm = *reinterpret_cast<KeySmem<T, HD>*>(smem_raw);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;  // fragment row group and column pair
    const int mrow = lane & 7, mat = lane >> 3;  // the row and matrix this lane addresses in ldmatrix
    const int64_t b = blockIdx.z, h = blockIdx.y;
    const T* q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
    const T* k = static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh;
    const T* v = static_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh;
    T* out = static_cast<T*>(p.out) + (b * p.S * p.H + h) * HD;
    const int64_t out_ss = p.H * HD;
    const float scale = p.scale * kLog2e;
    const bool resident = p.L <= kResident;
    const int64_t tiles = (p.S + 15) / 16, warps_per_bh = static_cast<int64_t>(gridDim.x) * kWarps;
    const int64_t first = blockIdx.x * kWarps + warp;
    // Resident keys: this warp's own tile count; staged keys: the grid's largest, so that every warp meets every barrier.
    const int64_t iters = resident ? (first < tiles ? (tiles - first + warps_per_bh - 1) / warps_per_bh : 0)
                                   : (tiles + warps_per_bh - 1) / warps_per_bh;
    T (*qbuf)[16][HD + 8] = sm.q[warp];
    if (iters > 0) prefetch_q<T, HD>(qbuf[0], q, p.q_ss, first * 16, p.S, lane);
    if (resident) {
      stage_keys(sm, k, v, p, b, h, 0);
      __syncthreads();
    }

    for (int64_t it = 0; it < iters; ++it) {
      const int buf = static_cast<int>(it & 1);
      const int64_t row0 = (first + it * warps_per_bh) * 16;  // past S (staged keys only): computes, stores nothing
      if (it + 1 < iters) {
        prefetch_q<T, HD>(qbuf[buf ^ 1], q, p.q_ss, row0 + warps_per_bh * 16, p.S, lane);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncwarp();
      float o[HD / 8][4];
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
      float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // l: this thread's share of the row sum

      for (int64_t key0 = 0; key0 < p.L; key0 += kResident) {
        if (!resident) {
          __syncthreads();  // every warp is done with the previous keys
          stage_keys(sm, k, v, p, b, h, key0);
          __syncthreads();
        }
        for (int c0 = 0; c0 < kResident && key0 + c0 < p.L; c0 += kKeyChunk) {
          // S = Q K^T for 64 keys: 8 tiles of 8 keys, s[nt][0..1] row g, [2..3] row g + 8, keys 8 nt + 2c (+1).
          float s[kKeyChunk / 8][4];
#pragma unroll
          for (int nt = 0; nt < kKeyChunk / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
          for (int kk = 0; kk < HD / 16; ++kk) {
            // A: rows (0-7 | 8-15) x channels (kk*16 | +8), the order of mma's a0..a3.
            uint32_t qa[4];
            ldmatrix_x4<false>(qa, &qbuf[buf][mrow + (mat & 1) * 8][kk * 16 + (mat >> 1) * 8]);
#pragma unroll
            for (int nt = 0; nt < kKeyChunk / 8; nt += 2) {
              // B of key tiles nt and nt + 1: matrices (nt lo | nt hi | nt+1 lo | nt+1 hi) of K's [key][channel] rows.
              uint32_t kb[4];
              ldmatrix_x4<false>(kb, &sm.k[c0 + (nt + (mat >> 1)) * 8 + mrow][kk * 16 + (mat & 1) * 8]);
              mma16816<T>(s[nt], qa, kb[0], kb[1]);
              mma16816<T>(s[nt + 1], qa, kb[2], kb[3]);
            }
          }
          float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kKeyChunk / 8; ++nt) {
            const float2 km = *reinterpret_cast<const float2*>(&sm.mask[c0 + nt * 8 + 2 * c]);
            s[nt][0] = fmaf(s[nt][0], scale, km.x), s[nt][1] = fmaf(s[nt][1], scale, km.y);
            s[nt][2] = fmaf(s[nt][2], scale, km.x), s[nt][3] = fmaf(s[nt][3], scale, km.y);
            mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
          }
#pragma unroll
          for (int off = 1; off <= 2; off <<= 1) {  // the 4 threads of a row
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
          }
          const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
          // A row whose keys so far are all -inf subtracts 0 (not -inf - -inf = NaN); its sum stays 0.
          const float base_a = new_a == -INFINITY ? 0.f : new_a, base_b = new_b == -INFINITY ? 0.f : new_b;
          const float corr_a = exp2_ftz(m_a - base_a), corr_b = exp2_ftz(m_b - base_b);
          m_a = new_a, m_b = new_b;
          float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
          for (int nt = 0; nt < kKeyChunk / 8; ++nt) {
            s[nt][0] = exp2_ftz(s[nt][0] - base_a), s[nt][1] = exp2_ftz(s[nt][1] - base_a);
            s[nt][2] = exp2_ftz(s[nt][2] - base_b), s[nt][3] = exp2_ftz(s[nt][3] - base_b);
            sum_a += s[nt][0] + s[nt][1];
            sum_b += s[nt][2] + s[nt][3];
          }
          l_a = l_a * corr_a + sum_a, l_b = l_b * corr_b + sum_b;
#pragma unroll
          for (int i = 0; i < HD / 8; ++i) o[i][0] *= corr_a, o[i][1] *= corr_a, o[i][2] *= corr_b, o[i][3] *= corr_b;

          // O += P V: P's accumulator layout of two adjacent key tiles is the A operand of one 16-key step.
#pragma unroll
          for (int ks = 0; ks < kKeyChunk / 16; ++ks) {
            const uint32_t pa[4] = {pack2<T>(s[2 * ks][0], s[2 * ks][1]), pack2<T>(s[2 * ks][2], s[2 * ks][3]),
                                    pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                    pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
            // Matrices (keys 0-7 | 8-15) x (channels dn | dn + 8), transposed.
            const T* vrow = sm.v[c0 + ks * 16 + (mat & 1) * 8 + mrow];
#pragma unroll
            for (int dn = 0; dn < HD / 8; dn += 2) {
              uint32_t vb[4];
              ldmatrix_x4<true>(vb, vrow + (dn + (mat >> 1)) * 8);
              mma16816<T>(o[dn], pa, vb[0], vb[1]);
              mma16816<T>(o[dn + 1], pa, vb[2], vb[3]);
            }
          }
        }
      }

#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
      }
      const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;  // 0/0 = NaN for a fully masked row, as torch's math
      // O through this tile's Q buffer (its Q is no longer needed), then out as 16-byte chunks of whole rows.
      __syncwarp();
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(&qbuf[buf][g][dn * 8 + 2 * c]) = pack2<T>(o[dn][0] * inv_a, o[dn][1] * inv_a);
        *reinterpret_cast<uint32_t*>(&qbuf[buf][g + 8][dn * 8 + 2 * c]) = pack2<T>(o[dn][2] * inv_b, o[dn][3] * inv_b);
      }
      __syncwarp();
#pragma unroll
      for (int i = lane; i < 16 * (HD / 8); i += 32) {
        const int r = i / (HD / 8), col = (i % (HD / 8)) * 8;
        if (row0 + r < p.S)
          *reinterpret_cast<int4*>(out + (row0 + r) * out_ss + col) = *reinterpret_cast<const int4*>(&qbuf[buf][r][col]);
      }
      __syncwarp();  // the buffer takes the tile after next's Q
    }
#endif
  }
}

// ---- scalar kernel ----------------------------------------------------------------------------------------

// One warp per query row (b, s, h); lane l holds channels l, l + 32, ... (DPL of them); keys one at a time with a
// running max and sum, fp32 throughout (P is not rounded).
template <typename T, int DPL>
__global__ void __launch_bounds__(kScalarWarps * 32) xattn_scalar_kernel(XAttnParams p) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kScalarWarps + (threadIdx.x >> 5);
    if (row >= p.B * p.S * p.H) return;
    const int64_t h = row % p.H, s = (row / p.H) % p.S, b = row / (p.H * p.S);
    const T* q = static_cast<const T*>(p.q) + b * p.q_sb + s * p.q_ss + h * p.q_sh;
    const T* k = static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh;
    const T* v = static_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      qv[i] = d < p.hd ? to_float<T>(q[d]) : 0.f;
      acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int64_t j = 0; j < p.L; ++j) {
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < p.hd) dot = fmaf(qv[i], to_float<T>(k[j * p.k_sl + d]), dot);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const float score = dot * p.scale + (p.mask ? mask_value<T>(p.mask, b * p.mask_sb + h * p.mask_sh + j, p.mask_f32) : 0.f);
      const float m_new = fmaxf(m, score);
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float corr = expf(m - base), pj = expf(score - base);
      m = m_new;
      l = l * corr + pj;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        acc[i] = acc[i] * corr + (d < p.hd ? pj * to_float<T>(v[j * p.v_sl + d]) : 0.f);
      }
    }
    T* out = static_cast<T*>(p.out) + ((b * p.S + s) * p.H + h) * p.hd;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < p.hd) out[d] = from_float<T>(acc[i] / l);
    }
  }
}

template <typename T, int DPL> cudaError_t launch_scalar(const XAttnParams& p, cudaStream_t stream) {
  const int64_t rows = p.B * p.S * p.H;
  const int64_t blocks = (rows + kScalarWarps - 1) / kScalarWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  xattn_scalar_kernel<T, DPL><<<static_cast<unsigned>(blocks), kScalarWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T> cudaError_t launch_scalar_for(const XAttnParams& p, cudaStream_t stream) {
  switch ((p.hd + 31) / 32) {
    case 1: return launch_scalar<T, 1>(p, stream);
    case 2: return launch_scalar<T, 2>(p, stream);
    case 3: return launch_scalar<T, 3>(p, stream);
    case 4: return launch_scalar<T, 4>(p, stream);
    case 5: return launch_scalar<T, 5>(p, stream);
    case 6: return launch_scalar<T, 6>(p, stream);
    case 7: return launch_scalar<T, 7>(p, stream);
    case 8: return launch_scalar<T, 8>(p, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T, int HD> cudaError_t launch_mma(const XAttnParams& p, cudaStream_t stream) {
  // Blocks per (b, h): as many as fit on the GPU at once over all (b, h), at most one per 128 queries.
  static int resident_blocks = [] {
    const int bytes = sizeof(KeySmem<T, HD>);
    cudaFuncSetAttribute(xattn_mma_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, xattn_mma_kernel<T, HD>, kWarps * 32, bytes);
    return multiprocessor_count() * (per_sm > 0 ? per_sm : 1);
  }();
  const int64_t per_bh = std::max<int64_t>(1, std::min<int64_t>((p.S + kWarps * 16 - 1) / (kWarps * 16),
                                                                 resident_blocks / (p.B * p.H)));
  const dim3 grid(static_cast<unsigned>(per_bh), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
  xattn_mma_kernel<T, HD><<<grid, kWarps * 32, sizeof(KeySmem<T, HD>), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool xattn_uses_tensor_cores(int64_t hd, DType dtype, int compute_capability_major) {
  NOTE_SOURCE_USED();
  return dtype != DType::F32 && (hd == 64 || hd == 128) && compute_capability_major >= 8;
}

cudaError_t launch_cross_attention(const XAttnParams& p, DType dtype, int compute_capability_major,
                                   cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.B * p.S * p.H == 0) return cudaSuccess;
  if (p.hd < 1 || p.hd > 256 || p.L < 1) return cudaErrorInvalidValue;
  const bool mma = xattn_uses_tensor_cores(p.hd, dtype, compute_capability_major);
  return dispatch_dtype(dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      if (mma) return p.hd == 64 ? launch_mma<T, 64>(p, stream) : launch_mma<T, 128>(p, stream);
    }
    return launch_scalar_for<T>(p, stream);
  });
}

}  // namespace ltxbench
