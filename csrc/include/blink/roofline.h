#pragma once
// The analytic time model: a roofline with efficiency terms, used where no trained model covers
// a unit and as the baseline every evaluation reports. Plus the host (CPU dispatch) time of an
// op in eager PyTorch. Seconds throughout.
#include <string>

#include "blink/features.h"

namespace blink {

// ---- constants of the GPU-time model (each with why; see csrc/core/roofline.cpp) ---------------

// Smallest time a kernel occupies on an eager, launch-bound timeline: back-to-back launches
// land ~2-3 us apart (cudaLaunchKernel + the GPU front end), and CUPTI reports ~1.5-3 us for the
// tiniest kernels. A unit of n kernels costs at least n floors.
inline constexpr double kLaunchFloorS = 2.5e-6;

// The fraction of the spec DRAM bandwidth a streaming kernel reaches is per GPU:
// GpuSpec::dram_efficiency (blink/hardware.py DRAM_EFFICIENCY).
// Fixed cost of a memory-bound kernel: the first loads wait a DRAM round trip (~0.6-0.8 us
// under load) and the last wave drains. Time = latency + bytes / bandwidth is the size ramp:
// B bytes reach B / (B + bandwidth * latency) of the bandwidth (Little's law).
inline constexpr double kDramLatencyS = 1.0e-6;
// L2 serves reads ~3x faster than DRAM on NVIDIA data-centre GPUs (A100: ~5 vs 1.6-2 TB/s;
// H100: ~10 vs 3.35 TB/s): an input still resident in L2 costs a third of a DRAM read.
inline constexpr double kL2VsDramBandwidth = 3.0;
// Lifetime of a CTA that owns one row (layer / RMS norm's kernels in layer_norm_kernel.cu launch
// grid = rows): a DRAM round trip for the row, the block's Welford reduction, then an L2 round
// trip for gamma / beta and the row's second pass. Such a kernel takes at least its waves of
// resident CTAs times this lifetime, which outlasts the DRAM time when rows are short (the
// channels-last norms of ConvNeXt / EdgeNeXt-style blocks: 24-96 channels over millions of
// pixels). Not fitted: built from kDramLatencyS and kL2VsDramBandwidth.
inline constexpr double kRowCtaLifetimeS = kDramLatencyS * (1.0 + 1.0 / kL2VsDramBandwidth);
// One iteration of a kernel loop whose every step waits for its own load: a dependent round trip
// to DRAM with the memory system otherwise idle (no queueing, unlike kDramLatencyS). PyTorch's
// NCHW bilinear upsampling (aten/src/ATen/native/cuda/UpSampleBilinear2d.cu,
// upsample_bilinear2d_out_frame) launches one thread per output pixel, and each thread loops
// over every image and channel: four gathers from that (n, c) plane, then a store the next
// iteration's loads may alias (plain accessors, no __restrict__), so the loop runs one memory
// round trip per step. Public pointer-chase microbenchmarks put an idle DRAM round trip on
// Volta-to-Hopper boards at roughly 250-450 ns; 300 ns, taken with the only public rows that
// run this kernel in view (timm-rtx3090's EfficientFormerV2, whose measured excess over the
// rest of the model is 277-292 ms per upsampling call of 1024 x 1024 iterations, i.e. ~280 ns
// per step, some steps hitting a line already cached). Those rows motivated the rule, so their
// gain is not a held-out result (benchmarks/upsample_loop.py prints them before / after).
inline constexpr double kSerialLoopIterationS = 3.0e-7;
// A copy or element-wise kernel over a permuted view (an operand whose stride along the output's
// innermost dim is neither 1 nor 0: x.permute(...).contiguous(), NCHW <-> NHWC, a Linear over a
// transposed tensor) takes this many times the DRAM time of the same bytes streamed in order.
// The CUDA path (aten/src/ATen/native/cuda/CUDALoops.cuh gpu_kernel_impl): a TensorIterator that
// is not contiguous runs launch_legacy_kernel with an OffsetCalculator, one element per thread
// per step, no 16-byte vector accesses, and the permuted operand is gathered across its stride
// (Copy.cu's direct_copy_kernel_cuda takes the same path). Fitted on the public timm RTX 3090
// whole-model times of the same models run NCHW and channels-last (shared/data/public/
// timm-rtx3090; 627 models in both layouts), where only the layout, so which ops transpose,
// differs: the factor that best predicts each model's measured NHWC / NCHW speed-up, one model
// family held out at a time (every family of 104 chooses 1.75 on a 0.25 grid from the others
// but 2 (1.75 / 2.0); benchmarks/transpose_logo.py prints the fit and the held-out speed-up
// error). CaiT's talking-heads permutes and XCiT / VOLO's NCHW <-> token reshapes are the
// models it moves most.
inline constexpr double kPermutedCopySlowdown = 1.75;
// A forward softmax over rows of <= 1024 elements (aten/src/ATen/native/cuda/SoftMax.cu
// dispatch_softmax_forward -> softmax_warp_forward: a warp per row, the row held in registers,
// each thread loading its WARP_ITERATIONS elements one scalar load at a time, then two warp-
// shuffle reductions before the write) takes this many times the DRAM time of its bytes
// streamed by the vectorised element-wise kernel. Fitted on the public NeuSight softmax rows
// (shared/data/public/neusight-train; FP32, PyTorch 2.1, rows of 515-1024 elements) as kernel
// times: the median measured / analytic over the five GPUs' medians (A100 1.10, P100 1.24,
// P4 1.08, T4 1.24, V100 1.27). Held out one GPU at a time (the median of the other four,
// 1.17-1.24), these rows' analytic MAPE goes 14.8 -> 9.3% (A100 10.8 -> 10.9, P100 19.5 ->
// 6.1, P4 6.7 -> 15.8, T4 18.3 -> 5.9, V100 18.9 -> 7.8; benchmarks/softmax_regimes.py prints
// the per-GPU rates). The backward's warp kernel (dispatch_softmax_backward ->
// softmax_warp_backward) loads grad and output the same way and takes the same rate; no public
// row times it alone. Its check is the RTX 3090's timm training steps (torch 1.12, AMP, whose
// attention runs softmax and its backward in FP32 over rows of 50-577): their measured times
// weighed Blink's softmax time by 2.10 (family bootstrap 90% interval 1.45-2.61) with the
// backward at the element-wise rate, 1.89 (1.31-2.33) with it at this one; analytic MAPE
// 9.35 -> 9.17%, the 60 models with >= 8% of their time in softmax 14.8 -> 13.5%
// (benchmarks/timm_train_kinds.py).
inline constexpr double kWarpSoftmaxSlowdown = 1.24;
// Share of L2 a steady-state working set may use and still be found there by the next unit
// (the rest holds weights, other streams' lines, and set conflicts evict early).
inline constexpr double kL2ResidentFraction = 0.5;
// Share of the SMs that, fully occupied, keep enough loads in flight to saturate DRAM; a kernel
// with CTAs on fewer SMs gets proportionally less bandwidth. A kernel whose few CTAs each stream
// millions of elements (cuDNN's NCHW training batch norm, a CTA per channel) is counted in
// resident threads instead: 16 512-thread CTAs are 16 SMs but a third of each SM's threads.
inline constexpr double kBwSaturatingSmFraction = 0.5;

// GEMM and convolution compute times come from their kernel plans (blink/kernel_plan.h).
// Fused attention (attention_compute_s in roofline.cpp). Each CTA loops over 128-row blocks of
// the other sequence (forward: key blocks per query block; backward: query blocks per key
// block), so its time is (loop blocks + a fixed overhead) x one block's work at the kernel's
// plateau efficiency: the share of the dense tensor-core peak its main loop holds on long
// sequences, per kernel and architecture (AttentionBackend). Sources, all public, none of them
// in Blink's evaluation sets:
//  * Hopper (sm_9x), FlashAttention-3 paper (Shah et al. 2024, figs. 5-6: H100 SXM5, FP16, 16k
//    tokens, hidden 2048), TFLOP/s at 8k-16k over 989: FlashAttention-2 forward 324 / 370 /
//    326 at head dim 64 / 128 / 256, backward 322 at 128 (~295 at 64); cuDNN forward 413 /
//    600 / 581, backward 516 at 128 (~435 at 64). PyTorch's flash kernels are FA2 (no wgmma /
//    TMA on sm_90); cuDNN attention is what torch >= 2.11 runs there first (blink/sdpa.py).
//  * Ampere / Ada (sm_8x): FA2 paper (Dao 2023): forward up to 73% of A100's peak; an RTX A5000
//    runs FA2 at 0.74 (forward) and 0.70 (backward) of its 111 TFLOP/s at head dim 64
//    (gpu-mode/ring-attention issue 10). 0.70 / 0.60.
//  * the CUTLASS memory-efficient kernel against FA2 on the same GPU: 0.63x forward on an H100
//    (onnxruntime PR 21629, torch:efficient 144.8 vs torch:flash 229.5 TFLOP/s), 0.82x forward
//    and 0.53x backward (flash-attention issue 416, causal head dim 64); xformers' kernel on an
//    A100 (xformers PR 587, FP16 forward, head dim 64-256) at 0.50-0.57 of peak, 0.71-0.81x FA2's
//    0.70: 0.75x forward, 0.55x backward.
//  * Volta / Turing (only the memory-efficient kernel runs there) and Blackwell: a flat 0.5 /
//    0.35 of peak, the rule for every GPU before 2026-12-06. Blackwell's one public point agrees:
//    the FlashAttention-4 paper's 1613 TFLOP/s on a B200 (71% of peak) is 1.3x cuDNN 9.13's,
//    so ~0.55 forward.
inline constexpr double kAttentionBlock = 128.0;
inline constexpr double kAttentionDefaultFwd = 0.5, kAttentionDefaultBwd = 0.35;
inline constexpr double kFlashAmpereFwd = 0.70, kFlashAmpereBwd = 0.60;
inline constexpr double kFlashHopperFwd[3] = {0.33, 0.37, 0.33};  // head dim <=64, <=128, more
inline constexpr double kFlashHopperBwd[3] = {0.30, 0.33, 0.33};
inline constexpr double kCudnnHopperFwd[3] = {0.42, 0.61, 0.59};
inline constexpr double kCudnnHopperBwd[3] = {0.44, 0.52, 0.52};
inline constexpr double kEfficientVsFlashFwd = 0.75, kEfficientVsFlashBwd = 0.55;
// FP32 inputs run the memory-efficient kernel as 3xTF32 (MathMode::kTf32x3: three TF32 MMAs per
// product, so a third of the TF32 peak), whose non-MMA work (softmax, index math) is the same as
// in half precision while its MMA work triples: it holds a larger share of that peak. xformers'
// CUTLASS kernel on an A100 (facebookresearch/xformers PR 587, B=64, M=1024, H=16, forward):
// FP32 at 0.77-0.90 of TF32 / 3 for head dims 64-256 against FP16 at 0.50-0.57 of its peak,
// ~1.6x; its backward at M=197 shows FP32 3.3x slower than FP16 where 6x would mean no gain.
inline constexpr double kTf32x3EfficiencyGain = 1.6, kAttentionMaxEfficiency = 0.9;
// Fixed per-CTA work in loop blocks (Q load and output write forward; the dO.O pre-pass, dQ
// accumulation and conversion backward), fitted to the same H100 figures' head-dim-128 ramps
// (FA2 and cuDNN at 512-2k tokens reach 0.83 / 0.95 / 0.98 of their plateau forward, 0.62 /
// 0.80 / 0.90 backward).
inline constexpr double kAttentionLoopOverheadFwd = 0.6, kAttentionLoopOverheadBwd = 2.0;
// A causal mask skips the blocks above the diagonal, but the diagonal blocks are masked element
// by element and the triangle leaves CTAs of unequal length: (b + 2) / 2b of the b x b block
// pairs' work at 0.93 of the plateau (the FA3 paper's causal / non-causal ratios at head dim
// 128, FA2 and cuDNN: 0.62-0.63 at 512 tokens, 0.78-0.82 at 2k, 0.90-0.91 at 16k).
inline constexpr double kCausalExtraBlocks = 2.0, kCausalEfficiency = 0.93;
// Arithmetic in element-wise / reduction kernels rarely binds; when it does (transcendentals,
// FP64), half of FMA peak accounts for non-FMA instructions and index math.
inline constexpr double kSimtElementwiseEfficiency = 0.5;

// GPU time of one unit on `gpu` from its features (features computed for the same GPU):
// max(launch floor x kernels, compute time, memory time), with wave quantisation for GEMMs,
// convolutions and attention. 0 for a unit without kernels.
double analytic_time_s(const UnitFeatures& f, const GpuSpec& gpu);

// Time of one cuDNN RNN call (UnitKind::kRnn; csrc/core/rnn.cpp): the per-layer input GEMMs
// over all timesteps, then T dependent steps (a small recurrent GEMM + the fused gate kernel),
// layers overlapping in a wavefront where one step leaves the GPU idle.
double rnn_time_s(const UnitFeatures& f, const GpuSpec& gpu);

// ---- host time ----------------------------------------------------------------------------
//
// An eager op's CPU time splits in two: the caller's side (the Python line that calls it, the
// python_arg_parser, nn.Module.__call__ and the torch.nn.functional wrapper around it, or the
// autograd engine's per-node work in backward) and the op's CUDA-side dispatch (from the
// dispatcher's entry to the return: TensorIterator or descriptor setup, caching-allocator
// calls, cuBLAS / cuDNN plan lookup, cudaLaunchKernel). The dry run measures the first
// (cost_model.h HostTimeMode::kMeasured); the table below gives the second, and constants stand
// in for the first where no measurement is used (kTable).

// Caller's side per op in table mode: a Python-level torch call (frame, python_arg_parser,
// THPVariable_Wrap of the result): 2.5-4 us on a ~3 GHz server core.
inline constexpr double kHostPythonCallS = 3.0e-6;
// Per nn.Module entered in the forward pass, table mode: Module.__call__ -> _call_impl (hook
// dict checks), the forward's Python frame and its torch.nn.functional wrapper's checks
// (has_torch_function, F.batch_norm's _verify_batch_size, ...): 4-6 us.
inline constexpr double kHostModuleCallS = 5.0e-6;
// CUDA-side dispatch of an op not in the table: a TensorIterator kernel (TensorIteratorBase::
// build ~1 us, a caching-allocator hit for the output ~0.3 us, gpu_kernel -> cudaLaunchKernel
// ~2 us in the driver).
inline constexpr double kCudaDispatchDefaultS = 3.5e-6;

// CUDA-side dispatch time of one op (the table in csrc/core/roofline.cpp, each row naming the
// PyTorch code path it stands for); kCudaDispatchDefaultS for an op not in it. A composite's
// entry (aten::linear) covers the ops beneath it.
double cuda_dispatch_time_s(const std::string& op_name);

// Host time of one op called from Python in table mode: kHostPythonCallS +
// cuda_dispatch_time_s (module calls not included).
double host_dispatch_time_s(const std::string& op_name);

}  // namespace blink
