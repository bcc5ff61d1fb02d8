// FP8 (e4m3) with one fp32 scale per row, fused into the pass that produces the row (Fp8Params, common/params.h):
// a plain quantization, GELU-tanh, or RMSNorm + AdaLN modulation of x [+ a [* gate]]. The next projection then
// runs on the FP8 tensor cores (torch._scaled_mm, row-wise scales) without a quantize pass of its own.
//
// One row per block. Where the row fits (VPT vectors a thread, up to kMaxThreads threads) it is read once into
// registers: y in fp32, its amax by a block reduction, then q written. Wider rows are streamed (two passes for
// GELU / quantize, three for the norm, the re-reads from L2).
//
// Per (batch, head) instead (quantize_fp8_heads): the scales of FlashAttention-3's FP8 inputs, one per head of a
// batch element. The amax of a head spans all its tokens, so it takes two passes: the amax (atomicMax over chunks
// of tokens), then the quantization.
#include <algorithm>

#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/params.h"
#include "common/reduce.cuh"
#include "common/row_math.cuh"
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

constexpr int kMaxThreads = 512;
constexpr float kMinAmax = 1e-12f;  // an all-zero (or empty) row: finite scale, q = 0

// What produces y: compile-time, so that the plain ops carry no norm code. kNorm + 0/1/2: RMSNorm + modulation of
// x, x + a, x + a * gate.
enum Op : int { kQuantize = 0, kGelu = 1, kNorm = 2 };
template <int OP> __host__ __device__ constexpr int arity() { return OP >= kNorm ? OP - kNorm + 1 : 1; }

// GELU-tanh as act.cu computes it: g * sigmoid(2u) with the fast exponential and division for 16-bit inputs, the
// libm tanhf for fp32 ones.
template <typename T> __device__ __forceinline__ float gelu_tanh(float g) {
  const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);  // sqrt(2/pi)
  if constexpr (sizeof(T) == 2) return __fdividef(g, 1.f + __expf(-2.f * inner));
  else return 0.5f * g * (1.f + tanhf(inner));
}

// One value per thread summed, or maxed, over the block (whole warps); every thread gets the same bits. smem holds
// a float per warp and must not be in use by another reduction of the same row.
template <bool MAX> __device__ __forceinline__ float block_reduce(float v, float* smem) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = MAX ? fmaxf(v, o) : v + o;
  }
  const int warps = blockDim.x >> 5;
  if (warps == 1) return v;
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = smem[0];
  for (int w = 1; w < warps; ++w) r = MAX ? fmaxf(r, smem[w]) : r + smem[w];
  return r;
}

// y of the plain ops from the raw input vector.
template <typename T, int VEC, int OP> __device__ __forceinline__ void plain_values(const Vec<T, VEC>& raw,
                                                                                   float (&y)[VEC]) {
  widen<T, VEC>(raw, y);
  if constexpr (OP == kGelu) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = gelu_tanh<T>(y[k]);
  }
}

// h (in y) normalized, weighted and modulated in place: h * rstd [* weight] * (1 + scale) + shift, in fp32; without
// a weight folded into two instructions per element as norm_lean.cu does (row_math.cuh, modulate_normalized).
template <typename T, int VEC>
__device__ __forceinline__ void modulate_row(const RowOpParams& p, const RowPtrs<T>& r, int64_t col, float rstd,
                                             float (&y)[VEC]) {
  float sc[VEC], sh[VEC];
  widen<T, VEC>(load_raw<T, VEC>(r.scale + col), sc);
  widen<T, VEC>(load_raw<T, VEC>(r.shift + col), sh);
  if (p.weight) {
    float w[VEC];
    widen<T, VEC>(load_raw<T, VEC>(static_cast<const T*>(p.weight) + col), w);
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = fmaf(y[k] * rstd * w[k], 1.f + sc[k], sh[k]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = modulate_normalized(y[k], rstd, sc[k], sh[k]);
  }
}

template <int VEC> __device__ __forceinline__ float abs_max(float m, const float (&y)[VEC]) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) m = fmaxf(m, fabsf(y[k]));
  return m;
}

// x_scale = amax / 448; the kernels multiply by its reciprocal, within an fp32 ulp of the division and far inside
// e4m3's 2^-4 relative rounding.
__device__ __forceinline__ float row_scale(float amax) { return fmaxf(amax, kMinAmax) / kFp8Max; }

// The row held in registers: VPT vectors of VEC elements a thread, thread t holding vectors t, t + blockDim.x, ...
template <typename T, int VEC, int VPT, int OP>
__global__ void __launch_bounds__(kMaxThreads) fp8_rows_cached(Fp8Params p, float inv_d) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    constexpr int ARITY = arity<OP>();
    __shared__ float smem[2][kMaxThreads / 32];  // one per reduction: no barrier between them
    const RowOpParams& rp = p.rows;
    const int64_t row = blockIdx.x;
    const RowPtrs<T> r = row_ptrs<T>(rp, row);  // rp.out is null: q is addressed below
    const int nvec = static_cast<int>(rp.D / VEC);
    bool valid[VPT];
    RawH<T, VEC> raw[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {  // every load of the row before any arithmetic
      const int j = threadIdx.x + i * blockDim.x;
      valid[i] = j < nvec;
      if (valid[i]) raw[i] = load_raw_h<T, VEC, ARITY, true>(r, static_cast<int64_t>(j) * VEC);
    }
    float y[VPT][VEC];
    if constexpr (OP >= kNorm) {
      T* h_out = r.h_out;
      float sum_sq = 0.f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (!valid[i]) continue;
        combine_h<T, VEC, ARITY>(raw[i], y[i]);  // h rounded to T when a residual is added, as the model stores it
        if (h_out) store_vec<T, VEC>(h_out + (threadIdx.x + i * blockDim.x) * VEC, y[i]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum_sq = fmaf(y[i][k], y[i][k], sum_sq);
      }
      const float rstd = 1.f / sqrtf(fmaf(block_reduce<false>(sum_sq, smem[0]), inv_d, rp.eps));
      // scale/shift loaded after the reduction, as norm_lean.cu does: one (D,) pair per batch, L1/L2 hits
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int64_t col = static_cast<int64_t>(threadIdx.x + i * blockDim.x) * VEC;
        if (valid[i]) modulate_row<T, VEC>(rp, r, col, rstd, y[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (valid[i]) plain_values<T, VEC, OP>(raw[i].x, y[i]);
      }
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (valid[i]) amax = abs_max<VEC>(amax, y[i]);
    }
    const float scale = row_scale(block_reduce<true>(amax, smem[1]));
    const float inv_scale = 1.f / scale;
    uint8_t* q = static_cast<uint8_t*>(p.q) + row * rp.D;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (valid[i]) store_fp8<VEC>(q + (threadIdx.x + i * blockDim.x) * VEC, y[i], inv_scale);
    }
    if (threadIdx.x == 0) p.x_scale[row] = scale;
  }
}

// y of vector j of a streamed row (rstd: the norm's, already reduced).
template <typename T, int VEC, int OP>
__device__ __forceinline__ void streamed_values(const RowOpParams& p, const RowPtrs<T>& r, int64_t j, float rstd,
                                                float (&y)[VEC]) {
  if constexpr (OP >= kNorm) {
    load_h<T, VEC, arity<OP>()>(r, j * VEC, y);
    modulate_row<T, VEC>(p, r, j * VEC, rstd, y);
  } else {
    plain_values<T, VEC, OP>(load_raw_keep<T, VEC>(r.x + j * VEC), y);
  }
}

// Rows too wide for registers: a block of kMaxThreads per row, re-reading the inputs for each pass.
template <typename T, int VEC, int OP>
__global__ void __launch_bounds__(kMaxThreads) fp8_rows_streamed(Fp8Params p, float inv_d) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    __shared__ float smem[2][kMaxThreads / 32];
    const RowOpParams& rp = p.rows;
    const int64_t row = blockIdx.x;
    const RowPtrs<T> r = row_ptrs<T>(rp, row);  // rp.out is null: q is addressed below
    const int64_t nvec = rp.D / VEC;
    float y[VEC];
    float rstd = 1.f;
    if constexpr (OP >= kNorm) {
      T* h_out = r.h_out;
      float sum_sq = 0.f;
      for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
        load_h<T, VEC, arity<OP>()>(r, j * VEC, y);
        if (h_out) store_vec<T, VEC>(h_out + j * VEC, y);
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum_sq = fmaf(y[k], y[k], sum_sq);
      }
      rstd = 1.f / sqrtf(fmaf(block_reduce<false>(sum_sq, smem[0]), inv_d, rp.eps));
    }
    float amax = 0.f;
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      streamed_values<T, VEC, OP>(rp, r, j, rstd, y);
      amax = abs_max<VEC>(amax, y);
    }
    const float scale = row_scale(block_reduce<true>(amax, smem[1]));
    const float inv_scale = 1.f / scale;
    uint8_t* q = static_cast<uint8_t*>(p.q) + row * rp.D;
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      streamed_values<T, VEC, OP>(rp, r, j, rstd, y);
      store_fp8<VEC>(q + j * VEC, y, inv_scale);
    }
    if (threadIdx.x == 0) p.x_scale[row] = scale;
  }
}

int threads_for(int64_t nvec, int vpt) {
  const int64_t per_row = (nvec + vpt - 1) / vpt;
  return static_cast<int>(per_row <= 32 ? 32 : (per_row + 31) / 32 * 32);
}

// Vectors a thread. One-input rows (the plain ops, the norm without a residual): 4, over as many threads as the row
// needs (H100, 2x8064x2048 bf16 norm 54.4 -> 48.3 us, 2x8064x4096 109.7 -> 83.6 us against the fewest within 256
// threads; docs/tuning.md#fp8-rows). Residual rows: the fewest of 2, 4, 8 that keep the row within 256 threads
// (92-96% of the copy peak). LTXBENCH_FP8_THREADS=t (32..512) puts every row under the second rule with t threads.
// Residual rows hold two or three raw vectors per slot: at most 4, which covers 16384-wide 16-bit rows. The scalar
// path (unaligned or odd widths) keeps 8 one-element slots a thread.
template <typename T, int VEC, int OP> cudaError_t launch_op(const Fp8Params& p, cudaStream_t stream) {
  static const int knob = tuning_knob("LTXBENCH_FP8_THREADS");
  const bool forced = knob >= 32 && knob <= kMaxThreads;
  const int target = forced ? knob : 256;
  const int64_t nvec = p.rows.D / VEC;
  const unsigned blocks = static_cast<unsigned>(p.rows.B * p.rows.S);
  const float inv_d = p.rows.D ? inverse_count(p.rows.D) : 0.f;
  constexpr int kMostVpt = VEC == 1 || arity<OP>() == 1 ? 8 : 4;
  int vpt = 0;
  if constexpr (VEC == 1) {
    vpt = 8;
  } else if (arity<OP>() == 1 && !forced) {
    vpt = threads_for(nvec, 4) <= kMaxThreads ? 4 : 8;
  } else {
    for (int v = 2; v <= kMostVpt && !vpt; v *= 2) vpt = threads_for(nvec, v) <= target ? v : 0;
    if (!vpt) vpt = kMostVpt;
  }
  const int threads = threads_for(nvec, vpt);
  if (threads > kMaxThreads) {
    fp8_rows_streamed<T, VEC, OP><<<blocks, kMaxThreads, 0, stream>>>(p, inv_d);
  } else if constexpr (VEC == 1) {
    fp8_rows_cached<T, 1, 8, OP><<<blocks, threads, 0, stream>>>(p, inv_d);
  } else if (vpt == 2) {
    fp8_rows_cached<T, VEC, 2, OP><<<blocks, threads, 0, stream>>>(p, inv_d);
  } else if (vpt == 4) {
    fp8_rows_cached<T, VEC, 4, OP><<<blocks, threads, 0, stream>>>(p, inv_d);
  } else if constexpr (kMostVpt == 8) {
    fp8_rows_cached<T, VEC, 8, OP><<<blocks, threads, 0, stream>>>(p, inv_d);
  }
  return cudaGetLastError();
}

template <typename T, int VEC> cudaError_t launch_vec(const Fp8Params& p, cudaStream_t stream) {
  switch (p.op) {
    case Fp8Op::Quantize: return launch_op<T, VEC, kQuantize>(p, stream);
    case Fp8Op::GeluTanh: return launch_op<T, VEC, kGelu>(p, stream);
    case Fp8Op::RmsNormModulate:
      if (!p.rows.scale.ptr || !p.rows.shift.ptr) return cudaErrorInvalidValue;
      if (!p.rows.a.ptr) return launch_op<T, VEC, kNorm>(p, stream);
      if (!p.rows.gate.ptr) return launch_op<T, VEC, kNorm + 1>(p, stream);
      return launch_op<T, VEC, kNorm + 2>(p, stream);
  }
  return cudaErrorInvalidValue;
}

// 16-byte input vectors where every row of every operand allows them (q's rows then start VEC-byte aligned).
template <typename T> cudaError_t launch_typed(const Fp8Params& p, cudaStream_t stream) {
  RowOpParams layout = p.rows;
  layout.out = p.q;
  return vectorizable<T>(layout) ? launch_vec<T, vec_width<T>()>(p, stream) : launch_vec<T, 1>(p, stream);
}

// Per-head pass 1: the amax of each (batch, head) over a chunk of tokens into amax (B, H), as float bits (the
// order of non-negative floats). Block (chunk, b); thread t holds column vectors t, t + blockDim.x, ... of every
// row of its chunk, four rows in flight; a block's heads meet in shared memory first.
template <typename T, int VEC>
__global__ void __launch_bounds__(256) head_amax_kernel(Fp8HeadsParams p, int64_t rows_per_chunk) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    extern __shared__ unsigned head_max[];
    for (int64_t h = threadIdx.x; h < p.H; h += blockDim.x) head_max[h] = 0u;
    __syncthreads();
    const int64_t b = blockIdx.y, nvec = p.H * p.hd / VEC;
    const int64_t s0 = blockIdx.x * rows_per_chunk, s1 = min(p.S, s0 + rows_per_chunk);
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float m = 0.f;
#pragma unroll 4
      for (int64_t s = s0; s < s1; ++s) {
        float y[VEC];
        load_vec<T, VEC>(static_cast<const T*>(p.x.ptr) + b * p.x.sb + s * p.x.ss + j * VEC, y);
        m = abs_max<VEC>(m, y);
      }
      atomicMax(&head_max[j * VEC / p.hd], __float_as_uint(m));
    }
    __syncthreads();
    for (int64_t h = threadIdx.x; h < p.H; h += blockDim.x) {
      if (head_max[h]) atomicMax(&p.amax[b * p.H + h], head_max[h]);
    }
  }
}

// Per-head pass 2, blocks as in pass 1: each head's scale once per block (shared memory), then every vector of the
// chunk times its head's scale, to e4m3. Chunk 0 writes the descales (1 for a head that is all zero or has no
// tokens).
template <typename T, int VEC>
__global__ void __launch_bounds__(256) quantize_heads_kernel(Fp8HeadsParams p, int64_t rows_per_chunk) {
  if constexpr (unsupported_here<T>()) {
    __trap();
  } else {
    extern __shared__ float head_scale[];
    // Blocks run in reverse order of pass 1's: the chunks pass 1 read last are still in L2 and are re-read first.
    const int64_t chunk = gridDim.x - 1 - blockIdx.x, b = gridDim.y - 1 - blockIdx.y;
    const int64_t D = p.H * p.hd, nvec = D / VEC;
    for (int64_t h = threadIdx.x; h < p.H; h += blockDim.x) {
      const float scale = fp8_pow2_scale(__uint_as_float(p.amax[b * p.H + h]));
      head_scale[h] = scale;
      if (chunk == 0) p.descale[b * p.H + h] = 1.f / scale;
    }
    __syncthreads();
    const int64_t s0 = chunk * rows_per_chunk, s1 = min(p.S, s0 + rows_per_chunk);
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      const float scale = head_scale[j * VEC / p.hd];
      const T* x = static_cast<const T*>(p.x.ptr) + b * p.x.sb + j * VEC;
      uint8_t* q = static_cast<uint8_t*>(p.q) + b * p.S * D + j * VEC;
#pragma unroll 4
      for (int64_t s = s0; s < s1; ++s) {
        float y[VEC];
        load_vec<T, VEC>(x + s * p.x.ss, y);
        store_fp8<VEC>(q + s * D, y, scale);
      }
    }
  }
}

// Both passes over (chunk, b) blocks: about 8 blocks of 256 threads per SM of an H100 over the batch, enough loads
// in flight to stream x at full speed; one block per batch element without tokens (pass 2 still writes descales).
template <typename T, int VEC> cudaError_t launch_heads_with(const Fp8HeadsParams& p, cudaStream_t stream) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(p.S, (1024 + p.B - 1) / p.B));
  const int64_t rows_per_chunk = std::max<int64_t>(1, (p.S + chunks - 1) / chunks);
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, (p.S + rows_per_chunk - 1) / rows_per_chunk)),
                  static_cast<unsigned>(p.B));
  if (p.S > 0 && p.hd > 0) {
    head_amax_kernel<T, VEC><<<grid, 256, p.H * sizeof(unsigned), stream>>>(p, rows_per_chunk);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  quantize_heads_kernel<T, VEC><<<grid, 256, p.H * sizeof(float), stream>>>(p, rows_per_chunk);
  return cudaGetLastError();
}

template <typename T> cudaError_t launch_heads(const Fp8HeadsParams& p, cudaStream_t stream) {
  constexpr int V = vec_width<T>();
  const bool vec = p.hd % V == 0 && p.x.sb % V == 0 && p.x.ss % V == 0 &&
                   reinterpret_cast<uintptr_t>(p.x.ptr) % 16 == 0 && reinterpret_cast<uintptr_t>(p.q) % 16 == 0;
  return vec ? launch_heads_with<T, V>(p, stream) : launch_heads_with<T, 1>(p, stream);
}

}  // namespace

cudaError_t launch_fp8_heads(const Fp8HeadsParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.B * p.H == 0) return cudaSuccess;
  const cudaError_t err = cudaMemsetAsync(p.amax, 0, p.B * p.H * sizeof(unsigned), stream);
  if (err != cudaSuccess) return err;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_heads<decltype(tag)>(p, stream); });
}

cudaError_t launch_fp8_rows(const Fp8Params& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.rows.B * p.rows.S == 0) return cudaSuccess;
  if (p.rows.D == 0) {  // no values: every row gets the all-zero row's scale, whatever the op
    Fp8Params empty = p;
    empty.op = Fp8Op::Quantize;
    return dispatch_dtype(dtype, [&](auto tag) { return launch_vec<decltype(tag), 1>(empty, stream); });
  }
  return dispatch_dtype(dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
