// Convolution plans: which kernels a convolution unit runs on CUDA, as PyTorch dispatches it.
//
// aten/src/ATen/native/Convolution.cpp (_select_conv_backend) sends a CUDA convolution to
//  - ConvBackend::CudaDepthwise2d / CudaDepthwise3d (ATen's own direct kernels,
//    native/cuda/DepthwiseConv2d.cu, DepthwiseConv3d.cu) when it is depthwise
//    (groups == C_in, C_out a multiple of C_in, not transposed) and cuDNN's depthwise path is
//    not chosen (use_cudnn_depthwise: channels-last input, or fp16 / bf16 NCHW shapes passing
//    check_cudnn_depthwise_workload). cuDNN's depthwise kernels are direct kernels too, so both
//    are costed as direct depthwise here;
//  - cuDNN otherwise (Cudnn / CudnnTranspose), whose engines are implicit GEMM (on tensor cores
//    when the dtype and torch.backends.cudnn.allow_tf32 allow), Winograd for 3x3 stride-1
//    filters on CUDA-core math, and grouped kernels for 1 < groups < C_in.
// With torch.backends.cudnn.benchmark on, PyTorch times cuDNN's algorithms (cudnnFind*, or the
// v8 API's benchmarking of engine configs) and keeps the fastest: Blink keeps the fastest
// predicted one. Off (the default), it takes the first of cuDNN's heuristic ranking, which is
// conservative about Winograd's transform cost: Blink takes Winograd only where it is predicted
// kWinogradHeuristicMargin times faster than implicit GEMM.
//
// convolution_backward runs a grad_input (dgrad) and a grad_weight (wgrad) kernel, each its own
// implicit GEMM (dgrad: M = N*input spatial, N = C/g, K = K/g * filter; wgrad: M = K/g,
// N = C/g * filter, K = N*output spatial, usually split along K), planned separately here.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "blink/kernel_plan.h"

namespace blink {
namespace {

constexpr double kWinogradHeuristicMargin = 1.3;

bool tensor_core_mode(MathMode m) {
  return m == MathMode::kTf32 || m == MathMode::kBf16Tc || m == MathMode::kFp16Tc ||
         m == MathMode::kFp8Tc;
}

double round_up(double v, double a) { return std::ceil(v / a) * a; }

struct PassPlan {
  double main_s = 0.0;
  bool dram_bound = false;  // main_s is DRAM time (depthwise), not SM clocks
  double aux_bytes = 0.0;
  int64_t aux_kernels = 0;
  GemmPlan gemm;
  ConvAlgo algo = ConvAlgo::kNone;
  MathMode mode = MathMode::kFp32Simt;
};

struct Geometry {
  double n, c, k, g, filter, in_spatial, out_spatial, elem;
  double x_bytes() const { return n * c * in_spatial * elem; }
  double y_bytes() const { return n * k * out_spatial * elem; }
  double w_bytes() const { return k * (c / g) * filter * elem; }
};

enum Pass { kFwd = 0, kDgrad = 1, kWgrad = 2 };

// cuDNN's backward kernels against its forward ones (kConvWgradEfficiency,
// kConvStridedDgradEfficiency, kConvGroupedBackwardEfficiency): a weight gradient, a data
// gradient of a strided convolution (cudnnConvolutionBackwardData, which a transposed
// convolution's forward runs too), and either of a grouped convolution (`groups` > 1: the
// geometry's, not f.groups, so the dense alternative of a grouped unit keeps the dense rate).
double conv_pass_efficiency(Pass pass, const UnitFeatures& f, double groups) {
  double rate = 1.0;
  if (pass == kWgrad) {
    rate = kConvWgradEfficiency;
  } else if (((pass == kDgrad) != f.transposed) && f.stride_h * f.stride_w > 1) {
    rate = kConvStridedDgradEfficiency;  // a data gradient
  }
  return groups > 1.0 && pass != kFwd ? rate * kConvGroupedBackwardEfficiency : rate;
}

// The implicit GEMM of a pass (per group), channels padded for tensor cores.
GemmProblem implicit_gemm(const Geometry& s, Pass pass, MathMode mode, int dtype,
                          double flops_one, const UnitFeatures& f) {
  const double cg = std::max(1.0, s.c / s.g), kg = std::max(1.0, s.k / s.g);
  double align = 1.0;
  if (tensor_core_mode(mode)) {
    align = mode == MathMode::kTf32 ? static_cast<double>(kTcChannelAlignTf32)
                                    : static_cast<double>(kTcChannelAlign16);
  }
  // The forward pass of a stem of at most kTcFewChannels input channels (RGB: 3) runs cuDNN's
  // few-channel kernels (CUTLASS's kFixedChannels / kFewChannels fprop iterators: the filter
  // window is gathered as one K dimension of C x R x S), so C_in is padded to 4, not to the
  // MMA's 8; its weight gradient has no such kernel and keeps the padding. (Blink costs the
  // cuDNN 9 that torch 2.11+ ships: DeepBench's fp16 tensor-core rows with C_in = 1 or 3, timed
  // with cuDNN 7.6, ran ~3x slower than even the plan padded to 8: that cuDNN had no
  // few-channel kernels.)
  const bool fprop = pass == kFwd && !f.transposed;
  const double c_align = (fprop && align > 1.0 && cg <= static_cast<double>(kTcFewChannels))
                             ? static_cast<double>(kTcFewChannels)
                             : align;
  const double cp = round_up(cg, c_align), kp = round_up(kg, align);
  GemmProblem p;
  p.mode = mode;
  p.dtype = dtype;
  p.batch = s.g;
  // Dense forward passes only take the tensor-core relief of the implicit-GEMM loss
  // (kConvVsGemmEfficiency): grouped convolutions and the backward passes keep it whole.
  const bool relieved = fprop && s.g <= 1.0;
  p.efficiency_scale =
      conv_pass_efficiency(pass, f, s.g) * (relieved ? 1.0 : kConvVsGemmEfficiency);
  p.implicit_gemm_efficiency = relieved ? kConvVsGemmEfficiency : 1.0;
  p.gemv_max_dim = kConvGemvMaxDim;
  p.conv_fprop = fprop;
  // K of the GEMM from the pass's FLOPs (exact for a convolution; a transposed convolution
  // spreads its input over its output), then the padding of its channel factor.
  if (pass == kFwd && !f.transposed) {
    p.m = s.n * s.out_spatial;
    p.n = kp;
    p.k = flops_one / (2.0 * p.m * kg * s.g) * (cp / cg);
  } else if (pass == kDgrad || (pass == kFwd && f.transposed)) {
    // dgrad of a convolution (and the forward of a transposed one): output = the input grid.
    p.m = s.n * (f.transposed ? s.out_spatial : s.in_spatial);
    const double outc = f.transposed ? kg : cg;
    const double inc = f.transposed ? cg : kg;
    p.n = round_up(outc, align);
    p.k = flops_one / (2.0 * p.m * outc * s.g) * (round_up(inc, align) / inc);
  } else {
    p.m = kp;
    p.n = cp * s.filter;
    p.k = flops_one / (2.0 * kg * cg * s.filter * s.g);
    p.max_split = kWgradSplitMax;
  }
  p.k = std::max(1.0, p.k);
  return p;
}

PassPlan gemm_pass(const Geometry& s, Pass pass, MathMode mode, int dtype, double flops_one,
                   const UnitFeatures& f, const GpuSpec& g) {
  PassPlan out;
  out.mode = mode;
  out.algo = s.g > 1 ? ConvAlgo::kGroupedGemm : ConvAlgo::kImplicitGemm;
  out.gemm = plan_gemm(implicit_gemm(s, pass, mode, dtype, flops_one, f), g);
  out.main_s = out.gemm.compute_s;
  out.aux_bytes = out.gemm.aux_bytes;
  out.aux_kernels = out.gemm.aux_kernels;
  if (s.g > 1) {
    // A grouped convolution is never slower than the dense one of the same shape (cuDNN can
    // always run the dense algorithm on a block-diagonal filter): cap at its time.
    Geometry dense = s;
    dense.g = 1.0;
    const GemmPlan d = plan_gemm(implicit_gemm(dense, pass, mode, dtype, flops_one * s.g, f), g);
    if (d.compute_s < out.main_s) {
      out.main_s = d.compute_s;
      out.gemm = d;
      out.aux_bytes = d.aux_bytes;
      out.aux_kernels = d.aux_kernels;
    }
  }
  return out;
}

// Pass bytes of the direct depthwise kernels: what each kernel must read and write.
double depthwise_pass_bytes(const Geometry& s, Pass pass) {
  switch (pass) {
    case kFwd: return s.x_bytes() + s.w_bytes() + s.y_bytes();
    case kDgrad: return s.y_bytes() + s.w_bytes() + s.x_bytes();
    case kWgrad: default: return s.y_bytes() + s.x_bytes() + s.w_bytes();
  }
}

}  // namespace

const char* conv_algo_name(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::kImplicitGemm: return "implicit_gemm";
    case ConvAlgo::kWinograd: return "winograd";
    case ConvAlgo::kDepthwiseDirect: return "depthwise_direct";
    case ConvAlgo::kGroupedGemm: return "grouped_gemm";
    case ConvAlgo::kNone: default: return "none";
  }
}

double plan_conv(UnitFeatures& f, int passes, const GpuSpec& g, const FeatureOptions& opts) {
  if (f.conv_n <= 0 || f.conv_c <= 0 || f.conv_k <= 0 || f.groups <= 0) return 1.0;
  const UnitFeatures before = f;
  Geometry s{};
  s.n = static_cast<double>(f.conv_n);
  s.c = static_cast<double>(f.conv_c);
  s.k = static_cast<double>(f.conv_k);
  s.g = static_cast<double>(f.groups);
  s.filter = static_cast<double>(f.conv_t * f.conv_r * f.conv_s);
  s.in_spatial = static_cast<double>(f.conv_d * f.conv_h * f.conv_w);
  s.out_spatial = static_cast<double>(f.out_d * f.out_h * f.out_w);
  s.elem = static_cast<double>(dtype_itemsize(f.dtype));
  // One pass's FLOPs (features count one forward's worth per requested gradient).
  const int npass = (passes & 1 ? 1 : 0) + (passes & 2 ? 1 : 0) + (passes & 4 ? 1 : 0);
  const double flops_one = npass > 0 ? f.flops / npass : f.flops;

  const bool depthwise = f.groups > 1 && f.groups == f.conv_c && f.conv_k % f.conv_c == 0 &&
                         !f.transposed;
  const bool three_by_three = f.conv_t == 1 && f.conv_r == 3 && f.conv_s == 3 && f.conv_d == 1 &&
                              f.stride_h == 1 && f.stride_w == 1 && f.dil_h == 1 &&
                              f.dil_w == 1 && f.groups == 1 && !f.transposed;
  MathMode mode = f.math_mode;
  // Narrow groups cannot fill an MMA: CUDA cores. (An ungrouped narrow stem, C_in = 3, is
  // padded instead, to kTcFewChannels: implicit_gemm above.)
  if (tensor_core_mode(mode) && f.groups > 1 &&
      (s.c / s.g < kMinTensorCoreChannels || s.k / s.g < kMinTensorCoreChannels)) {
    mode = MathMode::kFp32Simt;
  }
  if (mode == MathMode::kOther) mode = MathMode::kFp32Simt;  // FP64: scaled below
  double min_flop_factor = 1.0;
  double main_s = 0.0, dram_bound_s = 0.0, aux_bytes = 0.0, worst = -1.0;
  int64_t aux_kernels = 0;
  ConvAlgo algo = ConvAlgo::kNone;
  MathMode used = mode;
  GemmPlan shape;  // the costliest pass's launch shape, which the unit reports
  const double bw = g.mem_bw * g.dram_efficiency;
  for (int p = kFwd; p <= kWgrad; ++p) {
    if (!(passes & (1 << p))) continue;
    const Pass pass = static_cast<Pass>(p);
    PassPlan plan;
    if (depthwise) {
      plan.algo = ConvAlgo::kDepthwiseDirect;
      plan.mode = MathMode::kFp32Simt;  // accscalar_t math on CUDA cores, any input dtype
      const double compute = flops_one / (g.peak_fp32 * kDepthwiseComputeEfficiency);
      const double memory = depthwise_pass_bytes(s, pass) / (bw * kDepthwiseBandwidthFraction);
      plan.main_s = std::max(compute, memory);
      plan.dram_bound = memory >= compute;
      // One thread per output (dgrad: per input) element in 256-thread CTAs; wgrad one CTA per
      // (channel, filter tap) reducing over the batch and the output grid.
      const double threads = pass == kWgrad ? s.k * s.filter * 256.0
                                            : s.n * (pass == kFwd ? s.k * s.out_spatial
                                                                  : s.c * s.in_spatial);
      plan.gemm.ctas = static_cast<int64_t>(std::ceil(threads / 256.0));
      plan.gemm.ctas_per_sm = 4;
      plan.gemm.waves = static_cast<int64_t>(
          std::ceil(static_cast<double>(plan.gemm.ctas) / (g.sm_count * 4.0)));
    } else {
      plan = gemm_pass(s, pass, mode, f.dtype, flops_one, f, g);
      if (three_by_three && !tensor_core_mode(mode)) {
        min_flop_factor = 4.0;  // F(4x4, 3x3): the lower bound allows the fewest multiplies
        {
          GemmProblem wp = implicit_gemm(s, pass, mode, f.dtype, flops_one / kWinogradFlopReduction,
                                         f);
          const GemmPlan wg = plan_gemm(wp, g);
          // Transformed input and output tiles written and read back by the transform kernels.
          const double wbytes = 2.0 * kWinogradTransformFactor *
                                (pass == kWgrad ? s.x_bytes() + s.y_bytes()
                                                : s.x_bytes() + s.y_bytes());
          const double wtime = wg.compute_s + wbytes / bw;
          const double margin = opts.cudnn_benchmark ? 1.0 : kWinogradHeuristicMargin;
          if (wtime * margin < plan.main_s + plan.aux_bytes / bw) {
            plan.algo = ConvAlgo::kWinograd;
            plan.gemm = wg;
            plan.main_s = wg.compute_s;
            plan.aux_bytes = wbytes + wg.aux_bytes;
            plan.aux_kernels = 2 + wg.aux_kernels;
          }
        }
      }
      const bool half_tc = mode == MathMode::kFp16Tc || mode == MathMode::kBf16Tc;
      if ((half_tc || (mode == MathMode::kTf32 && pass != kWgrad)) && !f.channels_last) {
        // Half-precision tensor-core kernels read NHWC: an NCHW activation and the KCRS filter
        // are transposed first (cudnn nchwToNhwcKernel, read + write each); the kernel's
        // epilogue stores the result straight into the NCHW output. Sanity check, not a fit:
        // timm's RTX 3090 AMP NCHW vs channels-last pairs (resnet50 1.14x, regnety_040 1.27x).
        // TF32 (cuDNN 8+): NVIDIA's NCHW TF32 forward and data-gradient kernels run behind its
        // NHWC ones (tensorflow PR 58054, NVIDIA: NHWC for TF32 inference "~20% perf
        // improvement in most cases" of convnets; "only for the fwd and bwd_data
        // convolutions", NHWC not faster for bwd_filter), the tensor-core overhead NVIDIA's
        // convolution performance guide puts on NCHW; costed as the same transposes, no
        // constant fitted. Until 2026-12-07 TF32 NCHW cost what NHWC did; NVIDIA's published
        // A100 TF32 rows are the check (benchmarks/models_published.py, README). A Conv1d has
        // no channels-last layout, so it always pays them, as in half precision.
        const double in_b = pass == kDgrad ? s.y_bytes() : (pass == kWgrad ? s.y_bytes() + s.x_bytes()
                                                                           : s.x_bytes());
        plan.aux_bytes += 2.0 * (in_b + s.w_bytes());
        plan.aux_kernels += pass == kWgrad ? 3 : 2;
      }
    }
    if (f.math_mode == MathMode::kOther && f.flops > 0) {
      plan.main_s *= g.peak_fp32 / std::max(1.0, peak_flops_for(MathMode::kOther, f.dtype, g));
    }
    main_s += plan.main_s;
    if (plan.dram_bound) dram_bound_s += plan.main_s;
    aux_bytes += plan.aux_bytes;
    aux_kernels += plan.aux_kernels;
    if (plan.main_s > worst) {
      worst = plan.main_s;
      algo = plan.algo;
      used = plan.mode;
      shape = plan.gemm;
    }
  }
  f.conv_algo = static_cast<int>(algo);
  if (f.math_mode != MathMode::kOther) f.math_mode = used;
  f.kernel_compute_s = main_s;
  f.kernel_dram_bound_s = dram_bound_s;
  f.aux_bytes += aux_bytes;
  f.kernels += aux_kernels;
  set_launch_shape(f, shape);
  if (f.groups > 1 && !depthwise) {
    // Never slower than the dense convolution of the same shape, whatever algorithm that one
    // gets (cuDNN can run a grouped convolution as the dense one on a block-diagonal filter).
    UnitFeatures dense = before;
    dense.groups = 1;
    dense.flops = before.flops * static_cast<double>(before.groups);
    plan_conv(dense, passes, g, opts);
    const double bw_aux = g.mem_bw * g.dram_efficiency;
    if (dense.kernel_compute_s + (dense.aux_bytes - before.aux_bytes) / bw_aux <
        f.kernel_compute_s + (f.aux_bytes - before.aux_bytes) / bw_aux) {
      // The dense plan, on this unit's own geometry and FLOPs.
      dense.groups = f.groups;
      dense.flops = f.flops;
      f = dense;
    }
  }
  return min_flop_factor;
}

}  // namespace blink
