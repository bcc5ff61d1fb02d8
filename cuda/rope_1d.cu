// The 1-D RoPE of LLMs: neox (i, i + rot/2) or interleaved (2i, 2i + 1) pairs within each head, angles from fp32
// tables gathered at positions. All rotation math in fp32.
#include "common/dtype.cuh"
#include "common/params.h"
#include "common/rope.cuh"
#include "common/rotate.cuh"
#include "common/source_use.h"
#include "common/tuning.h"

namespace ltxbench {
namespace {

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

// Heads of the work: q's, k's, and with a KV cache to write v's (copied, not rotated).
__host__ __device__ __forceinline__ int64_t rope1d_heads(const Rope1dParams& p) {
  return p.Hq + p.Hk + (p.v_cache != nullptr ? p.Hk : 0);
}

// One work item j (a neox pair of chunks, an interleaved chunk, or a pass-through chunk) of head h (q heads
// first, then k heads, then v heads where a KV cache is written) of token (b, s).
template <typename T, int VEC, bool INTERLEAVED, typename I>
__device__ __forceinline__ void rope1d_item(const Rope1dParams& p, I b, I s, I token, I h, I j) {
  const I Hq = static_cast<I>(p.Hq), Hk = static_cast<I>(p.Hk), hd = static_cast<I>(p.hd);
  const I half = static_cast<I>(p.half), rot = 2 * half;
  const I rot_items = rope1d_rot_items<VEC, INTERLEAVED, I>(p);
  const bool is_q = h < Hq, is_v = h >= Hq + Hk;
  if (!is_q) h -= is_v ? Hq + Hk : Hq;
  const T* x = is_q   ? static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + s * p.q_ss
               : is_v ? static_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh + s * p.v_ss
                      : static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh + s * p.k_ss;
  T* out;
  if (!is_q && p.k_cache != nullptr) {  // the cache's row for this token
    const int64_t row = *p.cache_offset + static_cast<int64_t>(s);
    if (row < 0 || row >= p.cache_len) __trap();
    out = static_cast<T*>(is_v ? p.v_cache : p.k_cache) + ((b * p.Hk + h) * p.cache_len + row) * p.hd;
  } else {
    const int64_t out_row = token * (is_q ? Hq : Hk) + h;  // < total: fits I
    out = static_cast<T*>(is_q ? p.q_out : p.k_out) + out_row * p.hd;
  }
  float y[VEC];
  if (is_v && j < rot_items) {  // v is copied as it is: the item's chunk (and its neox partner)
    const I col = j * VEC;
    load_vec_keep<T, VEC>(x + col, y);
    store_vec<T, VEC>(out + col, y);
    if constexpr (!INTERLEAVED) {
      load_vec_keep<T, VEC>(x + col + half, y);
      store_vec<T, VEC>(out + col + half, y);
    }
    return;
  }
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
      rotate_neox(x0, x1, c[e], sv[e], y[e], partner[e]);
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
    const I S = static_cast<I>(p.S), heads = static_cast<I>(rope1d_heads(p));
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

template <typename T, int VEC, bool INTERLEAVED> cudaError_t launch_1d_with(const Rope1dParams& p, cudaStream_t s) {
  const int64_t items = rope1d_items<VEC, INTERLEAVED, int64_t>(p);
  const int64_t total = p.B * rope1d_heads(p) * p.S * items;
  static const bool token_blocks_off = tuning_off("LTXBENCH_ROPE1D_TOKEN");
  if constexpr (!INTERLEAVED) {
    const int64_t heads = rope1d_heads(p);
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
                   p.k_sb % V == 0 && p.k_sh % V == 0 && p.k_ss % V == 0 && aligned16(p.v) && p.v_sb % V == 0 &&
                   p.v_sh % V == 0 && p.v_ss % V == 0 && aligned16(p.k_cache) && aligned16(p.v_cache);
  if (vec) return p.interleaved ? launch_1d_with<T, V, true>(p, stream) : launch_1d_with<T, V, false>(p, stream);
  return p.interleaved ? launch_1d_with<T, 2, true>(p, stream) : launch_1d_with<T, 1, false>(p, stream);
}

}  // namespace

cudaError_t launch_rope_1d(const Rope1dParams& p, DType dtype, cudaStream_t stream) {
  NOTE_SOURCE_USED();
  if (p.B * p.S == 0 || p.hd == 0 || p.Hq + p.Hk == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) { return launch_1d<decltype(tag)>(p, stream); });
}

}  // namespace ltxbench
