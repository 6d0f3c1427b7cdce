// Time of one cuDNN RNN call (UnitKind::kRnn). The unit's features come from f_cudnn_rnn in
// features.cpp; see features.h for the fields it fills.
//
// cuDNN's standard RNN algorithm (cudnnRNNForward / cudnnRNNBackwardData / BackwardWeights, as
// PyTorch's cudnn/RNN.cpp calls them; the structure is NVIDIA's "Optimizing Recurrent Neural
// Networks in cuDNN 5"):
//   * per layer and direction, one GEMM projects the inputs of all T timesteps at once;
//   * then T dependent steps, each a small recurrent GEMM (mini-batch x K @ K x gates*hidden)
//     and one fused gate kernel. The two directions of a layer run concurrently (a batched
//     GEMM of 2), and layer l+1's step t can run beside layer l's step t+1: with L layers the
//     critical path is T + L - 1 steps while one step leaves most of the GPU idle, T * L steps
//     once a single step fills it;
//   * backward data mirrors this in reverse (a gate-gradient kernel and the GEMM through W_hh
//     per step, one input-gradient GEMM per layer); backward weights is two GEMMs over all
//     timesteps per layer and direction (dW_ih, dW_hh) and a bias reduction.
// Every GEMM and pointwise kernel is costed with the same analytic model as a standalone GEMM /
// element-wise unit (analytic_time_s), so at small batch each step is as latency- and
// occupancy-bound as a small GEMM launch is.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "blink/features.h"
#include "blink/kernel_plan.h"
#include "blink/roofline.h"

namespace blink {
namespace {

struct Rnn {
  double steps, mini, gates_n, k, layers, dirs, input, hidden, itemsize;
  bool weight_grads;
};

UnitFeatures gemm_unit(const UnitFeatures& p, double m, double n, double k, double batch,
                       double itemsize) {
  UnitFeatures u;
  u.kind = UnitKind::kGemm;
  u.m = static_cast<int64_t>(m);
  u.n = static_cast<int64_t>(n);
  u.k = static_cast<int64_t>(k);
  u.batch = static_cast<int64_t>(batch);
  u.flops = 2.0 * m * n * k * batch;
  u.bytes_read = (m * k + k * n) * batch * itemsize;
  u.bytes_written = m * n * batch * itemsize;
  u.dtype = p.dtype;
  u.math_mode = p.math_mode;
  u.kernels = 1;
  return u;
}

UnitFeatures pointwise_unit(const UnitFeatures& p, double read_elems, double written_elems,
                            double flops, double itemsize) {
  UnitFeatures u;
  u.kind = UnitKind::kElementwise;
  u.bytes_read = read_elems * itemsize;
  u.bytes_written = written_elems * itemsize;
  u.flops = flops;
  u.dtype = p.dtype;
  u.math_mode = MathMode::kFp32Simt;  // gate math runs in FP32 registers
  u.kernels = 1;
  u.tiles = static_cast<int64_t>(std::ceil(std::max(read_elems, written_elems) / 512.0));
  return u;
}

// One timestep's recurrent GEMM (mini-batch rows @ the K x N weight, both directions at once).
// cuDNN runs these skinny GEMMs with kernels sized to the few rows (no 128-row tile padding):
// compute at the GEMM efficiency of the math mode, and the weights read every step, from L2
// when all of them fit there (each step reads the same weights), else from DRAM.
double step_gemm_s(const UnitFeatures& p, const GpuSpec& g, double m, double n, double k,
                   double dirs, double itemsize) {
  const bool tc = p.math_mode == MathMode::kTf32 || p.math_mode == MathMode::kBf16Tc ||
                  p.math_mode == MathMode::kFp16Tc;
  const double peak = peak_flops_for(p.math_mode, p.dtype, g);
  const double eff = tc ? tc_gemm_base_efficiency(g.cc_major) : kSimtGemmBaseEfficiency;
  const double compute = peak > 0 ? 2.0 * m * n * k * dirs / (peak * eff) : 0.0;
  const double weights = k * n * dirs * itemsize;
  const double activations = (m * k + m * n) * dirs * itemsize;
  const double dram = (weights <= 0.5 * g.l2_bytes ? 0.0 : weights) + activations;
  const double memory = kDramLatencyS + dram / (g.mem_bw * g.dram_efficiency);
  return std::max(kLaunchFloorS, std::max(compute, memory));
}

// CTAs one step's recurrent GEMM launches (128 x 128 output tiles): how much of the GPU it uses.
double step_ctas(const Rnn& r) {
  return std::ceil(r.mini / 128.0) * std::ceil(r.gates_n / 128.0) * r.dirs;
}

}  // namespace

double rnn_time_s(const UnitFeatures& f, const GpuSpec& g) {
  Rnn r;
  r.steps = std::max<double>(1.0, static_cast<double>(f.outer));
  r.mini = std::max<double>(1.0, static_cast<double>(f.m));
  r.gates_n = std::max<double>(1.0, static_cast<double>(f.n));
  r.k = std::max<double>(1.0, static_cast<double>(f.k));
  r.dirs = std::max<double>(1.0, static_cast<double>(f.groups));
  r.layers = std::max(1.0, static_cast<double>(f.batch) / r.dirs);
  r.input = std::max<double>(1.0, static_cast<double>(f.inner));
  r.hidden = std::max<double>(1.0, static_cast<double>(f.conv_c));
  r.itemsize = static_cast<double>(dtype_itemsize(f.dtype));
  r.weight_grads = f.conv_r != 0;
  const double rows = r.steps * r.mini, s = r.itemsize, h = r.hidden;
  const bool proj = r.k != r.hidden;

  // Per-step kernels, both directions at once.
  double step = 0.0;
  if (!f.backward) {
    step += step_gemm_s(f, g, r.mini, r.gates_n, r.k, r.dirs, s);
    // Gate kernel: reads the input-projected and recurrent gate pre-activations and c,
    // writes h and c (and, in training, the activations into the reserve space).
    step += analytic_time_s(pointwise_unit(f, r.dirs * r.mini * (2.0 * r.gates_n + h),
                                           r.dirs * r.mini * (r.gates_n + 2.0 * h),
                                           8.0 * r.dirs * r.mini * r.gates_n, s), g);
    if (proj) step += step_gemm_s(f, g, r.mini, r.k, h, r.dirs, s);
  } else {
    step += analytic_time_s(pointwise_unit(f, r.dirs * r.mini * (2.0 * r.gates_n + 2.0 * h),
                                           r.dirs * r.mini * (r.gates_n + h),
                                           10.0 * r.dirs * r.mini * r.gates_n, s), g);
    step += step_gemm_s(f, g, r.mini, r.k, r.gates_n, r.dirs, s);
    if (proj) step += step_gemm_s(f, g, r.mini, h, r.k, r.dirs, s);
  }
  const double slots = static_cast<double>(std::max(g.sm_count, 1));
  const double fill = std::min(1.0, step_ctas(r) / slots);
  const double steps_on_path = std::max(r.steps + r.layers - 1.0, r.steps * r.layers * fill);
  double total = steps_on_path * step;

  // Whole-sequence GEMMs, per layer and direction.
  for (int l = 0; l < static_cast<int>(r.layers); ++l) {
    const double in_l = l == 0 ? r.input : r.k * r.dirs;
    if (!f.backward) {
      total += r.dirs * analytic_time_s(gemm_unit(f, rows, r.gates_n, in_l, 1.0, s), g);
    } else {
      total += r.dirs * analytic_time_s(gemm_unit(f, rows, in_l, r.gates_n, 1.0, s), g);  // dx
      if (r.weight_grads) {
        total += r.dirs * analytic_time_s(gemm_unit(f, r.gates_n, in_l, rows, 1.0, s), g);
        total += r.dirs * analytic_time_s(gemm_unit(f, r.gates_n, r.k, rows, 1.0, s), g);
        total += r.dirs * analytic_time_s(pointwise_unit(f, rows * r.gates_n, r.gates_n,
                                                         rows * r.gates_n, s), g);
      }
    }
  }
  return total;
}

}  // namespace blink
