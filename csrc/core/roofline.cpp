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

double ceil_div(double a, double b) { return std::ceil(a / b); }

// The fused attention kernel's plateau efficiency on `g` (sources in roofline.h).
double attention_efficiency(const UnitFeatures& f, const GpuSpec& g) {
  const int d = f.k <= 64 ? 0 : (f.k <= 128 ? 1 : 2);
  double flash = 0.0;  // FA2's on this architecture; 0: no public figure
  double cudnn = 0.0;
  if (g.cc_major == 8) {
    flash = f.backward ? kFlashAmpereBwd : kFlashAmpereFwd;
  } else if (g.cc_major == 9) {
    flash = f.backward ? kFlashHopperBwd[d] : kFlashHopperFwd[d];
    cudnn = f.backward ? kCudnnHopperBwd[d] : kCudnnHopperFwd[d];
  }
  const double gain = f.math_mode == MathMode::kTf32x3 ? kTf32x3EfficiencyGain : 1.0;
  double eff = f.backward ? kAttentionDefaultBwd : kAttentionDefaultFwd;
  if (flash > 0.0) {
    switch (f.attention_backend) {
      case AttentionBackend::kEfficient:
        eff = flash * (f.backward ? kEfficientVsFlashBwd : kEfficientVsFlashFwd);
        break;
      case AttentionBackend::kCudnn:
        eff = cudnn > 0.0 ? cudnn : flash;
        break;
      default:
        eff = flash;
    }
  }
  return std::min(eff * gain, kAttentionMaxEfficiency);
}

// Fused attention: tiles (query blocks forward, key blocks backward) in waves of one CTA per
// SM, each looping over the other sequence's blocks plus a fixed overhead; a causal mask skips
// the blocks above the diagonal (roofline.h).
double attention_compute_s(const UnitFeatures& f, const GpuSpec& g) {
  const double peak = peak_flops_for(f.math_mode, f.dtype, g);
  const double eff = attention_efficiency(f, g);
  const double loop = ceil_div(static_cast<double>(std::max<int64_t>(f.backward ? f.m : f.n, 1)),
                               kAttentionBlock);
  double work = f.flops *
                (loop + (f.backward ? kAttentionLoopOverheadBwd : kAttentionLoopOverheadFwd)) /
                loop;
  if (f.causal && f.m == f.n && f.m > 0) {
    const double blocks = ceil_div(static_cast<double>(f.m), kAttentionBlock);
    work *= (blocks + kCausalExtraBlocks) / (2.0 * blocks) / kCausalEfficiency;
  }
  const double slots = static_cast<double>(g.sm_count) * static_cast<double>(f.blocks_per_sm);
  const double tiles = std::max<double>(1.0, static_cast<double>(f.tiles));
  const double waves = ceil_div(tiles, slots);
  return sustained_time_s(waves * (work / tiles) / (peak * eff / slots), f.math_mode, g, f.kind);
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
  const double ctas = static_cast<double>(f.tiles);
  const bool gemm_like = f.kind == UnitKind::kGemm || f.kind == UnitKind::kConv;
  if (gemm_like && f.kernel_compute_s > 0) {
    // The planned cuBLAS / cuDNN kernels (kernel_plan.h), at boost clocks; a power-capped
    // board runs their SM-clock-bound part at its sustained clock (its DRAM-bound part keeps
    // the memory clock's pace).
    const double dram = std::clamp(f.kernel_dram_bound_s, 0.0, f.kernel_compute_s);
    compute_s = dram + sustained_time_s(f.kernel_compute_s - dram, f.math_mode, g, f.kind);
  } else if (f.flops > 0) {
    if (f.kind == UnitKind::kAttention) {
      compute_s = attention_compute_s(f, g);
    } else {
      compute_s = f.flops / (peak_flops_for(f.math_mode, f.dtype, g) * kSimtElementwiseEfficiency);
    }
  }

  double memory_s = 0.0;
  // Extra input passes stream the input again; inputs found in L2 cost a fraction of DRAM.
  const double bytes = std::max(0.0, f.bytes_read + f.bytes_written +
                                         (f.input_passes - 1.0) * std::max(0.0, f.bytes_read) -
                                         f.l2_hit_bytes * (1.0 - 1.0 / kL2VsDramBandwidth));
  double bw = g.mem_bw * g.dram_efficiency;
  if (f.permuted) bw /= kPermutedCopySlowdown;  // the gathering, non-vectorised kernel
  if (f.warp_softmax) bw /= kWarpSoftmaxSlowdown;  // scalar loads, a warp per row
  if (bytes > 0) {
    if (f.channel_cta_bw_share > 0) {
      bw *= f.channel_cta_bw_share;  // a CTA per channel (cuDNN's NCHW training batch norm)
    } else if (ctas > 0) {
      const double sms = std::min<double>(g.sm_count, ctas);
      bw *= std::min(1.0, sms / (kBwSaturatingSmFraction * g.sm_count));
    }
    memory_s = kDramLatencyS + bytes / bw;
  }
  // One CTA per row (layer norm): short rows leave the CTAs' lifetime, not DRAM, the bound.
  memory_s = std::max(memory_s, f.row_cta_bound_s);
  // Threads that each loop over the batch and channels (NCHW bilinear upsampling): few threads,
  // one memory round trip per iteration, so the loop's length, not DRAM bandwidth, is the bound.
  memory_s = std::max(memory_s, f.serial_loop_bound_s);
  // Helper kernels of the plan (layout transposes, split-K reduce, Winograd transforms, a
  // convolution's bias add) stream their bytes after the main kernel.
  const double stream_bw = g.mem_bw * g.dram_efficiency;
  double aux_s = f.aux_bytes > 0 ? kDramLatencyS + f.aux_bytes / stream_bw : 0.0;
  // Copies the op's host code makes of inputs not dense in its format (hidden_copy_bytes),
  // each a kernel that streams after its DRAM round trip.
  aux_s += static_cast<double>(f.hidden_copies) * kDramLatencyS +
           (f.hidden_copy_bytes + f.hidden_copy_permuted_bytes * kPermutedCopySlowdown) / stream_bw;
  return std::max(floor_s, std::max(compute_s, memory_s) + aux_s);
}

namespace {

// CUDA-side dispatch per op (seconds, ~3 GHz server core): from the dispatcher's entry to the
// op's return on CUDA tensors, without the caller's Python (measured or kHostPythonCallS).
// Rows are grouped by the PyTorch code path they stand for. Estimates from the known costs of
// the pieces: a cudaLaunchKernel ~2 us host-side, a CUDACachingAllocator hit ~0.3 us, a
// TensorImpl ~0.2 us, TensorIteratorBase::build ~1 us.
const std::unordered_map<std::string, double>& cuda_dispatch_table() {
  static const std::unordered_map<std::string, double> table = {
      // Views (at::native view / as_strided / alias_with_sizes_and_strides): a new TensorImpl
      // sharing the storage; no CUDA call.
      {"aten::view", 0.5e-6}, {"aten::_unsafe_view", 0.5e-6}, {"aten::as_strided", 0.5e-6},
      {"aten::transpose", 0.5e-6}, {"aten::t", 0.5e-6}, {"aten::permute", 0.5e-6},
      {"aten::expand", 0.5e-6}, {"aten::slice", 0.5e-6}, {"aten::select", 0.5e-6},
      {"aten::unsqueeze", 0.5e-6}, {"aten::squeeze", 0.5e-6}, {"aten::detach", 0.5e-6},
      {"aten::alias", 0.5e-6}, {"aten::reshape", 0.8e-6}, {"aten::flatten", 0.8e-6},
      {"aten::split", 1.5e-6}, {"aten::split_with_sizes", 1.5e-6}, {"aten::chunk", 1.5e-6},
      {"aten::unbind", 1.5e-6},  // one view per output
      // at::empty_cuda: a CUDACachingAllocator::malloc cache hit + TensorImpl.
      {"aten::empty", 1.0e-6}, {"aten::empty_strided", 1.0e-6}, {"aten::empty_like", 1.0e-6},
      // at::cuda::blas::gemm*: getCurrentCUDABlasHandle (handle pool, cublasSetStream,
      // workspace), cublasLt heuristic cache hit, launch.
      {"aten::mm", 5.0e-6}, {"aten::addmm", 5.0e-6}, {"aten::bmm", 5.0e-6},
      {"aten::baddbmm", 5.0e-6}, {"aten::_addmm_activation", 5.0e-6}, {"aten::mv", 4.5e-6},
      {"aten::addmv", 4.5e-6}, {"aten::dot", 4.5e-6},
      {"aten::_scaled_mm", 8.0e-6},  // scale checks + cuBLASLt FP8 descriptor setup
      // Convolution.cpp: _convolution's ConvParams checks and backend selection, then
      // cudnn_convolution: the cudnn_frontend execution-plan cache lookup (a hash over the
      // conv parameters), workspace from the caching allocator, cudnnBackendExecute.
      {"aten::convolution", 11.0e-6}, {"aten::_convolution", 10.5e-6},
      {"aten::cudnn_convolution", 8.5e-6}, {"aten::cudnn_convolution_transpose", 8.5e-6},
      {"aten::convolution_backward", 19.0e-6},  // a plan lookup and execute per gradient
      // transformers/cuda: sdp_utils checks, flash / cutlass parameter packing, launch.
      {"aten::_scaled_dot_product_flash_attention", 10.0e-6},
      {"aten::_scaled_dot_product_efficient_attention", 10.0e-6},
      {"aten::_scaled_dot_product_cudnn_attention", 13.0e-6},  // cuDNN graph cache lookup
      {"aten::_scaled_dot_product_flash_attention_backward", 14.0e-6},
      {"aten::_scaled_dot_product_efficient_attention_backward", 14.0e-6},
      {"aten::_scaled_dot_product_cudnn_attention_backward", 17.0e-6},
      // Normalisation kernels (layer_norm_kernel.cu, Normalization.cuh, cudnn/BatchNorm.cpp):
      // outputs + saved statistics allocated, one or two launches; cuDNN batch norm sets up
      // tensor descriptors.
      {"aten::native_layer_norm", 5.0e-6}, {"aten::native_layer_norm_backward", 7.0e-6},
      {"aten::_fused_rms_norm", 5.0e-6}, {"aten::_fused_rms_norm_backward", 7.0e-6},
      {"aten::native_batch_norm", 7.0e-6}, {"aten::cudnn_batch_norm", 9.0e-6},
      {"aten::_native_batch_norm_legit", 7.0e-6}, {"aten::_native_batch_norm_legit_no_training", 6.0e-6},
      {"aten::native_batch_norm_backward", 9.0e-6}, {"aten::cudnn_batch_norm_backward", 10.0e-6},
      {"aten::native_group_norm", 7.0e-6}, {"aten::native_group_norm_backward", 9.0e-6},
      // Reduce.cuh: ReduceConfig setup is heavier than an element-wise TensorIterator.
      {"aten::sum", 4.5e-6}, {"aten::mean", 4.5e-6}, {"aten::amax", 4.5e-6},
      {"aten::var", 5.0e-6}, {"aten::var_mean", 5.0e-6}, {"aten::linalg_vector_norm", 5.0e-6},
      // Embedding.cu: index_select forward; backward sorts indices and runs segment kernels
      // (several launches and temporaries).
      {"aten::embedding", 4.5e-6}, {"aten::embedding_dense_backward", 12.0e-6},
      // ForeachUtils / MultiTensorApply.cuh: list checks, grouping by device and dtype, one
      // launch per chunk of tensors.
      {"aten::_foreach_add_", 8.0e-6}, {"aten::_foreach_mul_", 8.0e-6},
      {"aten::_foreach_addcmul_", 9.0e-6}, {"aten::_foreach_addcdiv_", 9.0e-6},
      {"aten::_foreach_lerp_", 9.0e-6}, {"aten::_foreach_sqrt", 8.0e-6},
      {"aten::_foreach_div_", 8.0e-6}, {"aten::_foreach_norm", 10.0e-6},
      {"aten::_fused_adamw_", 15.0e-6}, {"aten::_fused_adam_", 15.0e-6},
      {"aten::_fused_sgd_", 12.0e-6},
      {"aten::_local_scalar_dense", 8.0e-6},  // .item(): D2H copy (the sync wait is not here)
      // Composites: the whole call, the ops beneath included.
      {"aten::linear", 6.0e-6},                        // t view + addmm
      {"aten::matmul", 6.5e-6},                        // shape logic -> mm / bmm (+ views)
      {"aten::scaled_dot_product_attention", 13.0e-6},  // backend selection + fused op
      {"aten::conv2d", 12.0e-6}, {"aten::conv1d", 12.0e-6}, {"aten::conv3d", 12.0e-6},
      {"aten::layer_norm", 6.0e-6}, {"aten::group_norm", 8.0e-6},
      {"aten::batch_norm", 10.0e-6},                   // _batch_norm_impl_index -> cudnn
      {"aten::softmax", 4.0e-6}, {"aten::log_softmax", 4.0e-6},
      {"aten::cross_entropy_loss", 10.0e-6},           // log_softmax + nll_loss
      {"aten::dropout", 5.0e-6},                       // native_dropout (philox seed offset)
  };
  return table;
}

}  // namespace

double cuda_dispatch_time_s(const std::string& op_name) {
  const auto& table = cuda_dispatch_table();
  auto it = table.find(op_name);
  if (it != table.end()) return it->second;
  // Overloads share their op's cost (aten::add.Tensor -> aten::add).
  const std::string base = op_base_name(op_name);
  if (base.size() != op_name.size()) {
    it = table.find(base);
    if (it != table.end()) return it->second;
  }
  return kCudaDispatchDefaultS;
}

double host_dispatch_time_s(const std::string& op_name) {
  return kHostPythonCallS + cuda_dispatch_time_s(op_name);
}

}  // namespace blink
