// Reductions over the `tpr` threads that share one row: a power of two up to 32, else a multiple of 32.
#pragma once

namespace ltxbench {

// A value made of N floats, shuffled float by float.
template <typename V> __device__ __forceinline__ V shfl_xor(const V& v, int offset) {
  static_assert(sizeof(V) % sizeof(float) == 0, "a reduction value is a bundle of floats");
  constexpr int kFloats = sizeof(V) / sizeof(float);
  V out;
  const float* in = reinterpret_cast<const float*>(&v);
  float* o = reinterpret_cast<float*>(&out);
#pragma unroll
  for (int k = 0; k < kFloats; ++k) o[k] = __shfl_xor_sync(0xffffffffu, in[k], offset);
  return out;
}

// Combines the values of a row's threads with combine(a, b) (one pair of barriers whatever the value). Rows
// handled by one block never share a warp unless tpr <= 32, where xor-shuffles with offsets < tpr stay inside
// the row's aligned lane group. smem must hold [rows_per_block][32] values when tpr > 32. Every thread of the
// row ends with the row's value.
template <typename V, typename Combine>
__device__ __forceinline__ V row_group_reduce(V v, int tpr, float* smem, Combine combine) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width >> 1; off > 0; off >>= 1) v = combine(v, shfl_xor(v, off));
  if (tpr <= 32) return v;
  V* slots = reinterpret_cast<V*>(smem) + (threadIdx.x / tpr) * 32;
  __syncthreads();  // slots may still be read from a previous reduction
  if ((threadIdx.x & 31) == 0) slots[(threadIdx.x % tpr) >> 5] = v;
  __syncthreads();
  V acc = slots[0];
  for (int w = 1; w < (tpr >> 5); ++w) acc = combine(acc, slots[w]);
  return acc;
}

template <int N> struct Floats {
  float v[N];
};

// Sums of N values at once. smem must hold [rows_per_block][32][N] floats when tpr > 32.
template <int N> __device__ __forceinline__ void row_group_sum(float (&v)[N], int tpr, float* smem) {
  Floats<N> f;
#pragma unroll
  for (int k = 0; k < N; ++k) f.v[k] = v[k];
  f = row_group_reduce(f, tpr, smem, [](const Floats<N>& a, const Floats<N>& b) {
    Floats<N> s;
#pragma unroll
    for (int k = 0; k < N; ++k) s.v[k] = a.v[k] + b.v[k];
    return s;
  });
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = f.v[k];
}

// Count, mean and sum of squared deviations of a set of values, merged pairwise (Chan et al.: exact in the
// counts, no E[x²] - E[x]² cancellation).
struct MeanM2 {
  float n = 0.f, mean = 0.f, m2 = 0.f;
};

// Equal counts (every thread of a full row, at every level of the shuffle tree) merge without a division and
// symmetrically, so both partners of a shuffle get the same bits. Otherwise the weight b.n / n by __fdividef
// (2 ulp; the counts are small exact integers): the IEEE division's longer dependent chain, ten times per row,
// cost the modulated LayerNorm 6% on the H200 (2x8064x2048, results/h200/tuning/lean-minb-*).
__device__ __forceinline__ MeanM2 merge(const MeanM2& a, const MeanM2& b) {
  const float n = a.n + b.n;
  const float delta = b.mean - a.mean;
  if (a.n == b.n) return MeanM2{n, 0.5f * (a.mean + b.mean), (a.m2 + b.m2) + delta * delta * (0.5f * a.n)};
  if (n == 0.f) return a;
  const float wb = __fdividef(b.n, n);
  return MeanM2{n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

// smem must hold [rows_per_block][32][3] floats when tpr > 32.
__device__ __forceinline__ MeanM2 row_group_mean_m2(MeanM2 v, int tpr, float* smem) {
  return row_group_reduce(v, tpr, smem, [](const MeanM2& a, const MeanM2& b) { return merge(a, b); });
}

}  // namespace ltxbench
