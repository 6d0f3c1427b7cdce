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

// Fraction of the spec DRAM bandwidth a large streaming kernel reaches: copy kernels measure
// 85-92% of the HBM / GDDR figure on A100 / H100 (refresh, ECC, row switches take the rest).
inline constexpr double kDramEfficiency = 0.85;
// Fixed cost of a memory-bound kernel: the first loads wait a DRAM round trip (~0.6-0.8 us
// under load) and the last wave drains. Time = latency + bytes / bandwidth is the size ramp:
// B bytes reach B / (B + bandwidth * latency) of the bandwidth (Little's law).
inline constexpr double kDramLatencyS = 1.0e-6;
// Share of the SMs that, fully occupied, keep enough loads in flight to saturate DRAM; a kernel
// with CTAs on fewer SMs gets proportionally less bandwidth.
inline constexpr double kBwSaturatingSmFraction = 0.5;

// Fraction of dense tensor-core peak large cuBLAS GEMMs reach: 70-80% (clocks fall below the
// boost clock the peak assumes under tensor-core load; epilogue and pipeline bubbles).
inline constexpr double kTensorCoreGemmEfficiency = 0.75;
// SGEMM on CUDA cores reaches ~85-90% of FMA peak.
inline constexpr double kSimtGemmEfficiency = 0.85;
// Per output tile, filling the shared-memory pipeline and writing the tile cost about as much
// as 64 steps of K, so efficiency ramps as K / (K + 64): small-K GEMMs are far from peak.
inline constexpr double kGemmKHalf = 64.0;
// cuBLAS splits K (split-K / stream-K) when the output tiles cannot fill the GPU, keeping at
// least this much K per split.
inline constexpr double kSplitKMinK = 256.0;
// cuDNN implicit-GEMM convolutions reach ~60-70% of tensor-core peak (im2col address math,
// filter-shape-dependent tiles).
inline constexpr double kConvEfficiency = 0.65;
// Per-group channels below this cannot fill an MMA's N / K dimension: depthwise and narrow
// grouped convolutions run on CUDA cores.
inline constexpr double kMinTensorCoreChannels = 8.0;
// FlashAttention-2 forward: ~70% of peak on A100 but 35-50% on H100 (no wgmma / TMA); 0.5.
inline constexpr double kAttentionFwdEfficiency = 0.5;
// Attention backward: five GEMMs with atomic dQ accumulation, ~0.7x the forward's efficiency.
inline constexpr double kAttentionBwdEfficiency = 0.35;
// Key/query block of the fused attention kernels: with a causal mask, blocks above the
// diagonal are skipped, so (n + 1) / (2n) of the n x n block pairs run.
inline constexpr double kAttentionBlock = 128.0;
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

// Typical eager-mode CPU cost of one aten op called from Python (argument parsing, dispatcher,
// TensorIterator / descriptor setup, cudaLaunchKernel) on a server CPU: 4-8 us.
inline constexpr double kHostDefaultS = 5.0e-6;

// Host (CPU dispatch) time of one op in eager PyTorch, from a named table (csrc/core/roofline.cpp);
// kHostDefaultS for an op not in it. A composite's entry (aten::linear) is the whole call,
// the ops beneath it included.
double host_dispatch_time_s(const std::string& op_name);

}  // namespace blink
