// Launch parameters shared by bindings/*.cpp (which include torch) and the .cu files (which do not).
// Plain C++ and the CUDA runtime API only: keeps nvcc translation units free of torch headers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <cuda_runtime_api.h>

namespace ltxbench {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };
enum class NormKind : int { None = 0, RMS = 1, Layer = 2 };

// A (B, S, D) operand whose last dim is contiguous; sb/ss are element strides of B and S.
// Stride 0 broadcasts (e.g. a per-batch (B, 1, D) modulation tensor expanded over S).
struct Rows3 {
  const void* ptr = nullptr;
  int64_t sb = 0;
  int64_t ss = 0;
};

// One row-wise op covers the whole normalization family:
//   h   = x + a * gate        (a, gate optional; no gate means h = x + a)
//   n   = norm(h)             (RMS or no-affine LayerNorm in fp32; NormKind::None means n = h)
//   n   = n * weight          (optional; cast_before_weight rounds n to the input dtype first)
//   out = n * (1 + scale) + shift   (optional modulation)
// out is written contiguous (B, S, D); h_out (optional) receives h rounded to the input dtype.
struct RowOpParams {
  int64_t B = 0, S = 0, D = 0;
  Rows3 x, a, gate, scale, shift;
  const void* weight = nullptr;
  bool cast_before_weight = false;
  float weight_offset = 0.f;  // the weight read as offset + weight, in fp32 (Gemma's 1 + weight); rms_norm's only
  NormKind norm = NormKind::RMS;
  float eps = 1e-6f;
  void* out = nullptr;
  void* h_out = nullptr;
};

cudaError_t launch_row_op(const RowOpParams& p, DType dtype, cudaStream_t stream);

// The same layer_norm_modulate (norm == Layer: x, scale, shift) and gated_residual (norm == None: x, a, gate) over
// 16-bit rows with float32 scale, shift and gate (norm_f32_modulation.cu: Wan's modulation), rows up to
// kMaxF32ModulationRow values.
constexpr int64_t kMaxF32ModulationRow = 8192;
cudaError_t launch_row_op_f32_modulation(const RowOpParams& p, DType dtype, cudaStream_t stream);

constexpr int kMaxPackParts = 8;  // parts of a packed q/k/v output written through pointers of their own

// LTX-Video's 3-D RoPE over the whole inner dim D (interleaved pairs 2i, 2i+1), for q and k together.
// The angles come either from precomputed fp32 cos/sin (B|1, S, D) or, computed in-kernel, from the
// fractional grid (B|1, S, 3) and the base frequencies freqs[D / 6]: channel c >= pad = D % 6 has
// angle freqs[f] * (2 * grid[axis] - 1) with (c - pad) / 2 = 3 f + axis; channels below pad pass through.
// With `norm`, q and k are first RMS-normalized over D with weights wq, wk (LTX's norm_q / norm_k).
struct Rope3dParams {
  int64_t B = 0, S = 0, D = 0;
  Rows3 q, k;
  Rows3 cos, sin;   // fp32, or null when the angles come from grid + freqs
  int64_t table_period = 0;  // the tables' width P: D (a column per channel) or a divisor, repeated (Wan: per head)
  Rows3 grid;       // fp32 (.., 3) with unit stride along the 3 coordinates
  const float* freqs = nullptr;
  int pad = 0;
  bool norm = false;
  const void* wq = nullptr;
  const void* wk = nullptr;
  float eps = 1e-5f;
  void* q_out = nullptr;  // contiguous (B, S, D)
  void* k_out = nullptr;
  // Packed instead (with norm only): q, k and v as (parts, B, S, 3, chunk), D = parts * chunk, written to `packed`
  // in place of q_out / k_out; v (B, S, D) is copied as it is. The layout of a Ulysses all-to-all's send buffer.
  // slots 2: k and v only, (1, B, S, 2, D) (chunk = D), and q to q_out: a ring attention's key/value all-gather.
  Rows3 v;
  void* packed = nullptr;
  int64_t chunk = 0;
  int slots = 3;
  // Or each part at a pointer of its own (part_out[0] set; `packed` = part_out[0]): part r's (B, S, slots, chunk)
  // block at part_out[r], which may be a peer GPU's memory (a Ulysses exchange written in place).
  void* part_out[kMaxPackParts] = {};
  // FP8 outputs instead (with norm only, not packed): q_out / k_out float8_e4m3fn, each head's values
  // times its scale. The launch first writes the scales from the norm weights (q's `heads`, then k's, into scale8)
  // and their reciprocals per (batch, head) into q_descale / k_descale (B, heads): RMSNorm bounds each normalized
  // value by sqrt(D) and the rotation keeps a pair's length, so |out| <= sqrt(D) · max |w| over the head.
  int64_t heads = 0;
  float* scale8 = nullptr;
  float* q_descale = nullptr;
  float* k_descale = nullptr;
};

cudaError_t launch_rope_3d(const Rope3dParams& p, DType dtype, cudaStream_t stream);

// 1-D RoPE of LLMs on q (B, Hq, S, hd) and k (B, Hk, S, hd) with any strides (last dim contiguous):
// angles from fp32 tables cos/sin (P, rot/2) gathered at positions (B|1, S) — or, with pos == nullptr, at row
// b * pos_sb + s * pos_ss (per-token tables: no position to wait for); the first `rot` channels
// rotate, the rest pass through. neox pairs (i, i + rot/2); interleaved pairs (2i, 2i + 1).
struct Rope1dParams {
  int64_t B = 0, S = 0, Hq = 0, Hk = 0, hd = 0, half = 0;  // half = rot / 2
  const void* q = nullptr;
  int64_t q_sb = 0, q_sh = 0, q_ss = 0;
  const void* k = nullptr;
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t table_stride = 0, table_rows = 0;
  const int64_t* pos = nullptr;
  int64_t pos_sb = 0, pos_ss = 0;
  bool interleaved = false;
  void* q_out = nullptr;  // dense (B, S, Hq, hd): token-major, as the q projection lays q out
  void* k_out = nullptr;  // dense (B, S, Hk, hd)
  // Written into a KV cache instead of k_out (rope_1d_cache, a static cache's layer): the rotated k and v (v's
  // strides v_s*, v's heads after k's in the work) at rows *cache_offset + s of k_cache / v_cache, dense
  // (B, Hk, cache_len, hd); a row past cache_len traps, as the cache's own index_copy_ asserts.
  const void* v = nullptr;
  int64_t v_sb = 0, v_sh = 0, v_ss = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* cache_offset = nullptr;
  int64_t cache_len = 0;
};

cudaError_t launch_rope_1d(const Rope1dParams& p, DType dtype, cudaStream_t stream);

// LTX-2's q/k RMSNorm over the whole inner dim D = H * 2 * half (weights wq, wk; fp32 statistics), then the split
// RoPE per head: x (B, S, D) seen as (B, S, H, 2 half), out[..., :half] = x1·cos − x2·sin and out[..., half:] =
// x2·cos + x1·sin, with fp32 tables cos/sin (B|1, H, S, half) at element strides t_sb, t_sh, t_ss (0 broadcasts;
// last dim contiguous; sin laid out as cos). k == null: q alone (the cross-attentions, one tensor per table).
struct RopeSplitParams {
  int64_t B = 0, S = 0, H = 0, half = 0;
  Rows3 q, k;
  const void* wq = nullptr;
  const void* wk = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t t_sb = 0, t_sh = 0, t_ss = 0;
  float eps = 1e-6f;
  void* q_out = nullptr;  // contiguous (B, S, D)
  void* k_out = nullptr;
  // Packed instead (q and k together only): q, k and v as (parts, B, S, 3, D / parts), part r holding heads
  // [r·H/parts, (r+1)·H/parts), written to `packed` in place of q_out / k_out; v (B, S, D) copied as it is.
  Rows3 v;
  void* packed = nullptr;
  int64_t parts = 0;
  void* part_out[kMaxPackParts] = {};  // as Rope3dParams'
  // FP8 instead (q and k together, unpacked): q_out / k_out e4m3, each of `groups` groups of heads times its scale
  // scale8[t · groups + g] (t: q 0, k 1), the power of two under 448 / (√D · max |w| over the group's channels),
  // written with its reciprocal, for every batch element, to q_descale / k_descale (B, groups) by a first kernel.
  int64_t groups = 0;
  float* scale8 = nullptr;
  float* q_descale = nullptr;
  float* k_descale = nullptr;
};

cudaError_t launch_rope_split(const RopeSplitParams& p, DType dtype, cudaStream_t stream);

// Gated activations over rows of width 2H → H: out = value * act(gate), gate = half `gate_half` (0|1).
// act: 0 = GELU exact (erf), 1 = GELU tanh, 2 = SiLU. With gated = false: out = act(x), width H.
struct ActParams {
  int64_t rows = 0, H = 0;
  const void* x = nullptr;
  int64_t row_stride = 0;
  bool gated = true;
  int gate_half = 1;
  int act = 1;
  void* out = nullptr;  // contiguous (rows, H)
};

cudaError_t launch_act(const ActParams& p, DType dtype, cudaStream_t stream);

// FP8 (e4m3) with one fp32 scale per row, written by the pass that produces the row's values y (fp32, never rounded
// to the input dtype): y = x (Quantize), gelu_tanh(x) (GeluTanh), or rms_norm(h) [* weight] * (1 + scale) + shift
// of h = x [+ a [* gate]] laid out as RowOpParams describes, h_out optional (RmsNormModulate; scale and shift
// required). x_scale[row] = max(max|y|, 1e-12) / 448; q = y / x_scale rounded to nearest even, saturated at ±448.
enum class Fp8Op : int { Quantize = 0, GeluTanh = 1, RmsNormModulate = 2 };

struct Fp8Params {
  Fp8Op op = Fp8Op::Quantize;
  RowOpParams rows;          // B, S, D, the inputs, eps and h_out (rows.out and rows.norm are not read)
  void* q = nullptr;         // contiguous (B * S, D) float8_e4m3fn
  float* x_scale = nullptr;  // (B * S,)
};

cudaError_t launch_fp8_rows(const Fp8Params& p, DType dtype, cudaStream_t stream);

// FP8 (e4m3) with one float32 scale per (batch, head), FlashAttention-3's FP8 input layout: x (B, S, H·hd) with any
// row strides (unit last stride) -> q contiguous (B, S, H·hd), descale (B, H). Each scale is the power of two that
// puts the head's amax in (224, 448] (fp8_pow2_scale), so q · descale is exact. amax: (B, H) scratch.
struct Fp8HeadsParams {
  int64_t B = 0, S = 0, H = 0, hd = 0;
  Rows3 x;
  void* q = nullptr;
  float* descale = nullptr;
  unsigned* amax = nullptr;
};

cudaError_t launch_fp8_heads(const Fp8HeadsParams& p, DType dtype, cudaStream_t stream);

// softmax(q k^T * scale + mask) v per (batch, head): q (B, S, H, hd), k and v (B, L, H, hd) with any strides
// (last dim contiguous), mask additive per key, broadcast over queries: (B|1, H|1, 1, L), fp32 or q's dtype,
// element strides mask_sb / mask_sh (0 to broadcast). out is dense (B, S, H, hd). The tensor-core path
// (xattn_uses_tensor_cores) moves q, k and v in 16-byte pieces (cp.async, int4): their strides must be multiples
// of 8 elements and their data 16-byte aligned; the caller copies inputs that are not.
struct XAttnParams {
  int64_t B = 0, S = 0, L = 0, H = 0, hd = 0;
  const void* q = nullptr;
  int64_t q_sb = 0, q_ss = 0, q_sh = 0;
  const void* k = nullptr;
  int64_t k_sb = 0, k_sl = 0, k_sh = 0;
  const void* v = nullptr;
  int64_t v_sb = 0, v_sl = 0, v_sh = 0;
  const void* mask = nullptr;
  bool mask_f32 = false;
  int64_t mask_sb = 0, mask_sh = 0;
  float scale = 1.f;
  void* out = nullptr;
};

bool xattn_uses_tensor_cores(int64_t hd, DType dtype, int compute_capability_major);
cudaError_t launch_cross_attention(const XAttnParams& p, DType dtype, int compute_capability_major,
                                   cudaStream_t stream);

// Decode attention (decode_attn.cu): q (B, H, G, hd) -- the G query heads of key/value head h -- over k, v (B, H, L,
// hd), any strides with the last one 1, a mask per key shared by heads and queries: (B|1, 1, 1, L) bool (true keeps
// the key) or additive, fp32 or q's dtype, element strides mask_sb (0 to broadcast) and mask_sl. out dense
// (B, H, G, hd). vectorized: q, k and v data and strides aligned for the wide loads of their head rows.
enum class DecodeMask : int { Bool = 0, F32 = 1, SameAsQ = 2 };
struct DecodeAttnParams {
  int64_t B = 0, H = 0, G = 0, L = 0, hd = 0;
  const void* q = nullptr;
  int64_t q_sb = 0, q_sh = 0, q_sg = 0;
  const void* k = nullptr;
  int64_t k_sb = 0, k_sh = 0, k_sl = 0;
  const void* v = nullptr;
  int64_t v_sb = 0, v_sh = 0, v_sl = 0;
  const void* mask = nullptr;
  DecodeMask mask_kind = DecodeMask::Bool;
  int64_t mask_sb = 0, mask_sl = 0;
  float scale = 1.f;
  bool vectorized = false;
  void* out = nullptr;
};

// Elements of a head row per lane (1, 2, 4 or 8: hd <= 256), and the key splits for a problem (>= 1; the partial
// buffers hold B * H * G * splits rows of hd floats and two floats each when > 1).
int decode_attention_lane_elems(int64_t hd);
int64_t decode_attention_splits(int64_t B, int64_t H, int64_t G, int64_t L, int64_t hd);
cudaError_t launch_decode_attention(const DecodeAttnParams& p, DType dtype, int64_t splits, float* part_rows,
                                    float* part_stats, cudaStream_t stream);

// out (tokens, n) = act(x (tokens, k) @ w (n, k)^T + bias (n)) + residual (tokens, n) on cuBLASLt, row-major with
// leading dims ldx, ldw, ldout (elements; the residual's rows at ldout too), fp32 accumulation; bias and residual
// optional, the residual added to the fp32 accumulator (beta = 1) before the one rounding; act 0 = none, 1 = GELU
// tanh (needs bias and no residual: cuBLASLt would add the residual before the GELU). The algorithm per problem
// (shape, dtype, epilogue, residual or not, leading dims, alignment, device) is picked once and kept: with tuning on
// and the stream not capturing a graph, by timing cuBLASLt's heuristic candidates and the tile / cluster / option
// variants of its first choice on these very operands; otherwise the heuristic's first choice (what torch runs).
struct GemmParams {
  int64_t tokens = 0, n = 0, k = 0;
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t ldout = 0;
  const void* residual = nullptr;
  int act = 0;
  void* workspace = nullptr;  // kGemmWorkspaceBytes, from the caller's allocator
};

constexpr size_t kGemmWorkspaceBytes = size_t(4) << 20;

// linear over at most kGemvMaxRows rows of x (gemv.cu, a decode step's projections), on the GEMM's params without
// an activation: out = x @ wᵀ [+ bias] [+ residual read at out's pitch], fp32 sums rounded once; gemv_takes says
// whether the operands suit it (K and the row pitches whole 16-byte vectors, x and w 16-byte aligned).
constexpr int64_t kGemvMaxRows = 4;
bool gemv_takes(const GemmParams& p, int element_bytes);
cudaError_t launch_gemv(const GemmParams& p, DType dtype, cudaStream_t stream);

// 0 on success, else a cublasStatus_t / cudaError_t code; gemm_error_string says which.
int launch_gemm(const GemmParams& p, DType dtype, int device, cudaStream_t stream);
const char* gemm_error_string(int code);
bool gemm_set_tuning(bool enabled);  // returns the previous setting; on by default
// One line per problem seen in this process: its shape, the heuristic's and the chosen algorithm's times.
std::vector<std::string> gemm_table();
// The searched choices for `device` as text records, and records loaded back (returns how many were kept).
std::vector<std::string> gemm_export(int device);
int gemm_import(int device, const std::vector<std::string>& records);

}  // namespace ltxbench
