#pragma once
// The cut, cost and simulate stages over one trace: which ops are CUDA kernels (units), what
// each costs on the target GPU, the eager CPU/GPU timeline, and the caching-allocator replay
// of the storages a CUDA run would allocate. Torch-free: reads only trace_types.h records.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "blink/alloc_sim.h"
#include "blink/features.h"
#include "blink/timeline.h"
#include "blink/trace_types.h"

namespace blink {

struct UnitCost {
  int64_t op = 0;            // OpRecord id
  UnitFeatures features;
  double time_s = 0.0;       // analytic GPU time
  double roofline_s = 0.0;   // pure roofline (no efficiency model), a lower bound
  std::string error;         // non-empty: features failed (the unit is costed 0 and reported)
  int64_t issue = -1;        // index into TraceCost::issues of the issue that launches it
};

// One entry of the host timeline: an op called by user code or by an autograd node.
struct IssueCost {
  int64_t op = 0;
  double host_s = 0.0;      // CPU time before its kernels are enqueued: caller_s + dispatch_s
  double caller_s = 0.0;    // the caller's own work since the previous issue (Python, module
                            // __call__, the autograd engine): measured or the table's constant
  double dispatch_s = 0.0;  // the op's CUDA-side dispatch (host_dispatch table)
  double gpu_s = 0.0;       // its units' kernel time, back to back on one stream
  double roofline_s = 0.0;  // the same with roofline unit times
  bool syncs = false;       // a unit of it copies a device value to the host (unit_syncs_host)
};

struct TraceCost {
  std::vector<UnitCost> units;
  std::vector<IssueCost> issues;
  std::vector<TimelineEvent> timeline;  // one per issue, same order
  double end_to_end_s = 0.0;
  double lower_bound_s = 0.0;  // timeline with roofline GPU times
  double host_s = 0.0;
  double gpu_busy_s = 0.0;
};

// Units: ops with their own CUDA kernel, outermost in their subtree, touching at least one
// tensor on `device_type` (the meta device of the dry run; CPU-side bookkeeping such as an
// optimizer's step counters is not a GPU kernel).
std::vector<int64_t> cut_units(const TraceData& trace, int device_type);

// "aten::add.Tensor": the op's name with its overload, as features and host tables key it.
std::string op_full_name(const TraceData& t, const OpRecord& op);

// The op names the cut counts as units besides those with a CUDA kernel (by name, any
// overload); blink._cupti's observer uses the same list on the GPU.
const std::vector<std::string>& unit_rule_ops();

// Where an issue's host time comes from.
//  kTable: deterministic: kHostPythonCallS per issue + kHostModuleCallS per module entered in
//          the forward pass + the op's CUDA-side dispatch (cuda_dispatch_time_s).
//  kMeasured: the time the dry run spent in the caller between the previous issue's end and
//          this issue's start (OpRecord timestamps: the thread's CPU time, or with wall_clock
//          the steady clock, which also counts sleeps, waits and preemption), less what the
//          tracer itself adds there, + the op's CUDA-side dispatch. Traces without timestamps
//          fall back to kTable.
enum class HostTimeMode { kTable = 0, kMeasured = 1 };

struct HostOptions {
  HostTimeMode mode = HostTimeMode::kTable;
  bool wall_clock = false;
  // Calibrated by blink (blink/hosttime.py): what the full recording adds to one gap between
  // ops over a timestamp-only observer, and what one of blink's module hooks (pre or post)
  // costs. Subtracted from each measured gap (never below 0).
  double tracer_gap_overhead_s = 0.0;
  double module_hook_s = 0.0;
  // A Python dispatch mode the dry run runs in the forward pass that a GPU run does not
  // (blink.autocast's TorchFunctionMode for amp-* dtypes): its cost per forward gap.
  double forward_mode_overhead_s = 0.0;
};

TraceCost cost_trace(const TraceData& trace, int device_type, const GpuSpec& gpu,
                     const FeatureOptions& opts, const HostOptions& host = HostOptions());

// Recomputes issues[].gpu_s, the timeline, end_to_end_s, host_s and gpu_busy_s from the units'
// time_s (each unit's issue index as cost_trace set it): cost_trace's own schedule, re-run after
// learned unit times replace analytic ones (learned.cpp).
void retime_trace(TraceCost& cost);

// What a byte of allocated memory holds, for the breakdown at the peak. Resident storages get
// their role from the caller (MemoryOptions::external_roles) or, without one, from use: only
// optimizer-phase ops touch it -> optimizer state, else an input. Storages the run allocates:
// backward-phase ones still live when the backward pass ends are gradients; other forward /
// backward ones are activations (saved tensors and temporaries); optimizer-phase ones live at
// the end are optimizer state (a first step creates it), the rest temporaries.
enum class MemoryCategory : int {
  kWeights = 0,
  kInputs,
  kOptimizerState,
  kGradients,
  kActivations,
  kWorkspace,
  kTemporaries,
};
inline constexpr int kNumMemoryCategories = 7;
const char* memory_category_name(MemoryCategory c);  // "weights", ..., "temporaries"

struct MemoryOptions {
  AllocSimOptions sim;  // sim.capacity_bytes > 0: the device memory the allocator may reserve
  int64_t workspace_bytes = 0;  // cuBLAS workspace, allocated at the first GEMM-like unit
  std::vector<std::pair<int64_t, int>> external_roles;  // resident id -> MemoryCategory code
  int64_t max_curve_points = 0;  // > 0: record allocated/reserved over the run, downsampled
  // Storages the run does not allocate at all (compiled mode: intermediates a fused kernel
  // keeps in registers, CompiledCost::internal_storages).
  std::vector<int64_t> skip_storages;
};

// One point of the memory-over-time curve: the highest allocated value in its stretch of
// events, at the op of that event (-1 outside any op; phase -1 then).
struct MemoryPoint {
  int64_t op = -1;
  int phase = -1;
  int64_t allocated = 0;
  int64_t reserved = 0;
};

struct MemoryResult {
  AllocSimStats stats;
  int64_t resident_bytes = 0;     // storages that existed before the run (weights, inputs)
  int64_t temporaries_dropped = 0;  // meta-only scratch inside one kernel op, not charged
  int64_t events = 0;               // alloc/free events replayed
  // With a capacity: the first allocation that failed after the allocator released its cached
  // segments and retried. A real run raises torch.OutOfMemoryError there, so the replay stops;
  // stats are those at the failure.
  bool oom = false;
  int64_t oom_op = -1;              // OpRecord id of the failing allocation; -1 for resident
                                    // storages (weights, inputs) or the cuBLAS workspace
  int64_t oom_request_bytes = 0;    // the requested size
  bool oom_resident = false;        // failed while placing resident storages
  // Allocated bytes (block sizes, as the simulator counts them) by MemoryCategory at the moment
  // of peak allocated; they sum to stats.peak_allocated_bytes.
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};
  std::vector<MemoryPoint> curve;  // empty unless max_curve_points > 0
};

// Replays the trace's storage events through the caching-allocator simulator: resident
// storages on `device_type` first, then every allocation and free in program order, except
// storages allocated and freed inside the same kernel op (a meta decomposition's scratch,
// which the CUDA kernel does not allocate). With a capacity the replay stops at the first
// out-of-memory (see MemoryResult::oom).
MemoryResult simulate_trace_memory(const TraceData& trace, int device_type,
                                   const MemoryOptions& opts);

// Checks every index and code of a trace that did not come from the tracer (a JSON file): op
// ids in order, parents before children, name / overload / module indices, phase codes, argument
// kinds, tensor ranks, sizes and dtype / device codes, storage events (ids, sizes, op indices,
// alloc/free order) and resident storages. Throws blink::Error naming the record and field, so
// nothing downstream indexes out of range.
void validate_trace(const TraceData& trace);

// ---- compiled mode (torch.compile / Inductor) ------------------------------------------------

// The GPU time of one fused Triton kernel Inductor generates for a chain of pointwise /
// reduction ops: memory-bound, reading the chain's external inputs once and writing its external
// outputs once (intermediates stay in registers), with the DRAM efficiency and latency terms of
// the analytic model; arithmetic at the element-wise CUDA-core rate when it binds.
double fused_kernel_time_s(double bytes, double flops, const GpuSpec& gpu);

// Host cost of launching one kernel from Inductor's generated Python wrapper (a Triton
// launcher call, or an extern kernel such as a cuBLAS GEMM called through its aten op without
// Python argument parsing): ~3-5 us on a server CPU, lower than an eager op's dispatch.
inline constexpr double kCompiledLaunchS = 4.0e-6;

struct CompiledKernel {
  std::vector<int64_t> units;   // indices into TraceCost::units, program order
  bool fused = false;           // a generated pointwise / reduction kernel
  double flops = 0.0;
  double bytes = 0.0;           // external reads + writes (fused), or the unit's own bytes
  double time_s = 0.0;
  double host_s = 0.0;
};

struct CompiledCost {
  std::vector<CompiledKernel> kernels;
  // Storages first written inside a fused kernel and read by no unit outside it: Inductor's
  // kernel keeps them in registers, so a compiled run never allocates them.
  std::vector<int64_t> internal_storages;
  std::vector<TimelineEvent> timeline;  // one per kernel
  double end_to_end_s = 0.0;
  double host_s = 0.0;
  double gpu_busy_s = 0.0;
};

// A first model of the graph Inductor produces from the eager trace: consecutive pointwise,
// reduction, normalisation, softmax, copy, embedding and loss units of the forward / backward
// passes that are connected by dataflow (a unit reads a storage an earlier unit of the chain
// wrote) become one fused kernel; GEMMs, convolutions, attention and other extern kernels stay
// as they are; the optimizer step stays eager (torch.compile(model) does not compile it).
CompiledCost compile_trace(const TraceData& trace, const TraceCost& eager, const GpuSpec& gpu);

}  // namespace blink
