// The neox RoPE rotation of one pair, with every rounding spelled out, for the kernels that must give the same bits
// (rope_1d.cu and the q/k/v GEMV's RoPE epilogue in gemv.cu). Written as `x0·c − x1·s` and `x1·c + x0·s`, nvcc is free
// to contract either product of each sum into the FMA, and chose differently in the two files (the GEMV fused x1·c,
// rope_1d x0·s): 1 ulp apart in fp32. The form below is the one rope_1d.cu compiled to before it was spelled out.
#pragma once

namespace ltxbench {

__device__ __forceinline__ void rotate_neox(float x0, float x1, float c, float s, float& y0, float& y1) {
  y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

}  // namespace ltxbench
