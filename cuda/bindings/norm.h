// The row-op pieces that the FP8 row ops (fp8.cpp) share with norm.cpp, which defines them.
#pragma once
#include <optional>

#include "bindings/checks.h"

namespace ltxbench {

// Shared by the modulated ops: x as (B, S, D) rows, scale/shift broadcast, a fresh contiguous output.
struct Modulated {
  RowOpParams p;
  Tensor x, scale, shift, out;
};

// float32_ok: scale and shift may be float32 over 16-bit x (Wan's modulation; the caller checks both are).
Modulated modulated(const Tensor& x_in, const Tensor& scale, const Tensor& shift, double eps, const char* op,
                    const char* x_name = "x", bool allocate_out = true, bool float32_ok = false);

// The residual branch a (same shape as h) and an optional (B|1, S|1, D) gate.
Tensor attach_branch(RowOpParams& p, const Tensor& h, const Tensor& a, const std::optional<Tensor>& gate,
                     const char* op, Tensor& gate_keep, bool float32_gate = false);

}  // namespace ltxbench
