#include "blink/cost_model.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "blink/error.h"
#include "blink/roofline.h"

namespace blink {
namespace {

bool touches_device(const OpRecord& op, int device_type) {
  auto check = [device_type](const std::vector<Arg>& args) {
    for (const Arg& a : args) {
      for (const TensorInfo& t : a.tensors) {
        if (t.device_type == device_type) return true;
      }
    }
    return false;
  };
  return check(op.inputs) || check(op.outputs);
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Ops called by user code or by an autograd node: aten ops whose parent is not an aten op.
bool is_issue(const TraceData& t, const OpRecord& op) {
  const std::string& name = t.names[static_cast<size_t>(op.name)];
  if (!starts_with(name, "aten::")) return false;
  if (op.parent < 0) return true;
  const std::string& parent = t.names[static_cast<size_t>(t.ops[static_cast<size_t>(op.parent)].name)];
  return !(starts_with(parent, "aten::") || starts_with(parent, "prims::"));
}

bool is_unit_by_rule(const std::string& name) {
  const auto& names = unit_rule_ops();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::string op_full_name(const TraceData& t, const OpRecord& op) {
  std::string name = t.names[static_cast<size_t>(op.name)];
  const std::string& overload = t.names[static_cast<size_t>(op.overload)];
  if (!overload.empty()) name += "." + overload;
  return name;
}

const std::vector<std::string>& unit_rule_ops() {
  // Ops that launch CUDA kernels although the dispatcher gives them (or some of their
  // overloads) no CUDA kernel of their own, so the kernel flag alone would miss them:
  static const std::vector<std::string> names = {
      // on CUDA: convolution -> _convolution -> cudnn_convolution; the meta device answers
      // convolution directly with an empty output, so nothing below it would be a unit.
      "aten::convolution", "aten::_convolution",
      // copy_ (every cast, .contiguous(), clone) runs copy_impl's TensorIterator kernel through
      // a DispatchStub, not a CUDA registration.
      "aten::copy_",
      // The .Scalar overloads are composites over the .Tensor kernel; meta answers some directly.
      "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_",
      "aten::div", "aten::div_",
  };
  return names;
}

std::vector<int64_t> cut_units(const TraceData& trace, int device_type) {
  std::vector<int64_t> units;
  // inside[i]: op i is a unit or below one (ops come parents first).
  std::vector<char> inside(trace.ops.size(), 0);
  for (const OpRecord& op : trace.ops) {
    const size_t i = static_cast<size_t>(op.id);
    if (op.parent >= 0 && inside[static_cast<size_t>(op.parent)]) {
      inside[i] = 1;
      continue;
    }
    if ((op.kernel || is_unit_by_rule(trace.names[static_cast<size_t>(op.name)])) &&
        touches_device(op, device_type)) {
      inside[i] = 1;
      units.push_back(op.id);
    }
  }
  return units;
}

TraceCost cost_trace(const TraceData& trace, int device_type, const GpuSpec& gpu,
                     const FeatureOptions& opts) {
  TraceCost out;
  const std::vector<int64_t> unit_ids = cut_units(trace, device_type);
  std::vector<int64_t> unit_of(trace.ops.size(), -1);
  out.units.reserve(unit_ids.size());
  for (int64_t id : unit_ids) {
    const OpRecord& op = trace.ops[static_cast<size_t>(id)];
    UnitCost u;
    u.op = id;
    try {
      u.features = compute_features(op_full_name(trace, op), op.inputs, op.outputs, gpu, opts);
      u.time_s = analytic_time_s(u.features, gpu);
      u.roofline_s = u.features.kernels > 0 ? u.features.roofline_time_s : 0.0;
    } catch (const Error& e) {
      u.error = e.what();
    }
    unit_of[static_cast<size_t>(id)] = static_cast<int64_t>(out.units.size());
    out.units.push_back(std::move(u));
  }
  // Each issued op owns the units in its subtree; units outside any issue (rare: a kernel op
  // called from a non-aten frame below another) become issues of their own.
  std::vector<int64_t> issue_of(trace.ops.size(), -1);
  for (const OpRecord& op : trace.ops) {
    const size_t i = static_cast<size_t>(op.id);
    if (op.parent >= 0 && issue_of[static_cast<size_t>(op.parent)] >= 0) {
      issue_of[i] = issue_of[static_cast<size_t>(op.parent)];
    } else if (is_issue(trace, op) || unit_of[i] >= 0) {
      IssueCost issue;
      issue.op = op.id;
      issue.host_s = host_dispatch_time_s(op_full_name(trace, op));
      issue_of[i] = static_cast<int64_t>(out.issues.size());
      out.issues.push_back(issue);
    }
    if (unit_of[i] >= 0 && issue_of[i] >= 0) {
      UnitCost& u = out.units[static_cast<size_t>(unit_of[i])];
      u.issue = issue_of[i];
      IssueCost& issue = out.issues[static_cast<size_t>(issue_of[i])];
      issue.gpu_s += u.time_s;
      issue.roofline_s += u.roofline_s;
    }
  }
  std::vector<double> host, gpu_t, roof;
  host.reserve(out.issues.size());
  for (const IssueCost& c : out.issues) {
    host.push_back(c.host_s);
    gpu_t.push_back(c.gpu_s);
    roof.push_back(c.roofline_s);
    out.host_s += c.host_s;
    out.gpu_busy_s += c.gpu_s;
  }
  out.timeline = simulate_eager_timeline(host, gpu_t);
  out.end_to_end_s = timeline_end_to_end_s(out.timeline);
  // The same timeline with every kernel at its roofline: no eager run can be faster than this
  // on this host-time model.
  out.lower_bound_s = timeline_end_to_end_s(simulate_eager_timeline(host, roof));
  return out;
}

MemoryResult simulate_trace_memory(const TraceData& trace, int device_type,
                                   const MemoryOptions& opts) {
  MemoryResult out;
  CachingAllocatorSim sim(opts.sim);
  // Storage ids for the simulator: resident ones are negative in the trace; keep them apart.
  int64_t next_resident = -1;
  for (const ExternalStorage& e : trace.externals) {
    if (e.device_type != device_type || e.nbytes <= 0) continue;
    sim.malloc(next_resident--, e.nbytes);
    out.resident_bytes += e.nbytes;
  }
  // Find scratch: allocated and freed under the same kernel op.
  std::unordered_map<int64_t, int64_t> alloc_op;
  std::unordered_set<int64_t> scratch;
  for (const AllocRecord& a : trace.allocs) {
    if (!a.is_free) {
      alloc_op[a.storage] = a.op;
    } else {
      auto it = alloc_op.find(a.storage);
      if (it != alloc_op.end() && it->second >= 0 && it->second == a.op &&
          trace.ops[static_cast<size_t>(a.op)].kernel) {
        scratch.insert(a.storage);
      }
    }
  }
  out.temporaries_dropped = static_cast<int64_t>(scratch.size());
  const int64_t workspace_id = next_resident--;
  bool workspace_done = opts.workspace_bytes <= 0;
  // cuBLAS-backed ops (the feature table's GEMM kind): the workspace is allocated on the
  // handle's first use. Decided once per op name.
  std::vector<int8_t> gemm_name(trace.names.size(), -1);
  auto is_gemm = [&](int64_t op_id) {
    const OpRecord& op = trace.ops[static_cast<size_t>(op_id)];
    int8_t& known = gemm_name[static_cast<size_t>(op.name)];
    if (known < 0) {
      UnitKind kind = UnitKind::kOther;
      known = rule_kind(trace.names[static_cast<size_t>(op.name)], &kind) &&
              kind == UnitKind::kGemm;
    }
    return op.kernel && known == 1;
  };
  for (const AllocRecord& a : trace.allocs) {
    if (!workspace_done && a.op >= 0 && is_gemm(a.op)) {
      sim.malloc(workspace_id, opts.workspace_bytes);
      workspace_done = true;
    }
    if (scratch.count(a.storage)) continue;
    if (a.is_free) {
      sim.free(a.storage);
    } else {
      sim.malloc(a.storage, a.nbytes);
    }
    ++out.events;
  }
  out.stats = sim.stats();
  return out;
}

}  // namespace blink
