#include "blink/cost_model.h"

#include <algorithm>
#include <utility>
#include <tuple>
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

// Module paths are dotted ("layer1.0.conv1"); the root module is "". Components of a path, the
// root counted as the first.
std::vector<std::string> module_parts(const TraceData& t, int32_t module) {
  std::vector<std::string> parts;
  if (module < 0) return parts;
  const std::string& path = t.modules[static_cast<size_t>(module)];
  parts.push_back("");
  size_t start = 0;
  while (!path.empty() && start <= path.size()) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// Module hooks between two forward ops: (modules entered, modules left), from their paths.
std::pair<int, int> module_moves(const std::vector<std::string>& prev,
                                 const std::vector<std::string>& cur) {
  size_t common = 0;
  while (common < prev.size() && common < cur.size() && prev[common] == cur[common]) ++common;
  return {static_cast<int>(cur.size() - common), static_cast<int>(prev.size() - common)};
}

bool is_unit_by_rule(const std::string& name) {
  const auto& names = unit_rule_ops();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Steady-state L2 residency: the bytes of the storages each unit writes, stamped with a
// running count of bytes written so far. A later unit's input whose storage was written at most
// kL2ResidentFraction * L2 bytes ago (its own size included) is still in L2.
class L2Window {
 public:
  explicit L2Window(double l2_bytes) : capacity_(l2_bytes * kL2ResidentFraction) {}

  double hits(const OpRecord& op) const {
    if (capacity_ <= 0) return 0.0;
    double hit = 0.0;
    std::unordered_set<int64_t> seen;
    for (const Arg& a : op.inputs) {
      for (const TensorInfo& t : a.tensors) {
        if (t.storage <= 0 || !seen.insert(t.storage).second) continue;
        auto it = written_.find(t.storage);
        if (it == written_.end()) continue;
        const double size = it->second.second;
        if (clock_ - it->second.first + size <= capacity_) hit += std::min(size, bytes_of(t));
      }
    }
    return hit;
  }

  void wrote(const OpRecord& op) {
    for (const Arg& a : op.outputs) {
      for (const TensorInfo& t : a.tensors) {
        if (t.storage <= 0) continue;
        const double b = bytes_of(t);
        clock_ += b;
        written_[t.storage] = {clock_, b};
      }
    }
  }

 private:
  static double bytes_of(const TensorInfo& t) {
    double n = 1.0;
    for (int64_t s : t.sizes) n *= static_cast<double>(std::max<int64_t>(s, 0));
    int64_t item = 4;
    try {
      item = dtype_itemsize(t.dtype);
    } catch (const Error&) {
    }
    return n * static_cast<double>(item);
  }

  double capacity_;
  double clock_ = 0.0;
  std::unordered_map<int64_t, std::pair<double, double>> written_;
};

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

TraceCost cost_trace(const TraceData& trace, int device_type, const GpuSpec& spec,
                     const FeatureOptions& opts, const HostOptions& host_opts) {
  TraceCost out;
  // A whole step in a loop keeps the GPU busy: no boost window, dense math at the sustained
  // ratio throughout (GpuSpec::boost_window_s).
  GpuSpec gpu = spec;
  gpu.boost_window_s = 0.0;
  const std::vector<int64_t> unit_ids = cut_units(trace, device_type);
  std::vector<int64_t> unit_of(trace.ops.size(), -1);
  out.units.reserve(unit_ids.size());
  L2Window l2(gpu.l2_bytes);
  for (int64_t id : unit_ids) {
    const OpRecord& op = trace.ops[static_cast<size_t>(id)];
    UnitCost u;
    u.op = id;
    try {
      u.features = compute_features(op_full_name(trace, op), op.inputs, op.outputs, gpu, opts);
      u.features.l2_hit_bytes = std::min(l2.hits(op), u.features.bytes_read);
      l2.wrote(op);
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
  bool measured = host_opts.mode == HostTimeMode::kMeasured && !trace.ops.empty();
  const bool wall = host_opts.wall_clock;
  auto start_of = [wall](const OpRecord& op) { return wall ? op.t_start_ns : op.cpu_start_ns; };
  auto end_of = [wall](const OpRecord& op) { return wall ? op.t_end_ns : op.cpu_end_ns; };
  for (const OpRecord& op : trace.ops) {
    if (start_of(op) < 0 || end_of(op) < start_of(op)) measured = false;
  }
  // Per thread: when its last issue ended (ns), and the module path of its last forward issue.
  std::unordered_map<int32_t, int64_t> thread_end;
  std::vector<std::string> prev_forward_module;
  bool have_prev_forward = false;
  std::vector<int64_t> issue_of(trace.ops.size(), -1);
  for (const OpRecord& op : trace.ops) {
    const size_t i = static_cast<size_t>(op.id);
    if (op.parent >= 0 && issue_of[static_cast<size_t>(op.parent)] >= 0) {
      issue_of[i] = issue_of[static_cast<size_t>(op.parent)];
    } else if (is_issue(trace, op) || unit_of[i] >= 0) {
      IssueCost issue;
      issue.op = op.id;
      issue.dispatch_s = cuda_dispatch_time_s(op_full_name(trace, op));
      int entered = 0, left = 0;
      if (op.phase == Phase::kForward) {
        std::vector<std::string> parts = module_parts(trace, op.module);
        if (have_prev_forward) std::tie(entered, left) = module_moves(prev_forward_module, parts);
        prev_forward_module = std::move(parts);
        have_prev_forward = true;
      }
      if (measured) {
        // The first issue of a thread has no previous op to measure from: the tracer's own
        // start-up precedes it, not the model's work.
        auto it = thread_end.find(op.thread);
        if (it != thread_end.end()) {
          const double gap_s = static_cast<double>(start_of(op) - it->second) * 1e-9;
          const double ours =
              host_opts.tracer_gap_overhead_s + host_opts.module_hook_s * (entered + left) +
              (op.phase == Phase::kForward ? host_opts.forward_mode_overhead_s : 0.0);
          issue.caller_s = std::max(0.0, gap_s - ours);
        }
        int64_t& end = thread_end[op.thread];
        end = std::max(end, end_of(op));
      } else {
        issue.caller_s = kHostPythonCallS + kHostModuleCallS * entered;
      }
      issue.host_s = issue.caller_s + issue.dispatch_s;
      issue_of[i] = static_cast<int64_t>(out.issues.size());
      out.issues.push_back(issue);
    }
    if (unit_of[i] >= 0 && issue_of[i] >= 0) {
      const UnitCost& u = out.units[static_cast<size_t>(unit_of[i])];
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
  // Records the first failed malloc; the caller stops replaying (the real run raised there).
  auto failed = [&](int64_t op, int64_t bytes, bool resident) {
    out.oom = true;
    out.oom_op = op;
    out.oom_request_bytes = bytes;
    out.oom_resident = resident;
    out.stats = sim.stats();
    return out;
  };
  for (const ExternalStorage& e : trace.externals) {
    if (e.device_type != device_type || e.nbytes <= 0) continue;
    out.resident_bytes += e.nbytes;
    if (!sim.malloc(next_resident--, e.nbytes)) return failed(-1, e.nbytes, true);
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
      if (!sim.malloc(workspace_id, opts.workspace_bytes)) {
        return failed(-1, opts.workspace_bytes, false);
      }
      workspace_done = true;
    }
    if (scratch.count(a.storage)) continue;
    if (a.is_free) {
      sim.free(a.storage);
    } else if (!sim.malloc(a.storage, a.nbytes)) {
      ++out.events;
      return failed(a.op, a.nbytes, false);
    }
    ++out.events;
  }
  out.stats = sim.stats();
  return out;
}

}  // namespace blink
