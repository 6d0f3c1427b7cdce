#pragma once
// The cut, cost and simulate stages over one trace: which ops are CUDA kernels (units), what
// each costs on the target GPU, the eager CPU/GPU timeline, and the caching-allocator replay
// of the storages a CUDA run would allocate. Torch-free: reads only trace_types.h records.
#include <cstdint>
#include <string>
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
  double host_s = 0.0;      // dispatch time on the CPU
  double gpu_s = 0.0;       // its units' kernel time, back to back on one stream
  double roofline_s = 0.0;  // the same with roofline unit times
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

TraceCost cost_trace(const TraceData& trace, int device_type, const GpuSpec& gpu,
                     const FeatureOptions& opts);

struct MemoryOptions {
  AllocSimOptions sim;
  int64_t workspace_bytes = 0;  // cuBLAS workspace, allocated at the first GEMM-like unit
};

struct MemoryResult {
  AllocSimStats stats;
  int64_t resident_bytes = 0;     // storages that existed before the run (weights, inputs)
  int64_t temporaries_dropped = 0;  // meta-only scratch inside one kernel op, not charged
  int64_t events = 0;               // alloc/free events replayed
};

// Replays the trace's storage events through the caching-allocator simulator: resident
// storages on `device_type` first, then every allocation and free in program order, except
// storages allocated and freed inside the same kernel op (a meta decomposition's scratch,
// which the CUDA kernel does not allocate).
MemoryResult simulate_trace_memory(const TraceData& trace, int device_type,
                                   const MemoryOptions& opts);

}  // namespace blink
