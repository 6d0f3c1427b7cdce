#pragma once
// Per-unit features of a cost unit (one traced ATen op that CUDA runs as one or a few kernels):
// FLOPs, compulsory DRAM bytes, GEMM / convolution / attention geometry, reduction sizes, dtype
// and math mode, and how the work tiles onto a target GPU. Torch-free: it reads the plain
// records of trace_types.h, so the cost models and tests can use it without PyTorch.
//
// Every op -> formula rule lives in one table in csrc/core/features.cpp (rule_table()).
// Conventions: FLOPs count 2 per multiply-accumulate (as blink/flops.py); bytes are compulsory
// traffic (each distinct input read once, each output written once; a broadcast input, i.e. a
// dimension with stride 0, is read once); times are seconds.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "blink/error.h"
#include "blink/trace_types.h"

namespace blink {

// One GPU of the hardware table (blink/data/gpus.json), filled from Python. Peaks are dense
// FLOP/s; 0 means the GPU has no such mode (the JSON's null).
struct GpuSpec {
  std::string name;
  int sm_count = 0;
  double clock_hz = 0.0;
  double mem_bw = 0.0;    // bytes/s
  double l2_bytes = 0.0;
  double peak_fp32 = 0.0; // CUDA-core FMA rate
  double peak_tf32 = 0.0; // tensor-core rates from here on
  double peak_bf16 = 0.0;
  double peak_fp16 = 0.0;
  double peak_fp8 = 0.0;
  int cc_major = 0;
  int cc_minor = 0;
  // Not in the list: FP64 vector rate, for double-precision work. 0 = unknown, in which
  // case 1/32 of peak_fp32 is assumed (a conservative consumer-GPU ratio).
  double peak_fp64 = 0.0;
  // Fraction of the datasheet peak a board holds under dense math (power-capped boards drop
  // below boost: blink/hardware.py's power rule, one value per GPU in the hardware table).
  // fp32: SIMT math (and FP64 / integer); tc: tensor-core math. 1 = holds boost.
  double sustained_fp32_ratio = 1.0;
  double sustained_tc_ratio = 1.0;
  // The highest clock the board runs at, as a fraction of its listed boost: 1 where the listed
  // boost is the maximum (data-centre parts), above 1 where it is a typical clock that GPU
  // Boost exceeds below the power cap (GeForce: blink/hardware.py TYPICAL_BOOST_HEADROOM).
  // The sustained ratios lie in (0, max_clock_ratio]; above 1 a kernel runs faster than boost.
  double max_clock_ratio = 1.0;
  // GPU Boost reacts to average board power, not instantly: an isolated burst of dense math
  // runs its first boost_window_s at boost before the clock falls to the sustained ratio.
  // 0 = steady state (a busy GPU in a training or inference loop): all of it at the ratio.
  double boost_window_s = 0.0;
  // Fraction of mem_bw a streaming kernel reaches (refresh, ECC, bus turnarounds take the rest):
  // blink/hardware.py's DRAM_EFFICIENCY rule, one value per GPU in the hardware table.
  double dram_efficiency = 0.90;
  // Share of peak_fp32 an SGEMM main loop keeps (1, or less on SMs whose FP32 lanes are half
  // shared with INT32, and on Hopper): blink/hardware.py's simt_gemm_rate_rule.
  double simt_gemm_rate = 1.0;
};

enum class UnitKind {
  kGemm,
  kConv,
  kAttention,
  kNorm,
  kSoftmax,
  kReduction,
  kElementwise,
  kEmbedding,
  kCopy,
  kOptimizer,
  kLoss,
  kOther,
  // Appended so the existing codes (a tree-model input) keep their values.
  kRnn,  // cuDNN RNN (_cudnn_rnn, _cudnn_rnn_backward): see rnn_time_s in roofline.h
};

// The fused attention kernels behind the SDPA ops: FlashAttention-2 (_flash_attention_*,
// transformers/cuda/flash_attn), the CUTLASS memory-efficient kernel (_efficient_attention_*,
// transformers/cuda/mem_eff_attention) and cuDNN's fused SDPA (_cudnn_attention_*).
enum class AttentionBackend { kNone, kFlash, kEfficient, kCudnn };

// How the unit's arithmetic runs: SIMT FP32 on CUDA cores, or a tensor-core mode.
// kTf32x3: FP32-accurate products from three TF32 tensor-core MMAs (CUTLASS
// OpMultiplyAddFastF32), what PyTorch's mem-efficient attention runs for FP32 on sm_80+;
// appended so the existing codes keep their values.
enum class MathMode { kFp32Simt, kTf32, kBf16Tc, kFp16Tc, kFp8Tc, kOther, kTf32x3 };

// The math settings that change kernel choice. Defaults are PyTorch's: matmul TF32 off
// (torch.backends.cuda.matmul.allow_tf32), cuDNN TF32 on (torch.backends.cudnn.allow_tf32).
struct FeatureOptions {
  bool allow_tf32_matmul = false;
  bool allow_tf32_cudnn = true;
  // torch.backends.cudnn.benchmark: cuDNN times its algorithms and keeps the fastest. Off
  // (PyTorch's default), cuDNN's heuristics rank them; Blink takes the fastest predicted
  // candidate either way (the heuristics aim for it) except where a rule says they differ.
  bool cudnn_benchmark = false;
  // torch built with CUDA >= 13 passes 32 KB kernel arguments, so one multi_tensor_apply launch
  // (_foreach_*, fused optimizers) takes up to 770 tensors / 2240 blocks instead of 110 / 320
  // (aten/src/ATen/native/cuda/MultiTensorApply.cuh). Blink targets the CUDA 13 wheels.
  bool large_kernel_args = true;
};

struct UnitFeatures {
  UnitKind kind = UnitKind::kOther;
  bool matched = false;   // false: no rule for the op, the generic fallback was used
  bool backward = false;  // a gradient op (its name says "backward")
  double flops = 0.0;
  double bytes_read = 0.0;
  double bytes_written = 0.0;
  double arithmetic_intensity = 0.0;  // flops / (bytes_read + bytes_written)
  int64_t kernels = 1;                // kernel launches of the CUDA implementation (0: none)

  // GEMM view. For kGemm the op's own M, N, K, batch. For kConv the implicit GEMM
  // (m = N*out_spatial, n = out channels per group, k = in channels per group * kernel volume,
  // batch = groups). For kAttention m = query length, n = key length, k = head dim,
  // batch = batch * query heads.
  int64_t m = 0, n = 0, k = 0, batch = 0;
  bool trans_a = false, trans_b = false;  // operand's last dim is not its contiguous one
  // addmm with a 1-D bias (nn.Linear) / _addmm_activation: ATen runs cublasLtMatmul with the
  // bias in the epilogue (gemm_and_bias, aten/src/ATen/native/cuda/Blas.cpp), not cublasSgemm;
  // its kernel list differs on Pascal (gemm_cost.cpp). Not a forest input.
  bool cublaslt_epilogue = false;
  // The op makes the CPU wait for the stream: it copies a value from the GPU before it can
  // launch its kernels (a boolean mask's nonzero, features.cpp add_mask_nonzero; nonzero;
  // _grouped_mm's fallback loop) or copies host memory without non_blocking (f_copy).
  // Not a forest input.
  bool host_sync = false;

  // Convolution geometry (input N, C, [D,] H, W; K output channels; kernel [T,] R, S).
  // 1-D convs use h = 1, r = 1; depth fields are 1 except for 3-D convs.
  int64_t conv_n = 0, conv_c = 0, conv_h = 0, conv_w = 0, conv_k = 0, conv_r = 0, conv_s = 0;
  int64_t conv_d = 1, conv_t = 1, out_d = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t groups = 1, out_h = 0, out_w = 0;
  bool transposed = false;

  // Attention extras (with m, n, k, batch above).
  int64_t head_dim_v = 0;
  bool causal = false;
  // Which fused kernel runs it, from the aten op (the SDPA backend blink/sdpa.py chose for the
  // target GPU): its efficiency differs by architecture (attention_compute_s). Not a forest
  // input.
  AttentionBackend attention_backend = AttentionBackend::kNone;

  // kGemm: groups > 1 is a loop of `groups` separate GEMMs of (m, n, k), one launch each
  // (aten::_grouped_mm off sm_90 / sm_100 bf16: features.cpp f_grouped_mm).
  // kRnn (one cuDNN RNN call) reuses fields: m = mini-batch, n = gates * hidden (N of the
  // recurrent GEMM), k = its K (hidden, or proj size), batch = layers * directions, groups =
  // directions, outer = timesteps, inner = layer-0 input size, conv_c = hidden size, conv_r = 1
  // when the backward also computes the weight gradients.

  // Reductions, normalisations, softmax: `outer` independent rows of `inner` elements each.
  // Gathers / embedding: outer = indices, inner = elements per index. Losses: outer = targets,
  // inner = classes. _foreach_* / fused optimizers: outer = tensors in the list.
  int64_t outer = 0, inner = 0;

  int64_t numel = 0;  // elements of the largest output (summed over a tensor list)
  int dtype = -1;     // c10::ScalarType code of the unit's main operand
  MathMode math_mode = MathMode::kOther;

  // On the target GPU. tiles: CTAs the kernel launches (GEMM/conv: output tiles of
  // 128x128 on tensor cores, 128x64 on SIMT; attention: 128-row query blocks per batch*head;
  // others: see parallelism). waves = ceil(tiles / (sm_count * blocks_per_sm)).
  int64_t tiles = 0;
  int64_t blocks_per_sm = 1;
  int64_t waves = 0;
  double parallelism = 0.0;  // threads the launch offers
  // The kernel plan (csrc/core/gemm_cost.cpp, conv_cost.cpp): the GEMM tile and split-K
  // cuBLAS / cuDNN would pick, the convolution algorithm (blink::ConvAlgo code), and the
  // modelled main-kernel compute time of that plan (0: none planned). aux_bytes: DRAM traffic
  // of helper kernels beyond the compulsory bytes (layout transposes, split-K partial sums,
  // Winograd transforms), paid after the main kernel.
  int64_t tile_m = 0, tile_n = 0, split_k = 1;
  int conv_algo = 0;
  bool channels_last = false;  // the main input is channels-last (NHWC) in memory
  double kernel_compute_s = 0.0;
  // The part of kernel_compute_s that DRAM bandwidth bounds (a memory-bound direct depthwise
  // pass): the memory clock sets it, so a power-capped board's lower SM clock does not stretch
  // it (analytic_time_s). Not a forest input.
  double kernel_dram_bound_s = 0.0;
  double aux_bytes = 0.0;
  // Memory-bound kernels that read their input more than once (layer norm's statistics then
  // normalise, block softmax's max / sum / write passes): input passes over DRAM, 1 = once.
  double input_passes = 1.0;
  // Kernels that launch one CTA per row (layer / RMS norm, layer_norm_kernel.cu): the threads of
  // that CTA (0: not such a kernel; 512: the unvectorised forward, RowwiseMomentsCUDAKernel then
  // a 256-thread LayerNormForwardCUDAKernel), and the time bound their CTA waves set on the
  // target GPU (apply_tiling; kRowCtaLifetimeS). Not forest inputs.
  int64_t row_cta_threads = 0;
  double row_cta_bound_s = 0.0;
  // Kernels that stream a whole channel with one CTA (cuDNN's NCHW batch norm in training,
  // bn_fw_tr_1C11_kernel_NCHW / bn_bw_1C11_kernel_NCHW: grid = channels): that CTA's threads
  // (0: not such a kernel), and the share of DRAM bandwidth the resident CTAs' loads reach on
  // the target GPU (apply_tiling; kBwSaturatingSmFraction counted in threads). Not forest inputs.
  int64_t channel_cta_threads = 0;
  double channel_cta_bw_share = 0.0;
  // Kernels whose every thread loops serially over the batch and channels (PyTorch's NCHW
  // bilinear upsampling: one thread per output pixel; f_upsample_bilinear): iterations per
  // thread, and the time bound their waves of such threads set on the target GPU (apply_tiling;
  // kSerialLoopIterationS). Not forest inputs.
  int64_t serial_loop_iters = 0;
  double serial_loop_bound_s = 0.0;
  // A copy / element-wise kernel whose output or a same-shape input is a permuted view: read
  // (or written) across its stride along the output's innermost dim, so PyTorch's
  // non-vectorised, gathering kernel runs it (kPermutedCopySlowdown). Not a forest input.
  bool permuted = false;
  // Copies an op's CUDA host code makes of inputs not dense in its format before the main
  // kernel (host_copies: input.contiguous() / expect_contiguous() in SoftMax.cu host_softmax and
  // layer_norm_kernel.cu layer_norm_cuda, input.contiguous(memory_format) in cuDNN's
  // convolutions): a meta trace never dispatches them. Bytes read +
  // written, in-order and gathering across a permuted stride (kPermutedCopySlowdown), and how
  // many copies (each one more kernel in `kernels`). Not forest inputs.
  double hidden_copy_bytes = 0.0;
  double hidden_copy_permuted_bytes = 0.0;
  int64_t hidden_copies = 0;
  // A forward softmax / log-softmax over rows of <= 1024 elements: PyTorch's persistent warp
  // softmax (softmax_warp_forward), which streams below the element-wise rate
  // (kWarpSoftmaxSlowdown). Not a forest input.
  bool warp_softmax = false;
  // Input bytes a steady-state run finds in L2 (written by the units just before and not yet
  // evicted), set by the cost stage over a whole trace (cost_model.cpp), 0 for a lone unit.
  double l2_hit_bytes = 0.0;
  double compute_time_s = 0.0;   // flops / peak of the math mode
  double memory_time_s = 0.0;    // (bytes_read + bytes_written) / mem_bw
  double roofline_time_s = 0.0;  // max of the two
};

// Features of one op on `gpu`. Throws blink::Error for malformed arguments (naming the op),
// an FP8 GEMM on a GPU without FP8 tensor cores, an invalid GpuSpec, or a composite op
// (aten::linear, aten::matmul, ...) whose cost lives in the ops beneath it.
UnitFeatures compute_features(const std::string& op_name, const std::vector<Arg>& inputs,
                              const std::vector<Arg>& outputs, const GpuSpec& gpu,
                              const FeatureOptions& opts);

// The pure entry point the Python binding exposes 1:1 (blink._C.features_for). Same as
// compute_features; kept separate so the binding's name is stable if compute_features grows.
inline UnitFeatures features_for(const std::string& op_name, const std::vector<Arg>& inputs,
                                 const std::vector<Arg>& outputs, const GpuSpec& gpu,
                                 const FeatureOptions& opts) {
  return compute_features(op_name, inputs, outputs, gpu, opts);
}

// The op's name without its overload ("aten::add.Tensor" -> "aten::add"), as the rule table,
// the host dispatch table and the sync list key ops.
std::string op_base_name(const std::string& op_name);

// A tensor input the op's CUDA implementation copies densely (input.contiguous(format) in its
// host code) before its kernel, because it is not dense in that format: on meta those copies
// never run, so the trace lacks them. The unit's features charge them (hidden_copy_bytes) and
// the memory replay holds each copy's buffer while the op runs.
struct HostCopy {
  const TensorInfo* src = nullptr;
  bool channels_last = false;  // the copy's layout: NHWC / NDHWC, else row-major
};
std::vector<HostCopy> host_copies(const std::string& op_name, const std::vector<Arg>& inputs);

// Whether the table has a rule for the op (after dropping an overload suffix and, for an
// in-place op, its trailing underscore). Composite ops have a rule (it throws).
bool has_feature_rule(const std::string& op_name);

// The unit kind the table gives the op (false when it has no rule).
bool rule_kind(const std::string& op_name, UnitKind* kind);

// Whether the op is a composite whose kernels are the ops it calls (aten::linear -> addmm,
// aten::scaled_dot_product_attention -> a fused kernel): the cut must cost those, not it.
bool is_composite_op(const std::string& op_name);

// Bytes per element of a c10::ScalarType code (sub-byte types round up to 1). Throws for an
// unknown code.
int64_t dtype_itemsize(int dtype);

// Peak FLOP/s the math mode runs at on `gpu` (dtype picks the rate for kOther: FP64 or FP32).
double peak_flops_for(MathMode mode, int dtype, const GpuSpec& gpu);
// Time of dense math that takes `boost_time_s` at peak clocks, on a board that holds them for
// gpu.boost_window_s and then runs at its sustained ratio for the mode (see GpuSpec); a
// convolution on CUDA cores draws less power than SGEMM (kConvSimtPowerFraction). The pure
// roofline (compute_time_s, roofline_time_s) stays at datasheet peak.
double sustained_time_s(double boost_time_s, MathMode mode, const GpuSpec& gpu, UnitKind kind);

const char* unit_kind_name(UnitKind kind);   // "gemm", "conv", ..., "other"
const char* math_mode_name(MathMode mode);   // "fp32_simt", "tf32", "bf16_tc", ..., "other"

// The numeric features in a fixed order (enums as their integer codes, bools as 0/1): the
// binding's dict and the tree models' input vector both come from this one list.
std::vector<std::pair<const char*, double>> feature_values(const UnitFeatures& f);

}  // namespace blink
