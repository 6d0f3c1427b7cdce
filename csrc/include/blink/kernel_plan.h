#pragma once
// How the GEMM-like kernels of a unit run on a target GPU, as the CUDA libraries choose them:
// cuBLAS(Lt)'s choice among tile shapes, split-K and stream-K for a GEMM (csrc/core/gemm_cost.cpp)
// and ATen's / cuDNN's choice among convolution algorithms (csrc/core/conv_cost.cpp). Each plan
// is the fastest predicted candidate, as cuBLAS's heuristics and cuDNN's heuristics (or
// cudnn.benchmark's measurement) aim for. Torch-free; seconds, bytes, FLOPs.
#include <cstdint>

#include "blink/features.h"

namespace blink {

// ---- constants (each with why) ---------------------------------------------------------------

// Fraction of dense tensor-core peak the largest cuBLAS tiles sustain on big GEMMs (epilogue and
// pipeline bubbles; a power-capped board's clock is applied separately, sustained_time_s).
// Smaller tiles lose more (the tile table in gemm_cost.cpp). Per architecture, because the
// main loops differ:
//  - Volta / Turing (sm_70, sm_75: mma.sync fed by register-staged global loads, two stages):
//    0.80, the public DeepBench fp16 tensor-core GEMMs on the V100 (shared/data/public/deepbench;
//    median measured / analytic within 1%, benchmarks/accuracy_deepbench.py).
//  - Ampere / Ada (sm_80 - sm_89: cp.async multistage pipelines, CUTLASS's Sm80 mainloop, hide
//    the global-load latency): 0.86, the public maximum achievable BF16 matmul rate of an
//    A100 SXM (267.9 of 312 TFLOP/s, 85.9%, CUDA 12.1; stas00/ml-engineering's MAMF table).
//    Not fitted here: the RTX 3090's timm models (sm_86) are its held-out check.
//    Consumer Blackwell (sm_12x) runs the same kind of mma.sync kernels and takes this value.
//  - Hopper and datacentre Blackwell (sm_90, sm_10x: wgmma / tcgen05 warp-specialised kernels,
//    at clocks the power cap bounds): 0.80, the same table's H100 SXM (792.1 of 989, 80.1%).
//    benchmarks/matmul_published.py checks both on public torch.mm rates (H100 / H200 / B200
//    bf16 0.96-1.02x, A100 1.01-1.08x), as do the boards below (kTcTileReferenceDemand).
inline constexpr double kTcGemmBaseEfficiency = 0.80;
inline constexpr double kTcGemmBaseEfficiencySm80 = 0.86;
// Architectures whose tensor-core GEMMs are mma.sync main loops fed by ldmatrix from shared
// memory: Ampere / Ada (sm_8x) and consumer Blackwell (sm_12x).
inline bool mma_sync_arch(int cc_major) { return cc_major == 8 || cc_major == 12; }
inline double tc_gemm_base_efficiency(int cc_major) {
  return mma_sync_arch(cc_major) ? kTcGemmBaseEfficiencySm80 : kTcGemmBaseEfficiency;
}
// Tensor-core boards whose MMA pipe runs slower than the design point of the constants above
// lose less to what those constants charge. mma.sync architectures only (sm_80 - sm_89 and
// consumer Blackwell, sm_12x): Volta / Turing keep their fitted values, and Hopper / datacentre
// Blackwell feed wgmma / tcgen05 from shared memory by descriptor. Derived, not fitted; the
// checks are benchmarks/matmul_published.py (public torch.mm rates of 15 GPUs) and the RTX
// 3090's timm models (held-out families, blink evaluate). Two effects (gemm_cost.cpp):
//  - Shared-memory operand feed. The tile efficiencies (kTcTiles / kTcConvTiles) are an
//    mma.sync main loop fed by ldmatrix at the A100's rate: 2048 dense FP16 FLOP per clock per
//    SM with 2-byte operands (the demand: FLOP per clock per SM x operand bytes; TF32's 1024 x 4
//    is the same). A 64x64 CTA tile (2x2 warps of 32x32) reads 128 B of operands per 2048 FLOP,
//    so at that rate it needs the SM's whole 128 B/clock and runs at ~0.68 of the large tiles.
//    At half the demand (L4, L40S, A2: 1024 FLOP/clock/SM) a tile loses half as much of its
//    rate to it, at a quarter (GeForce sm_86 / sm_89 / sm_120 at 512) a quarter: efficiency
//    x min(1, demand ratio), so their small tiles lose little or nothing.
//  - The main loop's fixed losses (the base efficiency: barriers, pipeline waits, epilogue).
//    cuBLAS's kernels for an architecture are built for its full MMA rate (1024 FLOP/clock/SM
//    on sm_86 / sm_89 / sm_12x, 2048 on sm_80). GeForce boards run FP16 / BF16 with FP32
//    accumulate (what PyTorch asks for) at half of it (NVIDIA's GA102 / AD102 whitepapers), so
//    each MMA takes twice the clocks and hides twice the rest: the loss (1 - base) halves.
//    Public rates agree (matmul_published.py): the RTX 3090 / 4090 / 5090's square torch.mm
//    reaches 1.01-1.14x of the boost-clock peak, which needs an efficiency over 0.9 at any
//    clock GPU Boost reaches.
inline constexpr double kTcTileReferenceDemand = 2048.0 * 2.0;
// Dense FP16 FLOP per clock per SM an mma.sync architecture's own full-rate parts reach.
inline double tc_full_rate_flop_per_sm_clock(int cc_major, int cc_minor) {
  return cc_major == 8 && cc_minor == 0 ? 2048.0 : 1024.0;
}
// SGEMM on CUDA cores with 128x128 register-blocked tiles reaches ~88-92% of FMA peak.
inline constexpr double kSimtGemmBaseEfficiency = 0.88;
// A CTA's fixed cost besides its main loop, in SM clocks: the pipeline prologue waits one
// global-memory round trip (~600-800 clocks under load) before the first MMA, and the epilogue
// stores the output tile through the SM's ~64 B/clock store path. Converted to an equivalent K
// per tile shape and GPU (the "small-K regime"), so it differs per architecture and math mode.
inline constexpr double kCtaPrologueClocks = 700.0;
inline constexpr double kEpilogueBytesPerClock = 64.0;
// Fraction of DRAM bandwidth a tiled cuBLAS GEMM kernel reaches where its bytes, not its math,
// bound it (a short K loop: each CTA loads its operand tiles, then stores its output tile in the
// epilogue, the two not overlapped, with 1-4 CTAs per SM to hide them): well below a copy
// kernel's GpuSpec::dram_efficiency. Fitted on the public GEMM rows (NeuSight FP32 bmm +
// linear, DeepBench GEMMs), one GPU chip held out at a time (benchmarks/gemm_dram_logo.py):
// NeuSight's batched SGEMMs with K <= 32 reach 48-63% of DRAM bandwidth on all five of its
// GPUs, and the other chips choose 0.55 for every held-out one (0.55-0.6 in the first pass,
// which shipped 0.6 until 2026-12-04); held-out GEMM MAPE 19.7 -> 19.2% at 0.6 (blink
// evaluate). Tiled plans before sm_90 only: Hopper's cuBLAS runs persistent warp-specialised
// kernels whose epilogue overlaps the next tile's loads, and no public rows measure them; GEMV
// kernels stream like copies.
inline constexpr double kGemmDramEfficiency = 0.55;
// cuBLAS splits K only while each split keeps at least this much K (fewer steps than the
// pipeline depth would not amortise the prologue), and at most 16 ways.
inline constexpr double kSplitKMinK = 128.0;
inline constexpr int kSplitKMax = 16;
// ... and only while the output tiles would leave SMs idle: cuBLAS splits K to fill the GPU, not
// to even out the last of several waves. Read off the grids of the public NeuSight nn.Linear
// rows (shared/data/public/neusight-train, cublasLt SGEMM, PyTorch 2.1 / CUDA 12.1: gridDim.z
// is the K split, gridDim.x * y the output tiles): the A100's ampere_sgemm_* kernels split K in
// 99% of rows with fewer output tiles than SMs and 0.3% of those with over 1.5x its SMs; the
// Pascal, Volta and Turing boards' maxwell / volta_sgemm_* kernels split K in 44-97% of rows
// up to 6-8x their SMs and in none (P100, P4) or 14-17% (V100, T4) beyond 12x. Per
// architecture: sm_80 and newer, 1.5 tiles per SM (no public grids of sm_90 cuBLAS: taken as
// Ampere's; its stream-K evens out the last wave instead); older, 8. The plan's split agrees with
// cuBLAS's (split or not) in 73% (A100) to 94% (Pascal) of those rows, from 55-85% when any
// split that evened out a wave was taken (tests/test_kernel_plans.py).
inline constexpr double kSplitKMaxTilesPerSm = 8.0;
inline constexpr double kSplitKMaxTilesPerSmSm80 = 1.5;
inline double split_k_max_tiles_per_sm(int cc_major) {
  return cc_major >= 8 ? kSplitKMaxTilesPerSmSm80 : kSplitKMaxTilesPerSm;
}
// cuBLASLt's SGEMM kernels on sm_5x / sm_6x (the maxwell_sgemm_*_tn tiles nn.Linear's bias
// epilogue runs there, gemm_cost.cpp) slow down once a CTA's operand panels, (tile_m + tile_n)
// x K rows of one split, outgrow the L2: the main loop takes sqrt(panel / L2) times longer
// beyond that point (x0 = 1 is the L2 size, not fitted; the exponent is). A guess at why: the
// CTAs that share a panel drift apart over a long K loop and re-read it from DRAM as
// scattered 32 B sectors (both operands are K-contiguous). Only these kernels show it: the
// same boards' torch.bmm (maxwell_sgemm_128x64_nn) and DeepBench's plain cublasSgemm on four
// Pascal boards stay flat at the same panel / L2, as do the Volta, Turing and Ampere kernels
// up to 16x their L2. Data: the public NeuSight nn.Linear rows of the P100 and the P4 (the
// only sm_6x boards there), one held out at a time (benchmarks/pascal_linear.py): the
// exponent with the lowest MAPE on the P100 alone is 0.6, on the P4 alone 0.4 (a 0.1 grid);
// held-out nn.Linear kernel MAPE P100 23.4 -> 20.5% (at the P4's 0.4), P4 40.2 -> 38.4% (at
// the P100's 0.6). Shipped: 0.5, between them (20.2% and 36.2%, both boards fitted). With
// kPascalLtTileRate (below) the P100 prefers 0.5 and the P4 0.4: held out P100 20.0 -> 17.3%,
// P4 35.3 -> 33.9%; shipped 17.4% and 32.9%.
inline constexpr double kPascalLtPanelExponent = 0.5;
// ... and those kernels' main loops run at this share of the tile table's rate at any K. On the
// same two boards torch.bmm's maxwell_sgemm_128x64_nn and DeepBench's plain cublasSgemm tiles
// reach the table's rate (P100 median measured / analytic 0.96 and 0.91), while the *_tn tiles
// nn.Linear runs (both operands K-contiguous) took 1.16x / 1.34x the plan at K <= 1024, where
// no panel outgrows the L2. Fitted on one board, checked on the other over a grid of 0.75-1
// (benchmarks/pascal_linear.py, fourth table): the P100 alone prefers 0.875, the P4 alone 0.8;
// held-out nn.Linear kernel MAPE P100 20.4 -> 19.4% (at the P4's 0.8), P4 36.7 -> 33.3% (at the
// P100's 0.875). Shipped: 0.85, between them (17.4% and 32.9%, both boards fitted).
inline constexpr double kPascalLtTileRate = 0.85;
// cuDNN's weight-gradient kernels reduce over N * output spatial (the implicit GEMM's K, often
// 10^5-10^6) and parallelise that reduction across many CTAs (CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0
// / _1 accumulate partial filters), far beyond cuBLAS's split-K.
inline constexpr int kWgradSplitMax = 1024;
// Stream-K / persistent kernels (cuBLASLt on sm_90+) spread the tiles' K iterations evenly over
// the SMs, so no partial last wave; the fix-up of shared tiles costs ~5%.
inline constexpr double kStreamKEfficiency = 0.95;
// A GEMM whose M or N is at most this runs cuBLAS's GEMV / small-N kernels (gemv, gemvx,
// gemmSN): memory-bound, math on CUDA cores. A single GEMM only: strided-batched GEMMs
// (aten::bmm) have neither this path nor split-K (plan_gemm_unit).
inline constexpr int64_t kGemvMaxDim = 8;
inline constexpr int64_t kConvGemvMaxDim = 4;
// GEMV / skinny kernels: arithmetic at half of the FMA rate (dot-product reductions, shuffles).
inline constexpr double kGemvComputeEfficiency = 0.5;
// A GEMV / small-N kernel whose output rows give fewer CTAs than the GPU has SMs splits K into
// chunks of at least this many elements, up to one CTA per SM (gemm_cost.cpp): each chunk
// still streams 16 KB+ per row (fp32), enough to amortise the CTA's start and its partial sum.
inline constexpr double kGemvSplitMinK = 4096.0;

// cuDNN implicit-GEMM convolutions relative to a GEMM of the same implicit shape: im2col
// address arithmetic and filter-shape-dependent tiles cost ~15%. A main-loop loss like the
// base efficiency's, so on tensor cores it takes the same relief (gemm_cost.cpp,
// kTcTileReferenceDemand): a GeForce sm_86 / sm_89 / sm_12x board, whose FP32-accumulate MMAs
// take twice the clocks of its architecture's full rate, hides half of the address math behind
// them (0.925 there; 0.85 where the MMA pipe runs at full rate, and on CUDA cores). Derived,
// not fitted. The check: the RTX 3090's timm inference models (held-out families, blink
// evaluate), where a regression of the measured times on Blink's per-class times weighted
// kxk convolutions 0.89 (NCHW) / 0.83 (NHWC) and 1x1 ones 0.89 / 0.97, family bootstrap 90%
// intervals 0.83-0.95 / 0.77-0.92 and 0.74-1.02 / 0.83-1.09, against memory-bound kinds at
// 1.00 / 1.06; with the relief 0.97 / 0.90 and 0.98 / 1.06 (benchmarks/timm_conv_classes.py,
// results/timm_conv_classes.txt). DeepBench's boards (sm_6x / sm_7x) are unchanged. Dense
// forward passes only: grouped convolutions (ResNeXt, RegNet, the g8 / g16 EfficientNets: 4-64
// channels per group) were weighted 1.14 / 1.18 already, and the one check of backward
// passes, the RTX 3090's training steps (torch 1.12, cuDNN 8.3), were predicted ~8% fast
// already and went from 9.2 to 10.0% MAPE with the relief on every pass (9.4% as shipped);
// no public data times a backward pass on cuDNN 9.
inline constexpr double kConvVsGemmEfficiency = 0.85;
// cuDNN's backward kernels against its forward ones, on top of that (conv_cost.cpp,
// conv_pass_efficiency). The public DeepBench convolutions (shared/data/public/deepbench,
// cuDNN 7.6, fp32 on six boards and fp16 tensor cores on two) ran forward at 1.03x of the plan
// at the median and stride-1 data gradients at 1.04x, but weight gradients at 1.34x and data
// gradients of stride-2 convolutions at 2.4x (cudnnConvolutionBackwardData over the input grid,
// whose pixels a strided filter reaches unevenly), on every board and in both precisions.
// Held out one GPU chip at a time (benchmarks/conv_backward.py; engine rebuilt per rate over
// 1, 0.85, 0.75, 0.7, 0.65, 0.6 for weight gradients and 1, 0.7, 0.55, 0.5, 0.45, 0.4 for
// strided data gradients): the other chips pick 0.85 for every held-out chip (weight-gradient
// MAPE 35.2 -> 34.5%; the V100 and P100 lose 2 points, the Pascal GeForce boards and the T4
// gain 1.3-3.5) and 0.45-0.55 (strided data-gradient MAPE 54.0 -> 40.2%). The check no
// DeepBench row enters: the RTX 3090's timm training steps (torch 1.12, cuDNN 8.3, AMP),
// analytic MAPE 10.1 -> 9.2%, median measured / analytic 1.099 -> 1.084. A transposed
// convolution's forward is cuDNN's data-gradient kernel and takes the strided rate too (no
// public row times one); strides above 2 are not in the data.
inline constexpr double kConvWgradEfficiency = 0.85;
inline constexpr double kConvStridedDgradEfficiency = 0.5;
// cuDNN's backward passes (data and weight gradient) of a grouped, not depthwise, convolution
// (ResNeXt, RegNet, the g8 / g16 EfficientNets: 4-64 channels per group) against its dense
// ones, on top of the rates above (conv_cost.cpp). Fitted, not derived: no public row times a
// grouped convolution alone (DeepBench's are all dense), so the data are the RTX 3090's timm
// training steps (shared/data/public/timm-rtx3090, torch 1.12, cuDNN 8.3, AMP), where a
// regression of the measured steps on Blink's per-class convolution times weighed grouped
// convolutions (forward and backward) by 1.51, family bootstrap 90% interval 1.30-1.72,
// against 0.93-0.98 for dense and 1x1 ones. Chosen by MAPE over a grid of 1-0.4 on four of
// blink evaluate's five folds of held-out families, each fold scored on its held-out families
// (benchmarks/grouped_backward.py; a step's time at another rate is rescaled from the engine's
// grouped backward time, an approximation): every fold picks 0.5 rescaled from this engine,
// 0.55 or 0.6 rescaled from the engine without the rule; held-out training-step MAPE 8.5 ->
// 7.7%, the 82 models with > 5% of their step in grouped backward passes 14.6 -> 8.6%
// (RegNetX 15.2 -> 5.3, RegNetY 15.9 -> 7.4, NF-RegNet 19.6 -> 4.4, ResNeSt 12.0 -> 3.9;
// DLA's grouped X variants 3.3 -> 11.5). Shipped: 0.55. Rebuilt with it, the training cache's
// analytic MAPE went 8.29 -> 7.72% (in sample for this constant). Their forward passes
// stay as they are: the inference sets (torch 2.4, cuDNN 9) weigh them 1.14 / 1.17 with
// intervals that reach 1 (benchmarks/timm_conv_classes.py). Depthwise convolutions run
// ATen's own kernels and are not affected.
inline constexpr double kConvGroupedBackwardEfficiency = 0.55;
// cuDNN's CUDA-core (FP32 SIMT) convolution kernels draw this fraction of SGEMM's board power
// per FLOP/s (their issue slots go to im2col address math and shared-memory staging, not FMAs),
// so a power-capped board holds a higher clock under them: min(1, FP32 ratio / this). Fitted on
// the public DeepBench fp32 convolutions (shared/data/public/deepbench, cuDNN 7.6, cudnnFind*):
// the value that gives the 70 W T4, the only power-capped board there, the median
// log(measured / analytic) of the five boards that hold boost (benchmarks/sustained_logo.py
// prints the fit; 0.62 until the per-board DRAM rates of 2026-12-05 moved the boards' bias).
// Tensor-core convolutions follow the tensor-core rule: DeepBench's T4 fp16 tensor-core
// convolutions already match the V100's bias under it.
inline constexpr double kConvSimtPowerFraction = 0.585;
// Winograd F(4x4, 3x3) needs 36 multiplies per 4x4 output tile where direct needs 144 (4x), and
// F(2x2, 3x3) 16 for 36 (2.25x). cuDNN's FP32 WINOGRAD_NONFUSED runs F(4x4, 3x3): its batched
// GEMMs over the 36 transformed tiles do a quarter of the direct multiplies, at a lower rate
// than one large GEMM (K = C per tile, 36 small products), so the main loop is costed as an
// implicit GEMM of direct FLOPs / this reduction; the transformed tiles are extra traffic
// (below). Fitted on the public DeepBench CUDA-core convolutions (shared/data/public/deepbench,
// cuDNN 7.6 via cudnnFind*: FP32 on six boards and the P100's fp16, fwd + both backward passes;
// the tensor-core rows do not take the rule and did not move), one board held out at a
// time over a 2.25-4 grid (0.25 steps): five folds choose 3.5, one 3.75; held-out analytic
// conv MAPE 31.2 -> 29.2% (every board but the TITAN X Pascal better; the 3x3 stride-1 rows,
// median measured / analytic 0.74-0.97 at 2.25, were the ones off). Until 2026-12-07 it was
// 2.25 (F(2x2, 3x3)'s count, not fitted). Checked on what no fit saw: NVIDIA's published
// PyTorch ResNet-50 FP32 inference (data/published/dle_convnets_inference.csv, cuDNN 8, V100
// and T4) goes 7.0 -> 4.8% MAPE (benchmarks/models_published.py). Only CUDA-core
// convolutions take it (FP32, or half precision on a GPU without tensor cores): TF32 and
// tensor-core half-precision ones run implicit GEMM on the tensor cores.
inline constexpr double kWinogradFlopReduction = 3.5;
// WINOGRAD_NONFUSED writes and re-reads the transformed input / output tiles (6x6 per 4x4: 2.25x
// the tensor) in separate transform kernels.
inline constexpr double kWinogradTransformFactor = 2.25;
// Tensor-core convolutions need channels per group padded to the MMA's K granularity: 8 for
// fp16 / bf16, 4 for TF32 (cuDNN pads, e.g. a C_in = 6 layer runs as C_in = 8).
inline constexpr int64_t kTcChannelAlign16 = 8;
inline constexpr int64_t kTcChannelAlignTf32 = 4;
// ... except a forward convolution's input of at most this many channels per group (an RGB
// stem), which cuDNN's few-channel fprop kernels pad only to 4 (conv_cost.cpp).
inline constexpr int64_t kTcFewChannels = 4;
// Per-group channels below this cannot fill an MMA's N / K: such grouped convolutions run on
// CUDA cores.
inline constexpr int64_t kMinTensorCoreChannels = 8;
// PyTorch's direct depthwise kernels (aten/src/ATen/native/cuda/DepthwiseConv2d.cu,
// DepthwiseConv3d.cu): one thread per output element looping over the filter window, inputs
// through the L1/texture cache. They sustain about half of a streaming kernel's DRAM bandwidth
// (gather-like window loads, no vectorisation) and a quarter of the FMA rate (index math per
// tap).
inline constexpr double kDepthwiseBandwidthFraction = 0.5;
inline constexpr double kDepthwiseComputeEfficiency = 0.25;

// ---- GEMM -----------------------------------------------------------------------------------

struct GemmProblem {
  double m = 0, n = 0, k = 0, batch = 1;
  MathMode mode = MathMode::kFp32Simt;
  int dtype = 6;
  double efficiency_scale = 1.0;  // e.g. a backward convolution pass's rate
  // An implicit-GEMM convolution's own loss (kConvVsGemmEfficiency; 1 for a GEMM), relieved on
  // tensor cores like the base efficiency (gemm_cost.cpp).
  double implicit_gemm_efficiency = 1.0;
  int max_split = kSplitKMax;     // K splits the library uses at most
  // M or N at most this runs a GEMV / small-N kernel (cuBLAS: kGemvMaxDim; cuDNN's implicit
  // GEMMs only for a single-digit channel count on CUDA cores, kConvGemvMaxDim).
  int64_t gemv_max_dim = kGemvMaxDim;
  // A cuBLAS GEMM (aten::mm / addmm / bmm ...), not a cuDNN implicit GEMM: on CUDA cores it
  // runs cuBLAS's SGEMM kernels of the GPU's architecture (gemm_cost.cpp).
  bool cublas = false;
  bool cublaslt_epilogue = false;  // cublasLtMatmul with a bias epilogue (UnitFeatures)
  // cublasGemmStridedBatchedEx (aten::bmm): on CUDA cores its own tile list (gemm_cost.cpp).
  bool strided_batched = false;
  // A cuDNN forward (fprop) convolution on tensor cores: its narrow-N tiles exist
  // (gemm_cost.cpp, kTcConvTiles).
  bool conv_fprop = false;
};

struct GemmPlan {
  double compute_s = 0.0;
  double aux_bytes = 0.0;   // traffic of extra kernels (split-K partial sums)
  int64_t aux_kernels = 0;  // their launches
  int64_t tile_m = 0, tile_n = 0, split_k = 1;
  int64_t ctas = 0, ctas_per_sm = 1, waves = 0;
  bool stream_k = false;
  bool gemv = false;
};


// The fastest predicted cuBLAS configuration for the problem on `gpu`.
GemmPlan plan_gemm(const GemmProblem& p, const GpuSpec& gpu);

// Sets a unit's launch-shape features (tile, split-K, CTAs, CTAs per SM, waves, threads) from a
// plan.
void set_launch_shape(UnitFeatures& f, const GemmPlan& plan);

// ---- convolution ----------------------------------------------------------------------------

enum class ConvAlgo : int {
  kNone = 0,
  kImplicitGemm = 1,     // cuDNN IMPLICIT(_PRECOMP)_GEMM, on tensor cores where the math allows
  kWinograd = 2,         // cuDNN WINOGRAD(_NONFUSED): 3x3, stride 1, CUDA-core math
  kDepthwiseDirect = 3,  // ATen's own _conv_depthwise2d / conv_depthwise3d kernels
  kGroupedGemm = 4,      // cuDNN grouped convolution (one batched implicit GEMM over groups)
};

const char* conv_algo_name(ConvAlgo a);

// Chooses the convolution algorithm for a conv unit whose geometry and math mode features.cpp
// filled (forward or backward; the backward's passes come from `passes`: bit 0 grad_input,
// bit 1 grad_weight), and sets the plan fields of `f`: conv_algo, math_mode (CUDA cores for
// the depthwise and Winograd paths), tile_m / tile_n / split_k / tiles / waves,
// kernel_compute_s, aux_bytes and kernels. Returns the factor by which the cheapest algorithm
// family considered can cut the multiplies below the direct FLOPs (4 where Winograd F(4x4, 3x3)
// applies, else 1): the roofline lower bound divides the FLOPs by it.
double plan_conv(UnitFeatures& f, int passes, const GpuSpec& gpu, const FeatureOptions& opts);

// Sets the plan fields of a GEMM unit (tile shape, split-K, waves, kernel_compute_s, aux traffic).
void plan_gemm_unit(UnitFeatures& f, const GpuSpec& gpu);

}  // namespace blink
