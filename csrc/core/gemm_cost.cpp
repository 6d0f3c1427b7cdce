// GEMM plans: which cuBLAS(Lt) kernel configuration a GEMM runs as, and its compute time.
//
// cuBLAS does not run one tile shape everywhere: its heuristics (cublasLtMatmulAlgoGetHeuristic,
// behind at::cuda::blas::gemm in aten/src/ATen/cuda/CUDABlas.cpp) pick a kernel per shape and
// GPU from a family of tile shapes, split-K factors and, from sm_90 on, stream-K / persistent
// schedules, aiming for the fastest. Blink models the candidates below and keeps the fastest
// predicted one, so a GEMM whose tiles would leave a mostly empty last wave is not charged for
// it when a smaller tile fills the GPU; a K split only where the output tiles alone would leave
// SMs idle (kSplitKMaxTilesPerSm, as the grids cuBLAS launched show). GEMMs with M or N <=
// kGemvMaxDim run the memory-bound GEMV / small-N kernels (cublas gemv, gemvx, gemmSN).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "blink/kernel_plan.h"

namespace blink {
namespace {

struct TileShape {
  int64_t m, n;
  int64_t ctas_per_sm;  // CTAs the kernel is built to keep resident per SM
  double efficiency;    // main-loop efficiency relative to the largest tile
};

// CUTLASS / cuBLAS tensor-core tiles (sm_70+): larger tiles reuse each loaded element over more
// MMAs; 64x64 tiles are shared-memory-bandwidth bound at ~70% of the large-tile rate.
constexpr TileShape kTcTiles[] = {
    {256, 128, 1, 1.00}, {128, 256, 1, 1.00}, {128, 128, 2, 0.95},
    {128, 64, 2, 0.85},  {64, 128, 2, 0.85},  {64, 64, 4, 0.68},
};
// cuDNN's tensor-core forward convolutions (its sm80_xmma_fprop_implicit_gemm_* kernels,
// CUTLASS's conv2d fprop templates) also come with narrow-N tiles, *_tilesize128x32x64 and
// *_tilesize64x32x64, which its heuristics pick for layers of 16-32 output channels (DLA's and
// HRNet's 16/32-channel branches, MobileNets' narrow projections, RegNet's 24-channel stages)
// instead of padding a 64-wide tile with zeros. Forward only: the data- and weight-gradient
// passes keep kTcTiles (no narrow dgrad / wgrad kernels are known here, and the RTX 3090's timm
// training steps, already predicted 0.93x of measured, got faster still with them). They run at the 64x64 tile's rate: per K step of
// 32 a 128x32 tile loads 10 KB of fp16 operands for 2 x 128 x 32 x 32 FLOP, 40 B/clock of shared
// memory at a full-rate sm_80 SM's 1024 FLOP/clock, a third of its 128 B/clock, so the MMAs,
// not operand traffic, bound them; only the padded N is lost. Not fitted: the RTX 3090's timm
// models (held-out families, blink evaluate) are its check (dla34 at batch 1024, measured
// 213 ms: 304 -> 257 ms predicted with this list and kTcFewChannels).
constexpr TileShape kTcConvTiles[] = {
    {256, 128, 1, 1.00}, {128, 256, 1, 1.00}, {128, 128, 2, 0.95}, {128, 64, 2, 0.85},
    {64, 128, 2, 0.85},  {64, 64, 4, 0.68},   {128, 32, 4, 0.68},  {64, 32, 4, 0.68},
};
// CUDA-core implicit-GEMM tiles of cuDNN's FP32 convolutions (its *_scudnn_128x128 / 128x64 /
// 128x32 and implicit_convolve_sgemm kernels), costed by the same tile model.
constexpr TileShape kSimtTiles[] = {
    {128, 128, 1, 1.00}, {128, 64, 2, 0.97}, {64, 64, 4, 0.88},
    {64, 32, 4, 0.75},   {32, 32, 8, 0.55},
};
// cuBLAS's own SGEMM kernels (FP32 on CUDA cores), listed in torch's (M, N): a kernel named
// <arch>_sgemm_AxB tiles A along cuBLAS's column-major m, which is torch's N (a row-major
// C = A B runs as C^T = B^T A^T), so volta_sgemm_128x32 is a 32x128 tile here. Which kernels
// exist and which cuBLAS picks is read off the Kernel Name column of the public NeuSight rows
// (shared/data/public/neusight-train, PyTorch 2.1 / CUDA 12.1, FP32 with TF32 off):
//  - Pascal (and older) runs maxwell_sgemm_* kernels. nn.Linear (addmm with a bias: cublasLt,
//    features.cpp) ran only maxwell_sgemm_64x64, 128x32 and 32x128 (some with a K split) on
//    the P100 and P4. A plain cublasSgemm keeps the 128x128 and 128x64 kernels too (DeepBench's
//    Pascal GEMMs, below). torch.bmm (cublasGemmStridedBatchedEx) ran maxwell_sgemm_128x64 in
//    99.6% of rows, whatever the size.
//  - Volta and Turing run volta_sgemm_*, Ampere and newer ampere_sgemm_*: one GEMM picks among
//    128x128, 128x64, 64x64, 128x32, 32x128 and the K-sliced 32x32_sliced1x4 / 64x32_sliced1x4
//    kernels (four warps split each CTA's K) on the V100, T4 and A100 alike. Their batched GEMMs
//    differ: the V100 and T4 picked among 128x64 .. 32x128 by shape (128x128 in 1 of 35k rows),
//    the A100 ran ampere_sgemm_128x128 in 99.6% of its 16,661 bmm rows, even for 16x16 matrices.
// Efficiencies: 128x128 .. 64x64 as in the cuDNN list; the skinny 128x32 / 32x128 tiles at 0.85
// and the sliced ones at 0.70 of the 128x128 rate: with the kernel that ran forced, the V100 and
// A100 rows (the unthrottled Volta and Ampere boards) that ran a skinny tile come out within
// ~5% at the median. Chosen instead by held-out MAPE, one GPU out at a time over a grid
// (skinny 0.6-0.95, sliced 0.55-0.85), the other four prefer a skinny 0.6 (which steers plans
// off the skinny tiles rather than costing them) for 0.4-1.3 points less held-out MAPE; Blink
// keeps the kernels' own rate. Planned on each GPU's list (blink.train's
// NeuSight kernel times; the floors re-read), bmm MAPE A100 17.5 -> 8.8%, V100 33.5 -> 15.8,
// P100 11.9 -> 12.3, P4 20.3 (same), all 22.0 -> 18.8; linear V100 11.7 -> 10.2, A100 11.6 ->
// 10.9, P100 27.4 -> 23.9, P4 48.8 -> 45.8, all 25.4 -> 24.0; DeepBench GEMMs (benchmarks/
// accuracy_deepbench.py) V100 15.6 -> 11.6, Pascal boards +-3 (TITAN X 31.9 -> 34.4), all
// 19.9 -> 20.4. The T4 gets worse (bmm 27.4 ->
// 35.3, linear 25.4 -> 26.1, DeepBench 18.7 -> 21.7): its kernels run ~0.65x the boost-clock
// model at every size (a 70 W board), which the larger tiles used to hide.
constexpr TileShape kMaxwellSgemmTiles[] = {
    {128, 128, 1, 1.00}, {64, 128, 2, 0.97}, {64, 64, 4, 0.88},
    {128, 32, 4, 0.85},  {32, 128, 4, 0.85},
};
constexpr TileShape kMaxwellLtTiles[] = {
    {64, 64, 4, 0.88}, {128, 32, 4, 0.85}, {32, 128, 4, 0.85},
};
constexpr TileShape kVoltaSgemmTiles[] = {
    {128, 128, 1, 1.00}, {64, 128, 2, 0.97}, {64, 64, 4, 0.88}, {128, 32, 4, 0.85},
    {32, 128, 4, 0.85},  {32, 32, 4, 0.70},  {32, 64, 2, 0.70},
};
// Strided-batched (aten::bmm): no split-K and no GEMV path (plan_gemm_unit).
constexpr TileShape kMaxwellBatchedTiles[] = {{64, 128, 2, 0.97}};
constexpr TileShape kVoltaBatchedTiles[] = {
    {64, 128, 2, 0.97}, {64, 64, 4, 0.88}, {128, 32, 4, 0.85}, {32, 128, 4, 0.85},
};
constexpr TileShape kAmpereBatchedTiles[] = {{128, 128, 1, 1.00}};

struct TileList {
  const TileShape* tiles;
  size_t count;
};

template <size_t N>
TileList tile_list(const TileShape (&t)[N]) {
  return {t, N};
}

// The candidate tiles for a problem on a GPU of compute capability `cc_major`.
TileList candidate_tiles(const GemmProblem& p, bool tc, int cc_major) {
  if (tc) return p.conv_fprop ? tile_list(kTcConvTiles) : tile_list(kTcTiles);
  if (!p.cublas) return tile_list(kSimtTiles);
  if (p.strided_batched) {
    if (cc_major >= 8) return tile_list(kAmpereBatchedTiles);
    return cc_major >= 7 ? tile_list(kVoltaBatchedTiles) : tile_list(kMaxwellBatchedTiles);
  }
  if (cc_major >= 7) return tile_list(kVoltaSgemmTiles);
  return p.cublaslt_epilogue ? tile_list(kMaxwellLtTiles) : tile_list(kMaxwellSgemmTiles);
}

bool tensor_core_mode(MathMode m) {
  return m == MathMode::kTf32 || m == MathMode::kBf16Tc || m == MathMode::kFp16Tc ||
         m == MathMode::kFp8Tc;
}

double ceil_div(double a, double b) { return std::ceil(a / b); }

// Bytes per operand element the tensor-core main loop reads from shared memory.
double tc_operand_bytes(MathMode m) {
  if (m == MathMode::kTf32) return 4.0;
  return m == MathMode::kFp8Tc ? 1.0 : 2.0;
}

// How much less of the tile table's shared-memory bound (first) and of the base efficiency's
// fixed losses (second) a tensor-core main loop pays on this board (kernel_plan.h,
// kTcTileReferenceDemand): each >= 1, and 1 where the constants apply as they are.
struct TcRelief {
  double tile = 1.0, base = 1.0;
};
TcRelief tc_relief(MathMode m, double flop_per_sm_clock, const GpuSpec& g) {
  TcRelief r;
  if (!mma_sync_arch(g.cc_major) || !(flop_per_sm_clock > 0)) return r;
  const double demand = flop_per_sm_clock * tc_operand_bytes(m);
  r.tile = std::max(1.0, kTcTileReferenceDemand / demand);
  r.base = std::max(1.0, tc_full_rate_flop_per_sm_clock(g.cc_major, g.cc_minor) * 2.0 / demand);
  return r;
}

// Bytes of a K split's fp32 partial sums: each of the `split` slices writes an output-sized
// partial and the reduce reads them back (cuBLAS's splitKreduce_kernel, or the small-N
// kernels' own reduce).
double split_k_partial_bytes(double split, double m, double n, double batch) {
  return 2.0 * split * m * n * batch * 4.0;
}

// Bytes per element of the tile the epilogue stores: the output dtype (fp32 accumulators are
// converted before the store).
double out_bytes(int dtype) {
  try {
    return static_cast<double>(dtype_itemsize(dtype));
  } catch (const Error&) {
    return 4.0;
  }
}

}  // namespace

GemmPlan plan_gemm(const GemmProblem& p, const GpuSpec& g) {
  GemmPlan best;
  const double m = std::max(1.0, p.m), n = std::max(1.0, p.n), k = std::max(1.0, p.k);
  const double batch = std::max(1.0, p.batch);
  const double sms = std::max(1, g.sm_count);
  const double clock = g.clock_hz > 0 ? g.clock_hz : 1.5e9;
  const bool tc = tensor_core_mode(p.mode);
  // Plans are costed at boost; analytic_time_s applies the board's sustained clock
  // (sustained_time_s) to the chosen plan's time.
  const double peak = peak_flops_for(p.mode, p.dtype, g);
  if (!(peak > 0)) return best;

  if (std::min(m, n) <= static_cast<double>(p.gemv_max_dim)) {
    // GEMV / small-N: CUDA-core dot products, bound by reading the big operand.
    best.gemv = true;
    best.compute_s = 2.0 * m * n * k * batch /
                     (peak_flops_for(MathMode::kFp32Simt, 6, g) * kGemvComputeEfficiency);
    best.tile_m = std::min<int64_t>(static_cast<int64_t>(m), p.gemv_max_dim);
    best.tile_n = std::min<int64_t>(static_cast<int64_t>(n), p.gemv_max_dim);
    // One CTA per 32 output rows streams its slice of the big operand. When the output is too
    // small to give every SM a CTA but K is long (a weight gradient of a few-feature layer: an
    // (n, K) x (K, n) product over every token, CaiT's talking-heads projections), cuBLAS splits
    // the reduction across CTAs (split-K GEMV / small-N kernels with a reduce of the few
    // partial sums) rather than leave one SM to read the whole operand.
    const double row_ctas = std::max(1.0, ceil_div(std::max(m, n) * batch, 32.0));
    double split = 1.0;
    if (row_ctas < sms && k > kGemvSplitMinK) {
      split = std::min(ceil_div(sms, row_ctas), ceil_div(k, kGemvSplitMinK));
    }
    best.ctas = static_cast<int64_t>(row_ctas * split);
    best.split_k = static_cast<int64_t>(split);
    if (split > 1.0) {
      best.aux_bytes = split_k_partial_bytes(split, m, n, batch);
      best.aux_kernels = 1;
    }
    best.ctas_per_sm = 8;
    best.waves = static_cast<int64_t>(ceil_div(static_cast<double>(best.ctas), sms * 8.0));
    return best;
  }

  const double peak_sm_clk = peak / (sms * clock);  // FLOP per clock per SM
  const TcRelief relief = tc ? tc_relief(p.mode, peak_sm_clk, g) : TcRelief{};
  // cuBLASLt's Maxwell-generation *_tn SGEMM tiles (kPascalLtTileRate, kPascalLtPanelExponent).
  const bool pascal_lt_tn = !tc && p.cublas && p.cublaslt_epilogue && g.cc_major < 7;
  // The main loop's fixed losses, the base efficiency's and an implicit-GEMM convolution's
  // address math, shrink together under the tensor-core relief (kConvVsGemmEfficiency).
  const double base =
      (tc ? (1.0 - (1.0 - tc_gemm_base_efficiency(g.cc_major)) / relief.base) *
                (1.0 - (1.0 - p.implicit_gemm_efficiency) / relief.base)
          : kSimtGemmBaseEfficiency * g.simt_gemm_rate * p.implicit_gemm_efficiency) *
      p.efficiency_scale * (pascal_lt_tn ? kPascalLtTileRate : 1.0);
  const double ob = out_bytes(p.dtype);
  best.compute_s = std::numeric_limits<double>::infinity();
  const TileList list = candidate_tiles(p, tc, g.cc_major);
  for (size_t t = 0; t < list.count; ++t) {
    const TileShape& ts = list.tiles[t];
    const double c = static_cast<double>(ts.ctas_per_sm);
    const double slots = sms * c;
    const double out_tiles = ceil_div(m, static_cast<double>(ts.m)) *
                             ceil_div(n, static_cast<double>(ts.n)) * batch;
    // Clocks one K step of this tile takes alone on an SM, and the CTA's fixed prologue +
    // epilogue clocks (latency: overlapped with the other resident CTAs' math).
    const double clk_per_k = 2.0 * static_cast<double>(ts.m * ts.n) / peak_sm_clk;
    const double fixed_clk =
        kCtaPrologueClocks + static_cast<double>(ts.m * ts.n) * ob / kEpilogueBytesPerClock / c;
    const double eff = base * std::min(1.0, ts.efficiency * relief.tile);
    int max_split = static_cast<int>(std::min<double>(
        p.max_split, std::max(1.0, std::floor(k / kSplitKMinK))));
    // cuBLAS splits K only for a grid of output tiles too small for the GPU (kernel_plan.h).
    if (p.cublas && out_tiles > split_k_max_tiles_per_sm(g.cc_major) * sms) max_split = 1;
    for (int split = 1; split <= max_split; split = split < 4 ? split + 1 : split * 2) {
      // Every allowed split is tried: one pays off when it fills idle SMs (its partial-sum
      // traffic and reduce kernel are charged below, so a full GPU keeps split = 1).
      const double ks = std::ceil(k / split);
      const double ctas = out_tiles * split;
      // cuBLASLt's Maxwell-generation SGEMM tiles once their panels outgrow the L2
      // (kPascalLtPanelExponent).
      double panel_slowdown = 1.0;
      if (pascal_lt_tn && g.l2_bytes > 0) {
        const double panel = static_cast<double>(ts.m + ts.n) * ks * ob;
        panel_slowdown = std::pow(std::max(1.0, panel / g.l2_bytes), kPascalLtPanelExponent);
      }
      // A wave with j of the c designed CTAs per SM: each shares the SM j ways, and the SM
      // reaches sqrt(j / c) of its rate (fewer warps to hide latency), so a partial last wave
      // costs less than a full one but more than its share of the work.
      auto wave_s = [&](double j) {
        return (ks * clk_per_k * panel_slowdown * j / std::sqrt(j / c) + fixed_clk) /
               (clock * eff);
      };
      const double full = std::floor(ctas / slots);
      const double rest = ctas - full * slots;
      const double waves = full + (rest > 0 ? 1.0 : 0.0);
      const double tile_s = wave_s(c);
      double time = full * tile_s + (rest > 0 ? wave_s(std::min(c, std::ceil(rest / sms))) : 0.0);
      bool stream_k = false;
      if (g.cc_major >= 9 && split == 1) {
        // Stream-K: the tiles' K iterations spread evenly over all slots, no partial wave.
        const double sk = std::max(tile_s, ctas * tile_s / slots) / kStreamKEfficiency;
        if (sk < time) {
          time = sk;
          stream_k = true;
        }
      }
      double aux_bytes = 0.0;
      if (split > 1) {
        // cuBLAS's split-K: the partials and the reduce kernel that writes the output.
        aux_bytes = split_k_partial_bytes(split, m, n, batch);
        time += aux_bytes / (g.mem_bw * g.dram_efficiency);
      }
      if (time < best.compute_s) {
        best.compute_s = time;
        best.tile_m = ts.m;
        best.tile_n = ts.n;
        best.split_k = split;
        best.ctas = static_cast<int64_t>(ctas);
        best.ctas_per_sm = ts.ctas_per_sm;
        best.waves = stream_k ? static_cast<int64_t>(std::ceil(ctas / slots))
                              : static_cast<int64_t>(waves);
        best.stream_k = stream_k;
        best.aux_bytes = aux_bytes;
        best.aux_kernels = split > 1 ? 1 : 0;
      }
    }
  }
  // The split-K reduce was costed inside compute_s above; report its traffic only.
  if (best.aux_bytes > 0) best.compute_s -= best.aux_bytes / (g.mem_bw * g.dram_efficiency);
  return best;
}

void set_launch_shape(UnitFeatures& f, const GemmPlan& plan) {
  f.tile_m = plan.tile_m;
  f.tile_n = plan.tile_n;
  f.split_k = plan.split_k;
  f.tiles = plan.ctas;
  f.blocks_per_sm = plan.ctas_per_sm;
  f.waves = plan.waves;
  f.parallelism = static_cast<double>(plan.ctas) * 256.0;  // 256-thread CTAs
}

void plan_gemm_unit(UnitFeatures& f, const GpuSpec& g) {
  GemmProblem p;
  p.m = static_cast<double>(f.m);
  p.n = static_cast<double>(f.n);
  p.k = static_cast<double>(f.k);
  p.batch = static_cast<double>(std::max<int64_t>(f.batch, 1));
  p.mode = f.math_mode;
  p.dtype = f.dtype;
  if (p.batch > 1.0) {
    // aten::bmm / baddbmm run at::cuda::blas::bgemm -> cublasGemmStridedBatchedEx
    // (aten/src/ATen/cuda/CUDABlas.cpp): one tiled GEMM kernel over the batch, with no split-K
    // and no GEMV / small-N kernel for a skinny M or N, so each batch entry pays whole tiles.
    // The public NeuSight bmm rows on all five GPUs show it: the shapes that the
    // single-GEMM plans give a K split or a GEMV run 2.1x and 4.4x slower than those plans.
    p.max_split = 1;
    p.gemv_max_dim = 0;
    p.strided_batched = true;
  }
  p.cublas = true;
  p.cublaslt_epilogue = f.cublaslt_epilogue;
  if (f.cublaslt_epilogue) {
    // cublasLtMatmul has no GEMV / small-N kernels: an nn.Linear of 1-8 output features runs
    // a tiled GEMM (with a K split and splitKreduce_kernel). The public NeuSight linear rows
    // show it on all five GPUs (their Kernels column: maxwell / volta / ampere_sgemm_* tiles,
    // never gemv), where the GEMV plan put them 1.5-7x too fast.
    p.gemv_max_dim = 0;
  }
  if (f.m <= 0 || f.n <= 0 || f.k <= 0) return;
  if (f.math_mode == MathMode::kOther) p.mode = MathMode::kFp32Simt;  // FP64 / integer GEMMs
  const GemmPlan plan = plan_gemm(p, g);
  // groups > 1: the same GEMM `groups` times, one cuBLAS call each (_grouped_mm's fallback loop,
  // features.cpp f_grouped_mm).
  const double loops = f.kind == UnitKind::kGemm ? static_cast<double>(std::max<int64_t>(f.groups, 1))
                                                 : 1.0;
  double compute = plan.compute_s * loops;
  if (f.math_mode == MathMode::kOther && f.flops > 0) {
    // Double precision: the FP64 rate, not the FP32 plan.
    compute *= peak_flops_for(MathMode::kFp32Simt, 6, g) /
               std::max(1.0, peak_flops_for(MathMode::kOther, f.dtype, g));
  }
  if (!plan.gemv && g.cc_major < 9) {
    // A tiled kernel moves its operands and output at kGemmDramEfficiency of DRAM at best; that
    // part of its time follows the memory clock (analytic_time_s).
    const double dram = (f.bytes_read + f.bytes_written) / (g.mem_bw * kGemmDramEfficiency);
    if (dram > compute) {
      compute = dram;
      f.kernel_dram_bound_s = dram;
    }
  }
  f.kernel_compute_s = compute;
  set_launch_shape(f, plan);
  f.aux_bytes += plan.aux_bytes * loops;
  f.kernels += plan.aux_kernels * static_cast<int64_t>(loops);
  // GEMV / small-N kernels do their dot products on CUDA cores: say so.
  if (plan.gemv && f.math_mode != MathMode::kOther) f.math_mode = MathMode::kFp32Simt;
}

}  // namespace blink
