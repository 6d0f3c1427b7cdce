// The analytic GPU-time model and the host dispatch table. The constants are in
// blink/roofline.h, each with the reason for its value.
#include "blink/roofline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace blink {
namespace {

bool tensor_core(MathMode m) {
  return m == MathMode::kTf32 || m == MathMode::kBf16Tc || m == MathMode::kFp16Tc ||
         m == MathMode::kFp8Tc;
}

double ceil_div(double a, double b) { return std::ceil(a / b); }

// How a GEMM / convolution runs: its compute time and the CTAs it launches. The output tiles
// run in waves of sm_count * CTAs-per-SM, each tile taking 2 * tile_m * tile_n * K FLOPs at its
// SM's share of (peak * efficiency). A last, partial wave costs a whole wave (tail effect);
// partial tiles cost whole tiles. Grids smaller than the GPU are split along K.
struct GemmPlan {
  double compute_s = 0.0;
  double ctas = 0.0;
};

GemmPlan gemm_plan(const UnitFeatures& f, const GpuSpec& g) {
  bool tc = tensor_core(f.math_mode);
  double peak = peak_flops_for(f.math_mode, f.dtype, g);
  double eff = f.kind == UnitKind::kConv ? kConvEfficiency
               : tc                      ? kTensorCoreGemmEfficiency
                                         : kSimtGemmEfficiency;
  if (f.kind == UnitKind::kConv && tc &&
      (static_cast<double>(f.n) < kMinTensorCoreChannels ||
       static_cast<double>(f.k) < kMinTensorCoreChannels)) {
    tc = false;  // depthwise / narrow groups: CUDA-core kernels at FP32 rate
    peak = g.peak_fp32;
    eff = kSimtGemmEfficiency;
  }
  const double m = std::max<int64_t>(f.m, 1), n = std::max<int64_t>(f.n, 1);
  const double batch = std::max<int64_t>(f.batch, 1);
  double k = std::max<int64_t>(f.k, 1);
  const double tm = 128.0, tn = tc ? 128.0 : 64.0;  // as features.cpp's tiling
  const double slots = static_cast<double>(g.sm_count) * (tc ? 1.0 : 2.0);
  double tiles = ceil_div(m, tm) * ceil_div(n, tn) * batch;
  if (tiles < slots && k >= 2.0 * kSplitKMinK) {
    const double split =
        std::max(1.0, std::min(std::floor(slots / tiles), std::floor(k / kSplitKMinK)));
    tiles *= split;
    k = std::ceil(k / split);
  }
  const double waves = ceil_div(tiles, slots);
  eff *= k / (k + kGemmKHalf);
  const double tile_s = 2.0 * tm * tn * k / (peak * eff / slots);
  // FLOPs beyond one pass (convolution_backward computing two gradients) scale the time.
  const double one_pass = 2.0 * static_cast<double>(f.m) * static_cast<double>(f.n) *
                          static_cast<double>(f.k) * batch;
  const double passes = one_pass > 0 ? std::max(1.0, std::round(f.flops / one_pass)) : 1.0;
  return GemmPlan{passes * waves * tile_s, tiles};
}

// Fused attention: tiles (query blocks forward, key blocks backward) in waves of one CTA per
// SM; a causal mask skips the blocks above the diagonal.
double attention_compute_s(const UnitFeatures& f, const GpuSpec& g) {
  const double peak = peak_flops_for(f.math_mode, f.dtype, g);
  const double eff = f.backward ? kAttentionBwdEfficiency : kAttentionFwdEfficiency;
  double work = f.flops;
  if (f.causal && f.m == f.n && f.m > 0) {
    const double blocks = ceil_div(static_cast<double>(f.m), kAttentionBlock);
    work *= (blocks + 1.0) / (2.0 * blocks);
  }
  const double slots = static_cast<double>(g.sm_count) * static_cast<double>(f.blocks_per_sm);
  const double tiles = std::max<double>(1.0, static_cast<double>(f.tiles));
  const double waves = ceil_div(tiles, slots);
  return waves * (work / tiles) / (peak * eff / slots);
}

}  // namespace

double analytic_time_s(const UnitFeatures& f, const GpuSpec& g) {
  if (f.kernels <= 0) return 0.0;
  if (f.kind == UnitKind::kRnn) return rnn_time_s(f, g);  // a sequence of dependent kernels
  if (g.sm_count <= 0 || !(g.mem_bw > 0) || !(g.peak_fp32 > 0)) {
    throw Error("GpuSpec '" + g.name + "': sm_count, mem_bw and peak_fp32 must be positive");
  }
  const double floor_s = kLaunchFloorS * static_cast<double>(f.kernels);

  double compute_s = 0.0;
  double ctas = static_cast<double>(f.tiles);
  const bool gemm_like = f.kind == UnitKind::kGemm || f.kind == UnitKind::kConv;
  if (gemm_like && f.m > 0 && f.n > 0) {
    const GemmPlan plan = gemm_plan(f, g);
    compute_s = f.flops > 0 ? plan.compute_s : 0.0;
    ctas = plan.ctas;  // split-K CTAs also pull bandwidth
  } else if (f.flops > 0) {
    if (f.kind == UnitKind::kAttention) {
      compute_s = attention_compute_s(f, g);
    } else {
      compute_s = f.flops / (peak_flops_for(f.math_mode, f.dtype, g) * kSimtElementwiseEfficiency);
    }
  }

  double memory_s = 0.0;
  const double bytes = f.bytes_read + f.bytes_written;
  if (bytes > 0) {
    double bw = g.mem_bw * kDramEfficiency;
    if (ctas > 0) {
      const double sms = std::min<double>(g.sm_count, ctas);
      bw *= std::min(1.0, sms / (kBwSaturatingSmFraction * g.sm_count));
    }
    memory_s = kDramLatencyS + bytes / bw;
  }
  return std::max(floor_s, std::max(compute_s, memory_s));
}

namespace {

// Eager host cost per op (seconds), on a ~3 GHz server core, called from Python. Ops not here
// cost kHostDefaultS. Composites are the whole call, their children included.
const std::unordered_map<std::string, double>& host_table() {
  static const std::unordered_map<std::string, double> table = {
      // No kernel: dispatcher + a new TensorImpl, no launch.
      {"aten::view", 1.5e-6}, {"aten::_unsafe_view", 1.5e-6}, {"aten::as_strided", 1.5e-6},
      {"aten::transpose", 1.5e-6}, {"aten::t", 1.5e-6}, {"aten::permute", 1.5e-6},
      {"aten::expand", 1.5e-6}, {"aten::slice", 1.5e-6}, {"aten::select", 1.5e-6},
      {"aten::unsqueeze", 1.5e-6}, {"aten::squeeze", 1.5e-6}, {"aten::detach", 1.5e-6},
      {"aten::alias", 1.5e-6}, {"aten::split", 2.5e-6}, {"aten::split_with_sizes", 2.5e-6},
      {"aten::chunk", 2.5e-6}, {"aten::unbind", 2.5e-6},
      // Allocation only: a caching-allocator hit.
      {"aten::empty", 2.0e-6}, {"aten::empty_strided", 2.0e-6}, {"aten::empty_like", 2.0e-6},
      // cuBLAS(Lt): handle + workspace lookup, heuristic cache hit, launch.
      {"aten::mm", 7.0e-6}, {"aten::addmm", 7.0e-6}, {"aten::bmm", 7.0e-6},
      {"aten::baddbmm", 7.0e-6}, {"aten::_addmm_activation", 7.0e-6}, {"aten::mv", 6.0e-6},
      {"aten::addmv", 6.0e-6}, {"aten::dot", 6.0e-6},
      {"aten::_scaled_mm", 10.0e-6},  // scale checks + cuBLASLt FP8 descriptor setup
      // cuDNN: execution-plan cache lookup keyed on a large parameter struct, descriptors.
      {"aten::convolution", 15.0e-6}, {"aten::_convolution", 14.0e-6},
      {"aten::cudnn_convolution", 12.0e-6}, {"aten::cudnn_convolution_transpose", 12.0e-6},
      {"aten::convolution_backward", 25.0e-6},  // a plan lookup and launch per gradient
      // Fused attention: parameter checks, flash / cutlass params, launch.
      {"aten::_scaled_dot_product_flash_attention", 15.0e-6},
      {"aten::_scaled_dot_product_efficient_attention", 15.0e-6},
      {"aten::_scaled_dot_product_cudnn_attention", 18.0e-6},  // cuDNN graph cache lookup
      {"aten::_scaled_dot_product_flash_attention_backward", 20.0e-6},
      {"aten::_scaled_dot_product_efficient_attention_backward", 20.0e-6},
      {"aten::_scaled_dot_product_cudnn_attention_backward", 22.0e-6},
      // Normalisation: a few launches and parameter packing.
      {"aten::native_layer_norm", 8.0e-6}, {"aten::native_layer_norm_backward", 10.0e-6},
      {"aten::_fused_rms_norm", 8.0e-6}, {"aten::_fused_rms_norm_backward", 10.0e-6},
      {"aten::native_batch_norm", 10.0e-6}, {"aten::cudnn_batch_norm", 12.0e-6},
      {"aten::native_batch_norm_backward", 12.0e-6}, {"aten::cudnn_batch_norm_backward", 14.0e-6},
      {"aten::native_group_norm", 10.0e-6}, {"aten::native_group_norm_backward", 12.0e-6},
      // Reductions: ReduceConfig setup is heavier than an element-wise TensorIterator.
      {"aten::sum", 6.0e-6}, {"aten::mean", 6.0e-6}, {"aten::amax", 6.0e-6},
      {"aten::var", 7.0e-6}, {"aten::var_mean", 7.0e-6}, {"aten::linalg_vector_norm", 7.0e-6},
      // Embedding backward: sort + segment kernels, temporary allocations.
      {"aten::embedding", 7.0e-6}, {"aten::embedding_dense_backward", 15.0e-6},
      // Multi-tensor ops: list parsing, grouping tensors by device and dtype, fast-path checks.
      {"aten::_foreach_add_", 10.0e-6}, {"aten::_foreach_mul_", 10.0e-6},
      {"aten::_foreach_addcmul_", 12.0e-6}, {"aten::_foreach_addcdiv_", 12.0e-6},
      {"aten::_foreach_lerp_", 12.0e-6}, {"aten::_foreach_sqrt", 10.0e-6},
      {"aten::_foreach_div_", 10.0e-6}, {"aten::_foreach_norm", 12.0e-6},
      {"aten::_fused_adamw_", 20.0e-6}, {"aten::_fused_adam_", 20.0e-6},
      {"aten::_fused_sgd_", 15.0e-6},
      {"aten::_local_scalar_dense", 10.0e-6},  // .item(): D2H copy (the sync wait is not here)
      // Composites called from Python: the whole call, ops beneath included.
      {"aten::linear", 12.0e-6},                      // F.linear -> addmm (+ t view)
      {"aten::matmul", 12.0e-6},                      // shape logic -> mm / bmm (+ views)
      {"aten::scaled_dot_product_attention", 25.0e-6},  // backend selection + fused op
      {"aten::conv2d", 20.0e-6}, {"aten::conv1d", 20.0e-6}, {"aten::conv3d", 20.0e-6},
      {"aten::layer_norm", 11.0e-6}, {"aten::group_norm", 13.0e-6},
      {"aten::batch_norm", 16.0e-6},
      {"aten::softmax", 6.0e-6}, {"aten::log_softmax", 6.0e-6},
      {"aten::cross_entropy_loss", 16.0e-6},          // log_softmax + nll_loss
      {"aten::dropout", 8.0e-6},
  };
  return table;
}

}  // namespace

double host_dispatch_time_s(const std::string& op_name) {
  const auto& table = host_table();
  auto it = table.find(op_name);
  if (it != table.end()) return it->second;
  // Overloads share their op's cost (aten::add.Tensor -> aten::add).
  const size_t ns = op_name.find("::");
  const size_t dot = op_name.find('.', ns == std::string::npos ? 0 : ns + 2);
  if (dot != std::string::npos) {
    it = table.find(op_name.substr(0, dot));
    if (it != table.end()) return it->second;
  }
  return kHostDefaultS;
}

}  // namespace blink
