// The projections' GEMM on cuBLASLt (gemm.cpp, host code) and its process-wide algorithm choices.
#include "bindings/checks.h"
#include "common/tuning.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <string>
#include <vector>

namespace ltxbench {
namespace {

// LTXBENCH_GEMV=0 sends the few-row products to cuBLASLt too (A/B measurements).
bool gemv_enabled() {
  static const bool off = tuning_off("LTXBENCH_GEMV");
  return !off;
}

// out = act(x @ weight.T + bias) + residual on cuBLASLt with a measured algorithm choice (gemm.cpp). x (..., K) with
// any leading dims; weight (N, K); bias (N) and residual (..., N) optional; activation "none" or "gelu_tanh".
Tensor linear(const Tensor& x_in, const Tensor& weight_in, const std::optional<Tensor>& bias,
              const std::string& activation, const std::optional<Tensor>& residual_in) {
  NOTE_SOURCE_USED();
  const char* op = "linear";
  const DType dt = check_primary(x_in, op, "x");
  check_same(weight_in, x_in, op, "weight");
  TORCH_CHECK(activation == "none" || activation == "gelu_tanh", "ltxbench.linear: activation must be 'none' or "
              "'gelu_tanh', got '", activation, "'");
  TORCH_CHECK(x_in.dim() >= 1, "ltxbench.linear: x must have at least one dim (..., in_features)");
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.size(1) == x_in.size(-1), "ltxbench.linear: weight must be "
              "(out_features, in_features) = (N, ", num(x_in.size(-1)), "), got ", shape(weight_in.sizes()));
  const int64_t K = x_in.size(-1), N = weight_in.size(0);
  if (bias) {
    check_same(*bias, x_in, op, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "ltxbench.linear: bias must be (out_features,) = (",
                num(N), ",), got ", shape(bias->sizes()));
  }
  std::vector<int64_t> out_sizes(x_in.sizes().begin(), x_in.sizes().end());
  out_sizes.back() = N;
  const bool gelu = activation == "gelu_tanh";
  if (residual_in) {
    check_same(*residual_in, x_in, op, "residual");
    TORCH_CHECK(residual_in->sizes() == at::IntArrayRef(out_sizes), "ltxbench.linear: residual must have the "
                "output's shape ", shape(out_sizes), ", got ", shape(residual_in->sizes()));
    TORCH_CHECK(!gelu, "ltxbench.linear: residual takes activation 'none' (cuBLASLt would add it before the GELU)");
  }
  int64_t tokens = 1;
  for (int64_t i = 0; i + 1 < x_in.dim(); ++i) tokens *= x_in.size(i);
  if (x_in.numel() == 0 && K > 0) return at::empty(out_sizes, x_in.options());
  if (K == 0 || N == 0) {  // no products to sum: the bias (or zeros), through the activation, plus the residual
    Tensor out = bias ? bias->expand({tokens, N}).contiguous() : at::zeros({tokens, N}, x_in.options());
    if (gelu) out = at::gelu(out, "tanh");
    if (residual_in)
      out = out.to(at::kFloat).add(residual_in->reshape({tokens, N}).to(at::kFloat)).to(out.scalar_type());
    return out.view(out_sizes);
  }
  // cuBLASLt reads rows with unit stride along K at a uniform row pitch; anything else is copied here.
  auto rows = [K](const Tensor& t) {
    return t.stride(1) == 1 && t.stride(0) >= K ? t : t.contiguous();
  };
  const Tensor x = rows(x_in.reshape({-1, K}));
  const Tensor w = rows(weight_in);
  const Tensor b = bias ? bias->contiguous() : Tensor();
  // The residual is read through out's layout (rows of N at pitch N): any other layout is copied here.
  const Tensor residual = residual_in ? residual_in->reshape({tokens, N}).contiguous() : Tensor();
  Tensor out = at::empty({tokens, N}, x_in.options());
  GemmParams p;
  p.tokens = tokens, p.n = N, p.k = K;
  p.x = x.data_ptr(), p.ldx = x.stride(0);
  p.w = w.data_ptr(), p.ldw = w.stride(0);
  p.bias = bias ? b.data_ptr() : nullptr;
  p.out = out.data_ptr(), p.ldout = N;
  p.residual = residual_in ? residual.data_ptr() : nullptr;
  // A decode step's few rows. The row count is asked first so that larger products never enter gemv.cu: a result
  // names the kernel files it ran (common/source_use.h), and a prefill's need not depend on the GEMV's.
  if (!gelu && tokens <= kGemvMaxRows && gemv_enabled() && gemv_takes(p, static_cast<int>(x.element_size()))) {
    launch_checked(x, op, [&](cudaStream_t stream) { return launch_gemv(p, dt, stream); });
    return out.view(out_sizes);
  }
  // fp32: the GELU runs after the GEMM (torch's tanh GELU in place); cuBLASLt's epilogue GELU is within 16-bit
  // rounding but not within fp32's tolerance of the exact tanh form (GPU tests, H100).
  const bool epilogue_gelu = gelu && dt != DType::F32;
  p.act = epilogue_gelu ? 1 : 0;
  Tensor workspace = at::empty({static_cast<int64_t>(kGemmWorkspaceBytes)}, x_in.options().dtype(at::kByte));
  p.workspace = workspace.data_ptr();
  const c10::cuda::CUDAGuard guard(x.device());
  const int err = launch_gemm(p, dt, x.get_device(), c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == 0, "ltxbench.linear: cuBLASLt failed for x (", num(tokens), ", ", num(K), ") @ weight.T (",
              num(K), ", ", num(N), "): ", gemm_error_string(err));
  if (gelu && !epilogue_gelu) at::gelu_(out, "tanh");
  return out.view(out_sizes);
}

bool gemm_tuning(bool enabled) { NOTE_SOURCE_USED(); return gemm_set_tuning(enabled); }

std::vector<std::string> gemm_choices() { NOTE_SOURCE_USED(); return gemm_table(); }

std::vector<std::string> gemm_export_choices(int64_t device) { NOTE_SOURCE_USED(); return gemm_export(int(device)); }

int64_t gemm_import_choices(int64_t device, const std::vector<std::string>& records) {
  NOTE_SOURCE_USED();
  TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), "ltxbench.gemm_import: device must be a CUDA "
              "device index, got ", num(device));
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return gemm_import(int(device), records);
}

void register_linear(torch::Library& m) { m.impl("linear", &linear); }

}  // namespace
}  // namespace ltxbench

TORCH_LIBRARY_FRAGMENT(ltxbench, m) {
  m.set_python_module("ltxbench.ops.fakes");
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation='none', Tensor? residual=None) -> Tensor");
  // Process-wide settings of linear's algorithm choice: no tensors, so one kernel for every dispatch key.
  m.def("gemm_tuning(bool enabled) -> bool", &ltxbench::gemm_tuning);
  m.def("gemm_choices() -> str[]", &ltxbench::gemm_choices);
  m.def("gemm_export(int device) -> str[]", &ltxbench::gemm_export_choices);
  m.def("gemm_import(int device, str[] records) -> int", &ltxbench::gemm_import_choices);
}

TORCH_LIBRARY_IMPL(ltxbench, CUDA, m) { ltxbench::register_linear(m); }
TORCH_LIBRARY_IMPL(ltxbench, CPU, m) { ltxbench::register_linear(m); }
