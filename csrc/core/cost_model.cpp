#include "blink/cost_model.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
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

// Units whose CUDA implementation makes the CPU wait until the stream has run everything
// before it: those whose features say so (UnitFeatures::host_sync: nonzero and masked_select
// (cuda/Nonzero.cu), advanced indexing with a boolean mask, _grouped_mm's fallback loop,
// blocking host <-> device copies), and the ops without such a rule that copy a device value to
// the host: .item() (aten/src/ATen/native/cuda/CUDAScalar.cu, _local_scalar_dense_cuda),
// unique's output size (cuda/Unique.cu) and torch.equal's result.
bool unit_syncs_host(const std::string& op_name, const UnitFeatures& f) {
  static const std::unordered_set<std::string> ops = {
      "aten::_local_scalar_dense", "aten::_unique2", "aten::unique_dim",
      "aten::unique_consecutive", "aten::equal"};
  return f.host_sync || ops.count(op_base_name(op_name)) > 0;
}

// Host work of a unit beyond its op's row in the dispatch table: _grouped_mm's fallback issues
// one cuBLAS GEMM per group after its offsets' copy to the host.
double unit_extra_dispatch_s(const UnitFeatures& f) {
  if (f.kind != UnitKind::kGemm || f.groups <= 1) return 0.0;
  return cuda_dispatch_time_s("aten::_local_scalar_dense") +
         static_cast<double>(f.groups) * cuda_dispatch_time_s("aten::mm");
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

// Dense bytes of a tensor (0 for an unknown dtype).
double dense_bytes(const TensorInfo& t) {
  if (t.dtype < 0) return 0.0;
  double n = 1.0;
  for (int64_t v : t.sizes) n *= static_cast<double>(v);
  try {
    return n * static_cast<double>(dtype_itemsize(t.dtype));
  } catch (const Error&) {
    return 0.0;
  }
}

// Autograd's copy of an in-place op's input. The generated VariableType kernel of an in-place
// op whose derivative formula reads `self` (silu_, hardswish_, mul_ with a grad-requiring
// other, ...; gen_variable_type.py saves `self.clone()`) clones self before the in-place
// kernel overwrites it, whenever the op records a backward node: one copy kernel (clone ->
// copy_, Copy.cu) ahead of the op's own. The observer is muted below the unit, so the clone is
// no op of the trace; its buffer is: an allocation inside the unit of self's dense bytes that
// outlives it (meta scratch is freed before the unit ends). Returns, per in-place unit op id
// that has one, the bytes of that clone (cut_units' ids, in trace order).
std::unordered_map<int64_t, double> autograd_self_clones(const TraceData& trace,
                                                         const std::vector<int64_t>& unit_ids) {
  // owner[i]: the in-place unit op i is (or is inside), -1 for any other op; self_bytes: the
  // dense bytes of each such unit's input 0.
  std::vector<int64_t> owner(trace.ops.size(), -1);
  std::unordered_map<int64_t, double> self_bytes;
  size_t next = 0;
  for (const OpRecord& op : trace.ops) {
    const size_t i = static_cast<size_t>(op.id);
    if (next < unit_ids.size() && unit_ids[next] == op.id) {
      ++next;
      const std::string& name = trace.names[static_cast<size_t>(op.name)];
      if (name.empty() || name.back() != '_' || op.inputs.empty() || op.outputs.empty()) continue;
      const Arg& in = op.inputs[0];
      const Arg& out = op.outputs[0];
      if (in.kind != ArgKind::kTensor || out.kind != ArgKind::kTensor || in.tensors.empty() ||
          out.tensors.empty() || in.tensors[0].storage == 0 ||
          out.tensors[0].storage != in.tensors[0].storage) {
        continue;
      }
      const double bytes = dense_bytes(in.tensors[0]);
      if (!(bytes > 0)) continue;
      owner[i] = op.id;
      self_bytes[op.id] = bytes;
    } else if (op.parent >= 0) {
      owner[i] = owner[static_cast<size_t>(op.parent)];
    }
  }
  // Storages (id -> bytes) each in-place unit allocated and had not freed by its end.
  std::unordered_map<int64_t, std::unordered_map<int64_t, int64_t>> live;
  for (const AllocRecord& a : trace.allocs) {
    if (a.op < 0 || static_cast<size_t>(a.op) >= owner.size()) continue;
    const int64_t unit = owner[static_cast<size_t>(a.op)];
    if (unit < 0) continue;
    if (a.is_free) {
      auto it = live.find(unit);
      if (it != live.end()) it->second.erase(a.storage);
    } else {
      live[unit][a.storage] = a.nbytes;
    }
  }
  std::unordered_map<int64_t, double> out;
  for (const auto& [unit, storages] : live) {
    const double bytes = self_bytes.at(unit);
    for (const auto& entry : storages) {
      if (static_cast<double>(entry.second) == bytes) {
        out[unit] = bytes;  // one clone per op
        break;
      }
    }
  }
  return out;
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
      // CompositeExplicitAutograd wrappers of CUDA kernels that the meta device answers with a
      // Python meta function that only allocates (so nothing below them is a kernel), although
      // on CUDA they launch one (issue 9, item 4; tests/test_zero_kernels.py finds them):
      // factories and fills (empty + fill_ / a distribution kernel / a range kernel),
      "aten::zeros", "aten::ones", "aten::full", "aten::new_zeros", "aten::new_ones",
      "aten::new_full", "aten::zeros_like", "aten::ones_like", "aten::full_like",
      "aten::scalar_tensor", "aten::fill", "aten::eye", "aten::arange", "aten::linspace",
      "aten::logspace", "aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like",
      "aten::randint", "aten::randint_like", "aten::randperm", "aten::bernoulli",
      "aten::normal", "aten::uniform", "aten::cauchy", "aten::exponential", "aten::geometric",
      "aten::log_normal",
      // element-wise and reduction ops reached through their .out / .dim kernels,
      "aten::abs", "aten::abs_", "aten::mean", "aten::nan_to_num", "aten::nan_to_num_",
      "aten::frexp", "aten::logical_and", "aten::logical_or", "aten::logical_xor",
      "aten::logical_not",
      // gathers, scatters and copies (embedding -> index_select, repeat -> copy_, ...),
      "aten::embedding", "aten::index_put", "aten::masked_scatter",
      "aten::masked_scatter_backward", "aten::repeat", "aten::pixel_shuffle",
      "aten::pixel_unshuffle", "aten::_trilinear",
      // sorts, selections and scans (sort -> sort.stable, kthvalue -> kthvalue.values, cummax
      // -> _cummax_helper, logcumsumexp -> _logcumsumexp, median.dim -> median.dim_values).
      "aten::sort", "aten::kthvalue", "aten::median", "aten::nanmedian", "aten::cummax",
      "aten::cummin", "aten::logcumsumexp",
      // In-place forms whose CUDA kernel is the .out overload (index_put_ -> _index_put_impl_).
      "aten::index_put_", "aten::logical_and_", "aten::logical_not_", "aten::logical_or_",
      "aten::logical_xor_", "aten::bitwise_and_", "aten::bitwise_or_", "aten::bitwise_xor_",
      "aten::bitwise_left_shift_", "aten::bitwise_right_shift_", "aten::celu_",
      "aten::conj_physical_", "aten::copysign_", "aten::deg2rad_", "aten::rad2deg_",
      "aten::floor_divide_", "aten::fmod_", "aten::remainder_", "aten::ldexp_",
      "aten::mvlgamma_", "aten::xlogy_",
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
  const std::unordered_map<int64_t, double> clones = autograd_self_clones(trace, unit_ids);
  out.units.reserve(unit_ids.size());
  L2Window l2(gpu.l2_bytes);
  for (int64_t id : unit_ids) {
    const OpRecord& op = trace.ops[static_cast<size_t>(id)];
    UnitCost u;
    u.op = id;
    try {
      u.features = compute_features(op_full_name(trace, op), op.inputs, op.outputs, gpu, opts);
      if (auto c = clones.find(id); c != clones.end()) {  // charged as a hidden copy
        u.features.hidden_copy_bytes += 2.0 * c->second;
        u.features.hidden_copies += 1;
        u.features.kernels += 1;
      }
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
      UnitCost& u = out.units[static_cast<size_t>(unit_of[i])];
      u.issue = issue_of[i];
      IssueCost& is = out.issues[static_cast<size_t>(issue_of[i])];
      is.roofline_s += u.roofline_s;
      if (u.error.empty()) {
        const double extra = unit_extra_dispatch_s(u.features);
        is.dispatch_s += extra;
        is.host_s += extra;
        is.syncs = is.syncs || unit_syncs_host(op_full_name(trace, op), u.features);
      }
    }
  }
  retime_trace(out);
  // The same timeline with every kernel at its roofline: no eager run can be faster than this
  // on this host-time model.
  std::vector<double> host, roof;
  std::vector<char> waits;
  host.reserve(out.issues.size());
  roof.reserve(out.issues.size());
  for (const IssueCost& c : out.issues) {
    host.push_back(c.host_s);
    roof.push_back(c.roofline_s);
    waits.push_back(c.syncs ? 1 : 0);
  }
  out.lower_bound_s = timeline_end_to_end_s(simulate_eager_timeline(host, roof, waits));
  return out;
}

void retime_trace(TraceCost& cost) {
  for (IssueCost& is : cost.issues) is.gpu_s = 0.0;
  for (const UnitCost& u : cost.units) {
    if (u.issue >= 0 && static_cast<size_t>(u.issue) < cost.issues.size()) {
      cost.issues[static_cast<size_t>(u.issue)].gpu_s += u.time_s;
    }
  }
  std::vector<double> host, gpu_t;
  std::vector<char> waits;
  host.reserve(cost.issues.size());
  gpu_t.reserve(cost.issues.size());
  cost.host_s = cost.gpu_busy_s = 0.0;
  for (const IssueCost& c : cost.issues) {
    host.push_back(c.host_s);
    gpu_t.push_back(c.gpu_s);
    waits.push_back(c.syncs ? 1 : 0);
    cost.host_s += c.host_s;
    cost.gpu_busy_s += c.gpu_s;
  }
  cost.timeline = simulate_eager_timeline(host, gpu_t, waits);
  cost.end_to_end_s = timeline_end_to_end_s(cost.timeline);
}

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kWeights: return "weights";
    case MemoryCategory::kInputs: return "inputs";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kWorkspace: return "workspace";
    case MemoryCategory::kTemporaries: return "temporaries";
  }
  return "temporaries";
}

MemoryResult simulate_trace_memory(const TraceData& trace, int device_type,
                                   const MemoryOptions& opts) {
  MemoryResult out;
  CachingAllocatorSim sim(opts.sim);
  constexpr int kPhaseOptimizer = static_cast<int>(Phase::kOptimizer);
  auto phase_of = [&](int64_t op) {
    return op >= 0 ? static_cast<int>(trace.ops[static_cast<size_t>(op)].phase) : -1;
  };
  // Which phases touch each resident storage (bit per phase), for roles the caller left out.
  std::unordered_map<int64_t, int> roles(opts.external_roles.begin(), opts.external_roles.end());
  std::unordered_map<int64_t, unsigned> phases_using;
  for (const OpRecord& op : trace.ops) {
    for (const auto* args : {&op.inputs, &op.outputs}) {
      for (const Arg& a : *args) {
        for (const TensorInfo& t : a.tensors) {
          if (t.storage < 0) phases_using[t.storage] |= 1u << static_cast<unsigned>(op.phase);
        }
      }
    }
  }
  // Live allocations: simulator id -> (category, block bytes).
  std::unordered_map<int64_t, std::pair<int, int64_t>> live;
  std::array<int64_t, kNumMemoryCategories> by_cat{};
  auto on_malloc = [&](int64_t sim_id, int64_t nbytes, int cat) {
    if (!sim.malloc(sim_id, nbytes)) return false;  // OOM under a capacity: nothing allocated
    const int64_t block = sim.block_size(sim_id);
    live[sim_id] = {cat, block};
    by_cat[static_cast<size_t>(cat)] += block;
    const AllocSimStats st = sim.stats();
    if (st.allocated_bytes >= st.peak_allocated_bytes) out.peak_by_category = by_cat;
    return true;
  };
  auto on_free = [&](int64_t sim_id) {
    auto it = live.find(sim_id);
    if (it == live.end()) return;  // its malloc failed (OOM): nothing to free
    by_cat[static_cast<size_t>(it->second.first)] -= it->second.second;
    live.erase(it);
    sim.free(sim_id);
  };
  // Storage ids for the simulator: resident ones are negative in the trace; keep them apart.
  int64_t next_resident = -1;
  std::unordered_map<int64_t, int64_t> resident_sim;  // trace id < 0 -> simulator id
  // Records the first failed malloc; the caller stops replaying (the real run raised there).
  auto failed = [&](int64_t op, int64_t bytes, bool resident) {
    out.oom = true;
    out.oom_op = op;
    out.oom_request_bytes = bytes;
    out.oom_resident = resident;
    out.stats = sim.stats();
    if (out.stats.peak_allocated_bytes == 0) out.peak_by_category = by_cat;
    return out;
  };
  for (const ExternalStorage& e : trace.externals) {
    if (e.device_type != device_type || e.nbytes <= 0) continue;
    int cat = static_cast<int>(MemoryCategory::kInputs);
    auto r = roles.find(e.storage);
    if (r != roles.end() && r->second >= 0 && r->second < kNumMemoryCategories) {
      cat = r->second;
    } else {
      auto u = phases_using.find(e.storage);
      if (u != phases_using.end() && u->second == (1u << kPhaseOptimizer)) {
        cat = static_cast<int>(MemoryCategory::kOptimizerState);
      }
    }
    out.resident_bytes += e.nbytes;
    resident_sim[e.storage] = next_resident;
    if (!on_malloc(next_resident--, e.nbytes, cat)) return failed(-1, e.nbytes, true);
  }
  // Find scratch: allocated and freed under the same kernel op. Also where each storage is
  // freed and where the backward pass ends, for the gradient rule.
  std::unordered_map<int64_t, int64_t> alloc_op;
  std::unordered_map<int64_t, size_t> free_at;
  std::unordered_set<int64_t> scratch;
  size_t backward_end = 0;
  for (size_t i = 0; i < trace.allocs.size(); ++i) {
    const AllocRecord& a = trace.allocs[i];
    if (phase_of(a.op) == static_cast<int>(Phase::kBackward)) backward_end = i + 1;
    if (!a.is_free) {
      alloc_op[a.storage] = a.op;
    } else {
      free_at[a.storage] = i;
      auto it = alloc_op.find(a.storage);
      if (it != alloc_op.end() && it->second >= 0 && it->second == a.op &&
          trace.ops[static_cast<size_t>(a.op)].kernel) {
        scratch.insert(a.storage);
      }
    }
  }
  auto category_of = [&](const AllocRecord& a) {
    const int phase = phase_of(a.op);
    auto f = free_at.find(a.storage);
    const size_t freed = f == free_at.end() ? trace.allocs.size() : f->second;
    if (phase == static_cast<int>(Phase::kBackward) && freed >= backward_end) {
      return MemoryCategory::kGradients;
    }
    if (phase == static_cast<int>(Phase::kForward) || phase == static_cast<int>(Phase::kBackward)) {
      return MemoryCategory::kActivations;
    }
    if (phase == kPhaseOptimizer && freed == trace.allocs.size()) {
      return MemoryCategory::kOptimizerState;
    }
    return MemoryCategory::kTemporaries;
  };
  out.temporaries_dropped = static_cast<int64_t>(scratch.size());
  const std::unordered_set<int64_t> skipped(opts.skip_storages.begin(), opts.skip_storages.end());
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
  // Copies an op's CUDA host code makes of inputs not dense in its format (host_copies) live
  // from inside the op to its end, after its outputs exist: each is held and released right
  // after the op's last output allocation (meta ran no such copy, so no record has them).
  std::unordered_map<size_t, int64_t> host_copy_after;  // alloc record index -> bytes
  {
    std::unordered_map<int64_t, size_t> last_out;
    for (size_t i = 0; i < trace.allocs.size(); ++i) {
      const AllocRecord& a = trace.allocs[i];
      if (a.is_free || a.op < 0 || scratch.count(a.storage) || skipped.count(a.storage)) continue;
      last_out[a.op] = i;
    }
    for (const auto& [op_id, at] : last_out) {
      const OpRecord& op = trace.ops[static_cast<size_t>(op_id)];
      if (!op.kernel) continue;
      double bytes = 0.0;
      for (const HostCopy& h : host_copies(trace.names[static_cast<size_t>(op.name)], op.inputs)) {
        bytes += dense_bytes(*h.src);
      }
      if (bytes > 0) host_copy_after[at] = static_cast<int64_t>(bytes);
    }
  }
  // The curve: every event's (allocated, reserved), bucketed afterwards.
  std::vector<MemoryPoint> points;
  const bool want_curve = opts.max_curve_points > 0;
  if (want_curve) points.reserve(trace.allocs.size());
  for (size_t i = 0; i < trace.allocs.size(); ++i) {
    const AllocRecord& a = trace.allocs[i];
    if (!workspace_done && a.op >= 0 && is_gemm(a.op)) {
      if (!on_malloc(workspace_id, opts.workspace_bytes,
                     static_cast<int>(MemoryCategory::kWorkspace))) {
        return failed(-1, opts.workspace_bytes, false);
      }
      workspace_done = true;
    }
    if (scratch.count(a.storage) || skipped.count(a.storage)) continue;
    if (a.is_free && a.storage < 0) {
      // A resident storage the run released (a KV cache layer replaced by a longer one).
      auto r = resident_sim.find(a.storage);
      if (r != resident_sim.end()) on_free(r->second);
    } else if (a.is_free) {
      on_free(a.storage);
    } else if (!on_malloc(a.storage, a.nbytes, static_cast<int>(category_of(a)))) {
      ++out.events;
      return failed(a.op, a.nbytes, false);
    }
    ++out.events;
    if (want_curve) {
      const AllocSimStats st = sim.stats();
      points.push_back(MemoryPoint{a.op, phase_of(a.op), st.allocated_bytes, st.reserved_bytes});
    }
    auto copy = host_copy_after.find(i);
    if (copy != host_copy_after.end()) {
      const int64_t id = next_resident--;
      if (!on_malloc(id, copy->second, static_cast<int>(MemoryCategory::kTemporaries))) {
        return failed(a.op, copy->second, false);
      }
      if (want_curve) {
        const AllocSimStats st = sim.stats();
        points.push_back(MemoryPoint{a.op, phase_of(a.op), st.allocated_bytes, st.reserved_bytes});
      }
      on_free(id);
    }
  }
  out.stats = sim.stats();
  if (out.stats.peak_allocated_bytes == 0) out.peak_by_category = by_cat;
  if (want_curve && !points.empty()) {
    // Each bucket keeps its highest-allocated event (so the peak is always on the curve) and its
    // highest reserved value.
    const size_t n = points.size();
    const size_t buckets = std::min(n, static_cast<size_t>(opts.max_curve_points));
    for (size_t b = 0; b < buckets; ++b) {
      const size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
      MemoryPoint best = points[lo];
      int64_t reserved = 0;
      for (size_t i = lo; i < hi; ++i) {
        if (points[i].allocated > best.allocated) best = points[i];
        reserved = std::max(reserved, points[i].reserved);
      }
      best.reserved = reserved;
      out.curve.push_back(best);
    }
  }
  return out;
}

namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 56;  // 64 PiB: no trace storage is larger
constexpr int64_t kMaxRank = 64;

std::string where(const char* what, size_t i) {
  return std::string("trace ") + what + " " + std::to_string(i);
}

void validate_tensor(const TensorInfo& t, const std::string& at) {
  if (t.dtype < 0) return;  // an undefined entry of a tensor list
  BLINK_CHECK(t.sizes.size() == t.strides.size() &&
                  static_cast<int64_t>(t.sizes.size()) <= kMaxRank,
              at + ": tensor has " + std::to_string(t.sizes.size()) + " sizes and " +
                  std::to_string(t.strides.size()) + " strides (need equal, at most 64)");
  double numel = 1.0;
  for (int64_t v : t.sizes) {
    BLINK_CHECK(v >= 0, at + ": tensor has a negative size " + std::to_string(v));
    numel *= static_cast<double>(v);
  }
  BLINK_CHECK(numel <= static_cast<double>(kMaxBytes),
              at + ": tensor has an impossible element count");
  BLINK_CHECK(t.storage_offset >= 0 && t.storage_nbytes >= 0 && t.storage_nbytes <= kMaxBytes,
              at + ": tensor has a negative storage offset or an impossible storage size");
  BLINK_CHECK(t.dtype < 64, at + ": tensor has unknown dtype code " + std::to_string(t.dtype));
  BLINK_CHECK(t.device_type >= -1 && t.device_type < 64,
              at + ": tensor has unknown device code " + std::to_string(t.device_type));
}

}  // namespace

void validate_trace(const TraceData& trace) {
  const size_t n_names = trace.names.size();
  const int64_t n_modules = static_cast<int64_t>(trace.modules.size());
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const OpRecord& op = trace.ops[i];
    const std::string at = where("op record", i);
    BLINK_CHECK(op.id == static_cast<int64_t>(i), at + ": id " + std::to_string(op.id) +
                                                      " (ids must be 0, 1, 2, ... in order)");
    BLINK_CHECK(op.parent >= -1 && op.parent < op.id,
                at + ": parent " + std::to_string(op.parent) + " is not an earlier op");
    BLINK_CHECK(op.name >= 0 && static_cast<size_t>(op.name) < n_names && op.overload >= 0 &&
                    static_cast<size_t>(op.overload) < n_names,
                at + ": name index out of range (the trace has " + std::to_string(n_names) +
                    " names)");
    BLINK_CHECK(op.module >= -1 && op.module < n_modules,
                at + ": module index " + std::to_string(op.module) + " out of range (the trace has " +
                    std::to_string(n_modules) + " modules)");
    BLINK_CHECK(static_cast<int>(op.phase) <= 2,
                at + ": phase code " + std::to_string(static_cast<int>(op.phase)) +
                    " (0 forward, 1 backward, 2 optimizer)");
    BLINK_CHECK(op.depth >= 0 && op.thread >= 0, at + ": negative depth or thread");
    for (const auto* args : {&op.inputs, &op.outputs}) {
      for (const Arg& a : *args) {
        BLINK_CHECK(static_cast<int>(a.kind) <= static_cast<int>(ArgKind::kOther),
                    at + ": argument kind " + std::to_string(static_cast<int>(a.kind)) +
                        " is unknown");
        BLINK_CHECK(a.kind != ArgKind::kTensor || a.tensors.size() == 1,
                    at + ": a tensor argument without its tensor");
        for (const TensorInfo& t : a.tensors) validate_tensor(t, at);
      }
    }
  }
  std::unordered_set<int64_t> live, seen, resident_ids, resident_freed;
  for (const ExternalStorage& e : trace.externals) resident_ids.insert(e.storage);
  for (size_t i = 0; i < trace.allocs.size(); ++i) {
    const AllocRecord& a = trace.allocs[i];
    const std::string at = where("storage event", i);
    if (a.storage < 0) {
      // The release of a resident storage (tracer register_external(watch)): once, a free.
      BLINK_CHECK(a.is_free && resident_ids.count(a.storage) && resident_freed.insert(a.storage).second,
                  at + ": resident storage " + std::to_string(a.storage) +
                      " must be a known resident id, freed at most once");
      continue;
    }
    BLINK_CHECK(a.storage > 0, at + ": storage id " + std::to_string(a.storage) + " (must be > 0)");
    BLINK_CHECK(a.nbytes >= 0 && a.nbytes <= kMaxBytes,
                at + ": impossible size " + std::to_string(a.nbytes) + " bytes");
    BLINK_CHECK(a.op >= -1 && a.op < static_cast<int64_t>(trace.ops.size()),
                at + ": op index " + std::to_string(a.op) + " out of range");
    BLINK_CHECK(a.thread >= 0, at + ": negative thread");
    if (a.is_free) {
      BLINK_CHECK(live.erase(a.storage) == 1,
                  at + ": frees storage " + std::to_string(a.storage) + ", which is not allocated");
    } else {
      BLINK_CHECK(seen.insert(a.storage).second,
                  at + ": allocates storage " + std::to_string(a.storage) + " a second time");
      live.insert(a.storage);
    }
  }
  std::unordered_set<int64_t> ext;
  for (size_t i = 0; i < trace.externals.size(); ++i) {
    const ExternalStorage& e = trace.externals[i];
    const std::string at = where("resident storage", i);
    BLINK_CHECK(e.storage < 0 && ext.insert(e.storage).second,
                at + ": id " + std::to_string(e.storage) + " (must be < 0 and unique)");
    BLINK_CHECK(e.nbytes >= 0 && e.nbytes <= kMaxBytes, at + ": impossible size");
    BLINK_CHECK(e.device_type >= -1 && e.device_type < 64, at + ": unknown device code");
  }
}

// ---- compiled mode -------------------------------------------------------------------------

double fused_kernel_time_s(double bytes, double flops, const GpuSpec& gpu) {
  BLINK_CHECK(std::isfinite(bytes) && bytes >= 0.0 && std::isfinite(flops) && flops >= 0.0,
              "fused_kernel_time_s: bytes and flops must be finite and >= 0");
  const double memory_s = kDramLatencyS + bytes / (gpu.mem_bw * gpu.dram_efficiency);
  const double compute_s = flops / (gpu.peak_fp32 * kSimtElementwiseEfficiency);
  return std::max({kLaunchFloorS, memory_s, compute_s});
}

namespace {

bool fusable(const UnitCost& u) {
  switch (u.features.kind) {
    case UnitKind::kElementwise: case UnitKind::kReduction: case UnitKind::kNorm:
    case UnitKind::kSoftmax: case UnitKind::kCopy: case UnitKind::kEmbedding:
    case UnitKind::kLoss:
      return u.error.empty();
    default:
      return false;
  }
}

template <typename F>
void each_tensor(const std::vector<Arg>& args, F f) {
  for (const Arg& a : args) {
    for (const TensorInfo& t : a.tensors) {
      if (t.dtype >= 0 && t.storage != 0) f(t);
    }
  }
}

}  // namespace

CompiledCost compile_trace(const TraceData& trace, const TraceCost& eager, const GpuSpec& gpu) {
  CompiledCost out;
  const size_t n = eager.units.size();
  auto op_of = [&](size_t u) -> const OpRecord& {
    return trace.ops[static_cast<size_t>(eager.units[u].op)];
  };
  // Storages some earlier unit already touched (a kernel's output that a later fused chain
  // updates in place is not the chain's to keep in registers).
  std::unordered_set<int64_t> seen;
  auto mark_seen = [&](size_t u) {
    const OpRecord& op = op_of(u);
    each_tensor(op.inputs, [&](const TensorInfo& t) { seen.insert(t.storage); });
    each_tensor(op.outputs, [&](const TensorInfo& t) { seen.insert(t.storage); });
  };
  // Which units read each storage.
  std::unordered_map<int64_t, std::vector<size_t>> readers;
  for (size_t u = 0; u < n; ++u) {
    each_tensor(op_of(u).inputs, [&](const TensorInfo& t) { readers[t.storage].push_back(u); });
  }
  auto close_group = [&](std::vector<size_t>& group) {
    if (group.empty()) return;
    CompiledKernel k;
    k.units.assign(group.begin(), group.end());
    k.fused = true;
    std::unordered_set<size_t> members(group.begin(), group.end());
    std::unordered_set<int64_t> written, fresh;
    std::unordered_map<int64_t, double> reads, writes;
    for (size_t u : group) {
      const OpRecord& op = op_of(u);
      each_tensor(op.inputs, [&](const TensorInfo& t) {
        if (!written.count(t.storage)) {
          double& r = reads[t.storage];
          r = std::max(r, dense_bytes(t));
        }
      });
      each_tensor(op.outputs, [&](const TensorInfo& t) {
        written.insert(t.storage);
        if (t.storage > 0 && !seen.count(t.storage)) fresh.insert(t.storage);
        auto it = readers.find(t.storage);
        bool external = t.storage < 0 || it == readers.end();
        if (!external) {
          for (size_t r : it->second) {
            if (!members.count(r)) { external = true; break; }
          }
        }
        if (external) {
          double& w = writes[t.storage];
          w = std::max(w, dense_bytes(t));
        }
      });
      k.flops += eager.units[u].features.flops;
    }
    for (int64_t sid : fresh) {
      if (!writes.count(sid)) out.internal_storages.push_back(sid);
    }
    for (size_t u : group) mark_seen(u);
    for (const auto& kv : reads) k.bytes += kv.second;
    for (const auto& kv : writes) k.bytes += kv.second;
    k.time_s = fused_kernel_time_s(k.bytes, k.flops, gpu);
    k.host_s = kCompiledLaunchS;
    out.kernels.push_back(std::move(k));
    group.clear();
  };
  std::vector<size_t> group;
  std::unordered_set<int64_t> group_writes;
  Phase group_phase = Phase::kForward;
  for (size_t u = 0; u < n; ++u) {
    const UnitCost& unit = eager.units[u];
    const OpRecord& op = op_of(u);
    if (op.phase != Phase::kOptimizer && fusable(unit)) {
      bool connected = false;
      if (!group.empty() && op.phase == group_phase) {
        each_tensor(op.inputs, [&](const TensorInfo& t) {
          if (group_writes.count(t.storage)) connected = true;
        });
      }
      if (!connected) {
        close_group(group);
        group_writes.clear();
        group_phase = op.phase;
      }
      group.push_back(u);
      each_tensor(op.outputs, [&](const TensorInfo& t) { group_writes.insert(t.storage); });
      continue;
    }
    close_group(group);
    group_writes.clear();
    mark_seen(u);
    CompiledKernel k;
    k.units = {static_cast<int64_t>(u)};
    k.flops = unit.features.flops;
    k.bytes = unit.features.bytes_read + unit.features.bytes_written;
    k.time_s = unit.time_s;
    const bool kernels = unit.features.kernels > 0;
    // The optimizer step stays eager (its own dispatch cost); other extern kernels are called
    // from the generated wrapper.
    k.host_s = op.phase == Phase::kOptimizer ? host_dispatch_time_s(op_full_name(trace, op))
               : kernels                     ? kCompiledLaunchS * static_cast<double>(
                                                   unit.features.kernels)
                                             : 0.0;
    out.kernels.push_back(std::move(k));
  }
  close_group(group);
  std::vector<double> host, gpu_t;
  for (const CompiledKernel& k : out.kernels) {
    host.push_back(k.host_s);
    gpu_t.push_back(k.time_s);
    out.host_s += k.host_s;
    out.gpu_busy_s += k.time_s;
  }
  out.timeline = simulate_eager_timeline(host, gpu_t);
  out.end_to_end_s = timeline_end_to_end_s(out.timeline);
  return out;
}

}  // namespace blink
