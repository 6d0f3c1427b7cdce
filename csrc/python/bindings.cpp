// The one binding file: exposes the tracer and the torch-free core to Python as blink._C.
#include <torch/extension.h>
#include <torch/version.h>
#include <pybind11/numpy.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "../torch/tracer.h"
#include "blink/alloc_sim.h"
#include "blink/cost_model.h"
#include "blink/error.h"
#include "blink/features.h"
#include "blink/kernel_plan.h"
#include "blink/forest.h"
#include "blink/gnn.h"
#include "blink/learned.h"
#include "blink/roofline.h"
#include "blink/trace_types.h"

namespace py = pybind11;

namespace blink {
namespace {

// The math settings every costing entry point takes from Python.
FeatureOptions feature_options(bool allow_tf32_matmul, bool allow_tf32_cudnn,
                               bool cudnn_benchmark) {
  FeatureOptions o;
  o.allow_tf32_matmul = allow_tf32_matmul;
  o.allow_tf32_cudnn = allow_tf32_cudnn;
  o.cudnn_benchmark = cudnn_benchmark;
  return o;
}

py::tuple tensor_tuple(const TensorInfo& t) {
  py::tuple sizes(t.sizes.size());
  for (size_t i = 0; i < t.sizes.size(); ++i) sizes[i] = py::int_(t.sizes[i]);
  py::tuple strides(t.strides.size());
  for (size_t i = 0; i < t.strides.size(); ++i) strides[i] = py::int_(t.strides[i]);
  return py::make_tuple(sizes, strides, t.storage_offset, t.storage, t.storage_nbytes, t.dtype,
                        t.device_type, t.requires_grad);
}

// (kind, value): value is a tensor tuple, a list of them, a number, a string or a list.
py::tuple arg_tuple(const Arg& a) {
  const int kind = static_cast<int>(a.kind);
  switch (a.kind) {
    case ArgKind::kTensor:
      return py::make_tuple(kind, tensor_tuple(a.tensors.at(0)));
    case ArgKind::kTensorList: {
      py::list items;
      for (const TensorInfo& t : a.tensors) {
        if (t.dtype < 0) {
          items.append(py::none());
        } else {
          items.append(tensor_tuple(t));
        }
      }
      return py::make_tuple(kind, items);
    }
    case ArgKind::kInt:
      return py::make_tuple(kind, a.i);
    case ArgKind::kBool:
      return py::make_tuple(kind, a.i != 0);
    case ArgKind::kDouble:
      return py::make_tuple(kind, a.d);
    case ArgKind::kString:
    case ArgKind::kOther:
      return py::make_tuple(kind, a.s);
    case ArgKind::kIntList:
      return py::make_tuple(kind, py::cast(a.ints));
    case ArgKind::kDoubleList:
      return py::make_tuple(kind, py::cast(a.doubles));
    case ArgKind::kNone:
    default:
      return py::make_tuple(kind, py::none());
  }
}

py::list args_list(const std::vector<Arg>& args) {
  py::list out;
  for (const Arg& a : args) out.append(arg_tuple(a));
  return out;
}

py::dict trace_to_python(const TraceData& d) {
  py::list ops;
  for (const OpRecord& r : d.ops) {
    ops.append(py::make_tuple(r.id, r.parent, r.name, r.overload, r.module, r.seq_nr,
                              static_cast<int>(r.phase), static_cast<int>(r.scope), r.thread,
                              r.depth, args_list(r.inputs), args_list(r.outputs), r.kernel,
                              r.t_start_ns, r.t_end_ns, r.cpu_start_ns, r.cpu_end_ns));
  }
  py::list allocs;
  for (const AllocRecord& a : d.allocs) {
    allocs.append(py::make_tuple(a.storage, a.nbytes, a.op, a.is_free, a.thread));
  }
  py::list externals;
  for (const ExternalStorage& e : d.externals) {
    externals.append(py::make_tuple(e.storage, e.nbytes, e.device_type));
  }
  py::dict out;
  out["ops"] = ops;
  out["allocs"] = allocs;
  out["externals"] = externals;
  out["names"] = py::cast(d.names);
  out["modules"] = py::cast(d.modules);
  return out;
}

py::dict stats_dict(const AllocSimStats& s) {
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["peak_allocated_bytes"] = s.peak_allocated_bytes;
  d["peak_reserved_bytes"] = s.peak_reserved_bytes;
  d["num_segments"] = s.num_segments;
  d["num_device_mallocs"] = s.num_device_mallocs;
  d["num_ooms"] = s.num_ooms;
  d["num_alloc_retries"] = s.num_alloc_retries;
  return d;
}

// The inverse of arg_tuple: the raw trace format back into core records. Everything here may
// come from a damaged JSON file, so every field is type- and range-checked before it is narrowed
// or used as an index: a bad record is a blink::Error naming it, never a crash.
std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

py::sequence get_seq(py::handle h, long expected, const std::string& what) {
  if (!(py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h))) {
    throw Error(what + " must be a list, not " + type_name(h));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(h);
  if (expected >= 0 && static_cast<long>(py::len(seq)) != expected) {
    throw Error(what + " has " + std::to_string(py::len(seq)) + " fields, expected " +
                std::to_string(expected) + " (damaged, or another format_version)");
  }
  return seq;
}

int64_t get_int(py::handle h, const std::string& what, int64_t lo = INT64_MIN,
                int64_t hi = INT64_MAX) {
  if (!py::isinstance<py::int_>(h)) throw Error(what + " must be an integer, not " + type_name(h));
  int64_t v = 0;
  try {
    v = h.cast<int64_t>();
  } catch (const py::cast_error&) {
    throw Error(what + " is out of the 64-bit integer range");
  }
  if (v < lo || v > hi) {
    throw Error(what + " is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  }
  return v;
}

bool get_bool(py::handle h, const std::string& what) {
  if (!py::isinstance<py::bool_>(h) && !py::isinstance<py::int_>(h)) {
    throw Error(what + " must be a boolean, not " + type_name(h));
  }
  return h.cast<bool>();
}

std::vector<int64_t> get_ints(py::handle h, const std::string& what) {
  std::vector<int64_t> out;
  for (py::handle e : get_seq(h, -1, what)) out.push_back(get_int(e, what + " entry"));
  return out;
}

TensorInfo tensor_from_python(py::handle h, const std::string& what) {
  py::sequence v = get_seq(h, 8, what);
  TensorInfo t;
  t.sizes = get_ints(v[0], what + " sizes");
  t.strides = get_ints(v[1], what + " strides");
  t.storage_offset = get_int(v[2], what + " storage offset");
  t.storage = get_int(v[3], what + " storage id");
  t.storage_nbytes = get_int(v[4], what + " storage bytes");
  t.dtype = static_cast<int16_t>(get_int(v[5], what + " dtype code", -1, 63));
  t.device_type = static_cast<int8_t>(get_int(v[6], what + " device code", -1, 63));
  t.requires_grad = get_bool(v[7], what + " requires_grad");
  BLINK_CHECK(t.sizes.size() == t.strides.size(),
              what + " has " + std::to_string(t.sizes.size()) + " sizes but " +
                  std::to_string(t.strides.size()) + " strides");
  return t;
}

Arg arg_from_python(py::handle h, const std::string& what = "argument") {
  py::sequence tup = get_seq(h, 2, what);
  Arg a;
  a.kind = static_cast<ArgKind>(
      get_int(tup[0], what + " kind", 0, static_cast<int64_t>(ArgKind::kOther)));
  py::object v = tup[1];
  try {
    switch (a.kind) {
      case ArgKind::kTensor: a.tensors.push_back(tensor_from_python(v, what + " tensor")); break;
      case ArgKind::kTensorList:
        for (py::handle e : get_seq(v, -1, what + " tensor list")) {
          a.tensors.push_back(e.is_none() ? TensorInfo{} : tensor_from_python(e, what + " tensor"));
        }
        break;
      case ArgKind::kInt: a.i = get_int(v, what + " value"); break;
      case ArgKind::kBool: a.i = get_bool(v, what + " value") ? 1 : 0; break;
      case ArgKind::kDouble: a.d = v.cast<double>(); break;
      case ArgKind::kString: case ArgKind::kOther: a.s = v.cast<std::string>(); break;
      case ArgKind::kIntList: a.ints = get_ints(v, what + " value"); break;
      case ArgKind::kDoubleList: a.doubles = v.cast<std::vector<double>>(); break;
      default: break;
    }
  } catch (const py::cast_error&) {
    throw Error(what + " value has the wrong type (" + type_name(v) + ") for its kind " +
                std::to_string(static_cast<int>(a.kind)));
  }
  return a;
}

std::vector<std::string> get_strings(py::handle h, const std::string& what) {
  std::vector<std::string> out;
  for (py::handle e : get_seq(h, -1, what)) {
    if (!py::isinstance<py::str>(e)) throw Error(what + " entries must be strings, not " + type_name(e));
    out.push_back(e.cast<std::string>());
  }
  return out;
}

// A trace read back from JSON (the dict trace_to_python makes) as core records, validated.
std::shared_ptr<TraceData> trace_from_python(const py::dict& d) {
  auto t = std::make_shared<TraceData>();
  for (const char* key : {"names", "modules", "ops", "allocs", "externals"}) {
    BLINK_CHECK(d.contains(key), std::string("trace has no \"") + key + "\" list");
  }
  t->names = get_strings(d["names"], "trace names");
  t->modules = get_strings(d["modules"], "trace modules");
  for (py::handle h : get_seq(d["ops"], -1, "trace ops")) {
    const std::string at = "trace op record " + std::to_string(t->ops.size());
    py::sequence r = get_seq(h, -1, at);
    // 13 fields: format 2 (no timestamps); 17: format 3.
    BLINK_CHECK(py::len(r) == 13 || py::len(r) == 17,
                at + " has " + std::to_string(py::len(r)) +
                    " fields, expected 17 (or 13 for format 2; damaged, or another format_version)");
    OpRecord op;
    op.id = get_int(r[0], at + " id");
    op.parent = get_int(r[1], at + " parent");
    op.name = static_cast<int32_t>(get_int(r[2], at + " name index", 0, INT32_MAX));
    op.overload = static_cast<int32_t>(get_int(r[3], at + " overload index", 0, INT32_MAX));
    op.module = static_cast<int32_t>(get_int(r[4], at + " module index", -1, INT32_MAX));
    op.seq_nr = get_int(r[5], at + " sequence number");
    op.phase = static_cast<Phase>(get_int(r[6], at + " phase code (0 forward, 1 backward, 2 optimizer)", 0, 2));
    op.scope = static_cast<uint8_t>(get_int(r[7], at + " scope", 0, 255));
    op.thread = static_cast<int32_t>(get_int(r[8], at + " thread", 0, INT32_MAX));
    op.depth = static_cast<int32_t>(get_int(r[9], at + " depth", 0, INT32_MAX));
    for (py::handle a : get_seq(r[10], -1, at + " inputs")) op.inputs.push_back(arg_from_python(a, at + " input"));
    for (py::handle a : get_seq(r[11], -1, at + " outputs")) op.outputs.push_back(arg_from_python(a, at + " output"));
    op.kernel = get_bool(r[12], at + " kernel flag");
    if (py::len(r) == 17) {
      op.t_start_ns = get_int(r[13], at + " start time", -1);
      op.t_end_ns = get_int(r[14], at + " end time", -1);
      op.cpu_start_ns = get_int(r[15], at + " CPU start time", -1);
      op.cpu_end_ns = get_int(r[16], at + " CPU end time", -1);
      auto ordered = [](int64_t a, int64_t b) { return a < 0 || b >= a; };
      BLINK_CHECK(ordered(op.t_start_ns, op.t_end_ns) && ordered(op.cpu_start_ns, op.cpu_end_ns),
                  at + " has timestamps that end before they start");
    }
    t->ops.push_back(std::move(op));
  }
  for (py::handle h : get_seq(d["allocs"], -1, "trace allocs")) {
    const std::string at = "trace storage event " + std::to_string(t->allocs.size());
    py::sequence r = get_seq(h, 5, at);
    AllocRecord a;
    a.storage = get_int(r[0], at + " storage id");
    a.nbytes = get_int(r[1], at + " size");
    a.op = get_int(r[2], at + " op index");
    a.is_free = get_bool(r[3], at + " is_free");
    a.thread = static_cast<int32_t>(get_int(r[4], at + " thread", 0, INT32_MAX));
    t->allocs.push_back(a);
  }
  for (py::handle h : get_seq(d["externals"], -1, "trace externals")) {
    const std::string at = "trace resident storage " + std::to_string(t->externals.size());
    py::sequence r = get_seq(h, 3, at);
    t->externals.push_back(ExternalStorage{get_int(r[0], at + " id"), get_int(r[1], at + " size"),
                                           static_cast<int8_t>(get_int(r[2], at + " device code", -1, 63))});
  }
  validate_trace(*t);
  return t;
}

int meta_device() { return static_cast<int>(c10::DeviceType::Meta); }

// (full op name, module path or None, phase) of an op, so that Python need not convert the
// whole trace to label the units.
py::tuple op_label(const TraceData& t, int64_t id) {
  const OpRecord& op = t.ops[static_cast<size_t>(id)];
  std::string name = op_full_name(t, op);
  py::object module = py::none();
  if (op.module >= 0) module = py::str(t.modules[static_cast<size_t>(op.module)]);
  return py::make_tuple(name, module, static_cast<int>(op.phase));
}

// A unit's features as the dict blink._C.features_for and RawTrace.unit_features return.
py::dict features_to_python(const UnitFeatures& f) {
  py::dict d;
  for (const auto& kv : feature_values(f)) d[kv.first] = kv.second;
  d["kind"] = unit_kind_name(f.kind);
  d["math_mode"] = math_mode_name(f.math_mode);
  for (const char* k :
       {"matched", "backward", "trans_a", "trans_b", "transposed", "causal", "channels_last",
        "tensor_core"})
    d[k] = d[k].cast<double>() != 0.0;
  return d;
}

// Units: (op, kind, time_s, roofline_s, flops, bytes_read, bytes_written, kernels, matched,
// math_mode, error, (name, module, phase), source, analytic_s, log_ratio, fallback). source is
// "trees" where a unit model set time_s, else "analytic" ("none" when features failed);
// log_ratio is the applied log(time / analytic), NaN for analytic units; fallback says why an
// analytic unit was not timed by a forest (fallback_name: "" for trees units, "no_forest"
// without models).
py::dict cost_to_python(const TraceData& t, const TraceCost& c,
                        const LearnedResult* lr = nullptr) {
  py::list units;
  const double nan = std::nan("");
  for (size_t i = 0; i < c.units.size(); ++i) {
    const UnitCost& u = c.units[i];
    const UnitFeatures& f = u.features;
    const double q = lr != nullptr ? lr->log_ratio[i] : nan;
    const char* source = !u.error.empty() ? "none" : (std::isnan(q) ? "analytic" : "trees");
    const double analytic = lr != nullptr ? lr->analytic_s[i] : u.time_s;
    const char* fallback =
        fallback_name(lr != nullptr ? lr->fallback[i] : Fallback::kNoForest);
    units.append(py::make_tuple(u.op, unit_kind_name(f.kind), u.time_s, u.roofline_s, f.flops,
                                f.bytes_read, f.bytes_written, f.kernels, f.matched,
                                math_mode_name(f.math_mode), u.error, op_label(t, u.op), source,
                                analytic, q, fallback));
  }
  py::list issues;
  for (size_t i = 0; i < c.issues.size(); ++i) {
    const IssueCost& is = c.issues[i];
    const TimelineEvent& e = c.timeline[i];
    issues.append(py::make_tuple(is.op, is.host_s, is.gpu_s, e.host_start, e.host_end,
                                 e.gpu_start, e.gpu_end, op_label(t, is.op), is.caller_s,
                                 is.dispatch_s, is.syncs));
  }
  py::dict d;
  d["units"] = units;
  d["issues"] = issues;
  d["end_to_end_s"] = c.end_to_end_s;
  d["lower_bound_s"] = c.lower_bound_s;
  d["host_s"] = c.host_s;
  d["gpu_busy_s"] = c.gpu_busy_s;
  return d;
}

// A 2-D float64 array (rows x cols) from a numpy array or a list of lists of numbers.
py::array_t<double, py::array::c_style | py::array::forcecast> matrix_from_python(
    const py::object& x, const std::string& what) {
  auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(x);
  if (!a) {
    PyErr_Clear();
    throw Error(what + ": expected a 2-D array of numbers (rows x features): a float64 numpy "
                "array or a list of equal-length lists of numbers");
  }
  if (a.ndim() != 2) {
    throw Error(what + ": expected a 2-D array (rows x features), got " +
                std::to_string(a.ndim()) + " dimension(s)");
  }
  return a;
}

py::dict graph_to_python(const TraceCost& c, const UnitGraph& g) {
  const size_t nf = gnn_node_feature_names().size();
  py::array_t<double> x({static_cast<size_t>(g.num_nodes), nf});
  if (!g.x.empty()) std::memcpy(x.mutable_data(), g.x.data(), g.x.size() * sizeof(double));
  py::array_t<int64_t> edges({g.src.size(), size_t{2}});
  auto e = edges.mutable_unchecked<2>();
  for (size_t i = 0; i < g.src.size(); ++i) {
    e(i, 0) = g.src[i];
    e(i, 1) = g.dst[i];
  }
  std::vector<int64_t> ops;
  for (const UnitCost& u : c.units) ops.push_back(u.op);
  py::dict d;
  d["x"] = x;
  d["edges"] = edges;
  d["g"] = py::cast(g.g);
  d["op"] = py::cast(ops);
  d["node_features"] = py::cast(gnn_node_feature_names());
  d["graph_features"] = py::cast(gnn_graph_feature_names());
  return d;
}

// The inverse of graph_to_python (x, edges, g), checked.
UnitGraph graph_from_python(const py::dict& d) {
  UnitGraph g;
  auto x = matrix_from_python(d["x"], "unit graph x");
  BLINK_CHECK(static_cast<size_t>(x.shape(1)) == gnn_node_feature_names().size(),
              "unit graph x has " + std::to_string(x.shape(1)) + " columns, expected " +
                  std::to_string(gnn_node_feature_names().size()));
  g.num_nodes = x.shape(0);
  g.x.assign(x.data(), x.data() + x.size());
  auto e = matrix_from_python(d["edges"], "unit graph edges");
  BLINK_CHECK(e.shape(1) == 2 || e.shape(0) == 0, "unit graph edges must be E x 2");
  for (py::ssize_t i = 0; i < e.shape(0); ++i) {
    const double s = e.at(i, 0), t = e.at(i, 1);
    BLINK_CHECK(s >= 0 && t >= 0 && s < g.num_nodes && t < g.num_nodes && s == std::floor(s) &&
                    t == std::floor(t),
                "unit graph edge " + std::to_string(i) + " names a node outside 0.." +
                    std::to_string(g.num_nodes - 1));
    g.src.push_back(static_cast<int64_t>(s));
    g.dst.push_back(static_cast<int64_t>(t));
  }
  g.g = d["g"].cast<std::vector<double>>();
  BLINK_CHECK(g.g.size() == gnn_graph_feature_names().size(),
              "unit graph g has " + std::to_string(g.g.size()) + " entries, expected " +
                  std::to_string(gnn_graph_feature_names().size()));
  return g;
}

AllocSimOptions sim_options(bool expandable_segments, int64_t capacity_bytes) {
  AllocSimOptions o;
  o.expandable_segments = expandable_segments;
  o.capacity_bytes = capacity_bytes;
  return o;
}

}  // namespace
}  // namespace blink

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace blink;
  m.doc() = "Blink's compiled core: the dispatch tracer and the torch-free cost engine.";
  // Cost constants the power-rule fits read back (benchmarks/sustained_logo.py), so no script
  // keeps a copy that can go stale.
  m.attr("kSimtGemmBaseEfficiency") = kSimtGemmBaseEfficiency;
  m.attr("kGemmDramEfficiency") = kGemmDramEfficiency;
  m.attr("kPascalLtPanelExponent") = kPascalLtPanelExponent;
  m.attr("kPascalLtTileRate") = kPascalLtTileRate;
  m.attr("kConvWgradEfficiency") = kConvWgradEfficiency;
  m.attr("kConvStridedDgradEfficiency") = kConvStridedDgradEfficiency;
  m.attr("kConvGroupedBackwardEfficiency") = kConvGroupedBackwardEfficiency;
  m.attr("kPermutedCopySlowdown") = kPermutedCopySlowdown;
  m.attr("kWarpSoftmaxSlowdown") = kWarpSoftmaxSlowdown;
  m.attr("kSerialLoopIterationS") = kSerialLoopIterationS;
  m.attr("kGnnMinUnitUs") = kGnnMinUnitUs;
  m.attr("kConvSimtPowerFraction") = kConvSimtPowerFraction;
  // blink::Error arrives in Python as blink._C.Error, a subclass of blink.errors.BlinkError.
  py::object base = py::module_::import("blink.errors").attr("BlinkError");
  py::register_exception<Error>(m, "Error", base);

  m.def("build_info", []() {
    py::dict d;
    d["torch_version"] = std::string(TORCH_VERSION);
    d["python_version"] = std::to_string(PY_MAJOR_VERSION) + "." + std::to_string(PY_MINOR_VERSION);
    d["cplusplus"] = static_cast<long>(__cplusplus);
#if defined(__clang__)
    d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    d["compiler"] = std::string("gcc ") + __VERSION__;
#else
    d["compiler"] = std::string("unknown");
#endif
    d["glibcxx_use_cxx11_abi"] = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
    return d;
  });

  m.def("tracer_start", &tracer::start, py::arg("record_all") = false,
        py::arg("timing_only") = false,
        "Start recording ops and meta storages on this thread.");
  // The record stays in C++ until Python reads it: converting ~50k ops to Python objects
  // costs more than recording them, and many callers only need a summary or the JSON.
  py::class_<TraceData, std::shared_ptr<TraceData>>(m, "RawTrace")
      .def("num_ops", [](const TraceData& d) { return d.ops.size(); })
      .def("num_allocs", [](const TraceData& d) { return d.allocs.size(); })
      .def("to_python", &trace_to_python)
      .def(
          "cost",
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn,
             const std::string& host_time, double tracer_gap_overhead_s, double module_hook_s,
             double forward_mode_overhead_s, bool cudnn_benchmark,
             std::shared_ptr<const UnitModels> models, std::shared_ptr<const Gnn> gnn,
             bool extrapolate_forests) {
            const FeatureOptions o =
                feature_options(allow_tf32_matmul, allow_tf32_cudnn, cudnn_benchmark);
            HostOptions h;
            BLINK_CHECK(host_time == "table" || host_time == "measured" || host_time == "wall",
                        "host_time must be 'table', 'measured' or 'wall', not '" + host_time +
                            "'");
            BLINK_CHECK(tracer_gap_overhead_s >= 0.0 && tracer_gap_overhead_s < 1e-3 &&
                            module_hook_s >= 0.0 && module_hook_s < 1e-3 &&
                            forward_mode_overhead_s >= 0.0 && forward_mode_overhead_s < 1e-3,
                        "tracer overheads must be in [0, 1 ms)");
            h.mode = host_time == "table" ? HostTimeMode::kTable : HostTimeMode::kMeasured;
            h.wall_clock = host_time == "wall";
            h.tracer_gap_overhead_s = tracer_gap_overhead_s;
            h.module_hook_s = module_hook_s;
            h.forward_mode_overhead_s = forward_mode_overhead_s;
            TraceCost c;
            LearnedResult lr;
            double correction = std::nan("");
            double uncorrected = 0.0;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o, h);
              if (models) lr = apply_unit_models(d, c, *models, g, extrapolate_forests);
              uncorrected = c.end_to_end_s;
              if (gnn) {
                correction = gnn->forward(build_unit_graph(d, c, models ? &lr : nullptr, g));
                c.end_to_end_s *= std::exp(correction);
              }
            }
            py::dict out = cost_to_python(d, c, models ? &lr : nullptr);
            out["gnn_log_correction"] = correction;
            out["timeline_end_to_end_s"] = uncorrected;
            out["forest_other_generation_units"] =
                std::count(lr.fallback.begin(), lr.fallback.end(), Fallback::kOtherGeneration);
            return out;
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
          py::arg("host_time") = "table", py::arg("tracer_gap_overhead_s") = 0.0,
          py::arg("module_hook_s") = 0.0, py::arg("forward_mode_overhead_s") = 0.0,
          py::arg("cudnn_benchmark") = false, py::arg("models") = nullptr,
          py::arg("gnn") = nullptr, py::arg("extrapolate_forests") = false,
          "Cost the trace on `gpu` (host time from the table or the trace's measured gaps); with "
          "`models` (a UnitModels), covered units take the forests' times and the timeline is "
          "re-run with them (on a GPU generation outside a forest's range only with "
          "extrapolate_forests); with `gnn` (a Gnn), end_to_end_s is the timeline's times "
          "exp(gnn_log_correction).")
      .def(
          "unit_graph",
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn,
             std::shared_ptr<const UnitModels> models, bool cudnn_benchmark,
             bool extrapolate_forests) {
            const FeatureOptions o =
                feature_options(allow_tf32_matmul, allow_tf32_cudnn, cudnn_benchmark);
            TraceCost c;
            LearnedResult lr;
            UnitGraph graph;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o);
              if (models) lr = apply_unit_models(d, c, *models, g, extrapolate_forests);
              graph = build_unit_graph(d, c, models ? &lr : nullptr, g);
            }
            return graph_to_python(c, graph);
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
          py::arg("models") = nullptr, py::arg("cudnn_benchmark") = false,
          py::arg("extrapolate_forests") = false,
          "The GNN's input: {x: units x node_features, edges: E x 2 (producer, consumer), "
          "g: graph features, op: unit op ids, node_features, graph_features}.")
      .def(
          "unit_model_inputs",
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn) {
            const FeatureOptions o = feature_options(allow_tf32_matmul, allow_tf32_cudnn, false);
            TraceCost c;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o);
            }
            const size_t cols = unit_model_input_names().size();
            py::array_t<double> rows({c.units.size(), cols});
            auto r = rows.mutable_unchecked<2>();
            std::vector<int64_t> ops;
            std::vector<std::string> kinds;
            for (size_t i = 0; i < c.units.size(); ++i) {
              const UnitCost& u = c.units[i];
              ops.push_back(u.op);
              kinds.emplace_back(unit_kind_name(u.features.kind));
              const std::vector<double> v = unit_model_inputs(u.features, u.time_s, g);
              for (size_t j = 0; j < cols; ++j) r(i, j) = u.error.empty() ? v[j] : std::nan("");
            }
            py::dict out;
            out["op"] = py::cast(ops);
            out["kind"] = py::cast(kinds);
            out["names"] = py::cast(unit_model_input_names());
            out["rows"] = rows;
            return out;
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
          "Every unit's unit-model input row (the exact vector predict feeds the forests): "
          "{op: [ids], kind: [names], names: [input names], rows: float64 array units x names}; "
          "rows of units whose features failed are NaN.")
      .def(
          "unit_features",
          // The feature rows of the units exactly as cost() costs them (trace-level features
          // such as L2 residency included): what training reads.
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn,
             bool cudnn_benchmark) {
            const FeatureOptions o =
                feature_options(allow_tf32_matmul, allow_tf32_cudnn, cudnn_benchmark);
            TraceCost c;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o);
            }
            py::list rows;
            for (const UnitCost& u : c.units) {
              const OpRecord& op = d.ops[static_cast<size_t>(u.op)];
              py::dict row = features_to_python(u.features);
              row["analytic_time_s"] = u.time_s;
              row["op_id"] = u.op;
              row["op"] = op_full_name(d, op);
              row["host_dispatch_time_s"] = host_dispatch_time_s(op_full_name(d, op));
              row["error"] = u.error;
              row["permuted"] = u.features.permuted;
              row["warp_softmax"] = u.features.warp_softmax;
              rows.append(row);
            }
            return rows;
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
          py::arg("cudnn_benchmark") = false)
      .def(
          "memory",
          [](const TraceData& d, bool expandable_segments, int64_t capacity_bytes,
             int64_t workspace_bytes, const std::vector<std::pair<int64_t, int>>& external_roles,
             int64_t max_curve_points, const std::vector<int64_t>& skip_storages) {
            MemoryOptions o;
            o.sim = sim_options(expandable_segments, capacity_bytes);
            o.workspace_bytes = workspace_bytes;
            o.external_roles = external_roles;
            o.max_curve_points = std::min<int64_t>(std::max<int64_t>(max_curve_points, 0), 100000);
            o.skip_storages = skip_storages;
            MemoryResult r;
            {
              py::gil_scoped_release release;
              r = simulate_trace_memory(d, meta_device(), o);
            }
            py::dict out = stats_dict(r.stats);
            out["resident_bytes"] = r.resident_bytes;
            out["temporaries_dropped"] = r.temporaries_dropped;
            out["events"] = r.events;
            out["oom"] = r.oom;
            out["oom_op"] = r.oom_op;
            out["oom_request_bytes"] = r.oom_request_bytes;
            out["oom_resident"] = r.oom_resident;
            out["oom_label"] = r.oom_op >= 0 ? py::object(op_label(d, r.oom_op)) : py::none();
            py::dict cats;
            for (int c = 0; c < kNumMemoryCategories; ++c) {
              cats[memory_category_name(static_cast<MemoryCategory>(c))] =
                  r.peak_by_category[static_cast<size_t>(c)];
            }
            out["peak_by_category"] = cats;
            py::list curve;
            for (const MemoryPoint& p : r.curve) {
              curve.append(py::make_tuple(p.op, p.phase, p.allocated, p.reserved));
            }
            out["curve"] = curve;
            return out;
          },
          py::arg("expandable_segments") = false, py::arg("capacity_bytes") = 0,
          py::arg("workspace_bytes") = 0,
          py::arg("external_roles") = std::vector<std::pair<int64_t, int>>{},
          py::arg("max_curve_points") = 0,
          py::arg("skip_storages") = std::vector<int64_t>{})
      .def(
          "compiled",
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn) {
            const FeatureOptions o = feature_options(allow_tf32_matmul, allow_tf32_cudnn, false);
            TraceCost c;
            CompiledCost cc;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o);
              cc = compile_trace(d, c, g);
            }
            py::dict out = cost_to_python(d, c);
            py::list kernels;
            for (size_t i = 0; i < cc.kernels.size(); ++i) {
              const CompiledKernel& k = cc.kernels[i];
              const TimelineEvent& e = cc.timeline[i];
              kernels.append(py::make_tuple(py::cast(k.units), k.fused, k.flops, k.bytes,
                                            k.time_s, k.host_s, e.host_start, e.host_end,
                                            e.gpu_start, e.gpu_end));
            }
            out["kernels"] = kernels;
            out["internal_storages"] = py::cast(cc.internal_storages);
            out["compiled_end_to_end_s"] = cc.end_to_end_s;
            out["compiled_host_s"] = cc.host_s;
            out["compiled_gpu_busy_s"] = cc.gpu_busy_s;
            return out;
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true)
      .def("units", [](const TraceData& d) { return cut_units(d, meta_device()); });
  m.def("trace_from_python", &trace_from_python, py::arg("raw"));

  // ---- learned predictors: XGBoost JSON forests evaluated in the core ----
  py::class_<Forest, std::shared_ptr<Forest>>(m, "Forest")
      .def_readonly("source", &Forest::source)
      .def_readonly("objective", &Forest::objective)
      .def_readonly("num_features", &Forest::num_features)
      .def_readonly("base_score", &Forest::base_score)
      .def_readonly("base_margin", &Forest::base_margin)
      .def_readonly("feature_names", &Forest::feature_names)
      .def_property_readonly("version", [](const Forest& f) {
        return py::make_tuple(f.version[0], f.version[1], f.version[2]);
      })
      .def_property_readonly("num_trees", &Forest::num_trees)
      .def_property_readonly("num_nodes", &Forest::num_nodes)
      .def(
          "predict",
          [](const Forest& f, const py::object& x, bool output_margin) {
            auto a = matrix_from_python(x, f.source + ": Forest.predict");
            const size_t rows = static_cast<size_t>(a.shape(0)), cols = static_cast<size_t>(a.shape(1));
            std::vector<double> out(rows);
            {
              py::gil_scoped_release release;
              f.predict_batch(a.data(), rows, cols, output_margin, out.data());
            }
            return out;
          },
          py::arg("x"), py::arg("output_margin") = false,
          "Predictions for the rows of x (2-D, NaN = missing) as a list of floats: the raw margin "
          "with output_margin=True, else through the objective's link (as xgboost's predict).");
  m.def("load_forest", [](const std::string& path) { return std::make_shared<Forest>(load_forest(path)); },
        py::arg("path"), "Read an XGBoost JSON model (Booster.save_model('m.json')).");
  m.def("parse_forest",
        [](const std::string& text, const std::string& source) {
          return std::make_shared<Forest>(parse_forest(text, source));
        },
        py::arg("text"), py::arg("source") = "<string>", "Parse an XGBoost JSON model's text.");
  py::class_<UnitModels, std::shared_ptr<UnitModels>>(m, "UnitModels")
      .def(py::init<>())
      .def("add", &UnitModels::add, py::arg("kind"), py::arg("forest"), py::arg("features"),
           py::arg("clip_lo") = -4.0, py::arg("clip_hi") = 4.0, py::arg("scale") = 1.0,
           py::arg("ops") = std::vector<std::string>{}, py::arg("cc_major_lo") = 0,
           py::arg("cc_major_hi") = 99,
           "A forest for units of `kind`; `ops` (ATen names) restricts it to the ops it was "
           "fitted on (empty: every op of the kind); cc_major_lo..hi to the GPU generations it "
           "was fitted on (compute-capability majors).")
      .def("kinds", &UnitModels::kinds);
  py::class_<Gnn, std::shared_ptr<Gnn>>(m, "Gnn")
      .def_readonly("source", &Gnn::source)
      .def_readonly("hidden", &Gnn::hidden)
      .def_property_readonly("layers",
                             [](const Gnn& g) { return g.members.at(0).layers.size(); })
      .def_property_readonly("members", [](const Gnn& g) { return g.members.size(); })
      .def_property_readonly("clip", [](const Gnn& g) { return py::make_tuple(g.clip_lo, g.clip_hi); })
      .def(
          "forward",
          [](const Gnn& g, const py::dict& graph) {
            UnitGraph ug = graph_from_python(graph);
            py::gil_scoped_release release;
            return g.forward(ug);
          },
          py::arg("graph"),
          "The clipped log correction for a unit graph {x, edges, g}: the members' mean.")
      .def(
          "forward_member",
          [](const Gnn& g, size_t member, const py::dict& graph) {
            UnitGraph ug = graph_from_python(graph);
            py::gil_scoped_release release;
            return g.forward_member(member, ug);
          },
          py::arg("member"), py::arg("graph"), "One member network's clipped log correction.");
  m.def("load_gnn", [](const std::string& path) { return std::make_shared<Gnn>(load_gnn(path)); },
        py::arg("path"), "Read GNN weights (safetensors written by blink.gnn.save).");
  m.def("parse_gnn",
        [](const py::bytes& data, const std::string& source) {
          return std::make_shared<Gnn>(parse_gnn(std::string(data), source));
        },
        py::arg("data"), py::arg("source") = "<bytes>");
  m.def("gnn_node_feature_names", []() { return gnn_node_feature_names(); });
  m.def("gnn_graph_feature_names", []() { return gnn_graph_feature_names(); });
  m.def("unit_model_input_names", []() { return unit_model_input_names(); },
        "Names a unit model may take as inputs (feature_values keys, analytic_time_s, gpu_*).");
  m.def("gpu_model_inputs", [](const GpuSpec& g) {
    // The gpu_* tail of unit_model_inputs, by name.
    const std::vector<std::string>& names = unit_model_input_names();
    const std::vector<double> v = unit_model_inputs(UnitFeatures{}, 0.0, g);
    py::dict d;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i].rfind("gpu_", 0) == 0) d[py::str(names[i])] = v[i];
    }
    return d;
  }, py::arg("gpu"));
  m.def("unit_model_op_key", &unit_model_op_key, py::arg("op_name"),
        "The key a forest's op list matches: the name without overload or in-place '_'.");
  m.def("unit_kind_names", []() {
    std::vector<std::string> out;
    for (int k = 0; k <= static_cast<int>(UnitKind::kOther); ++k)
      out.emplace_back(unit_kind_name(static_cast<UnitKind>(k)));
    return out;
  }, "Unit kind names in code order (the numeric 'kind' feature is the index).");
  m.def("math_mode_names", []() {
    std::vector<std::string> out;
    // kTf32x3 is the enum's last value (it was added after kOther).
    for (int k = 0; k <= static_cast<int>(MathMode::kTf32x3); ++k)
      out.emplace_back(math_mode_name(static_cast<MathMode>(k)));
    return out;
  }, "Math mode names in code order (the numeric 'math_mode' feature is the index).");
  m.def("unit_rule_ops", []() { return unit_rule_ops(); },
        "Op names the cut counts as units besides those with their own CUDA kernel.");
  m.def("host_dispatch_time_s", &host_dispatch_time_s, py::arg("op_name"));
  m.def("cuda_dispatch_time_s", &cuda_dispatch_time_s, py::arg("op_name"));
  m.def("tracer_stop", []() { return std::make_shared<TraceData>(tracer::stop()); },
        "Stop recording and return the raw trace (a RawTrace).");
  m.def("tracer_active", &tracer::active);
  m.def("tracer_register_external", &tracer::register_external, py::arg("tensor"),
        py::arg("watch") = false,
        "Give a pre-existing tensor its resident storage id now; returns the id. watch: record "
        "a free of it if the run releases it.");
  m.def("fused_kernel_time_s", &fused_kernel_time_s, py::arg("bytes"), py::arg("flops"),
        py::arg("gpu"), "GPU time of one fused memory-bound (Triton) kernel.");
  m.def("compiled_launch_s", []() { return kCompiledLaunchS; });
  m.def("validate_trace", [](const std::shared_ptr<TraceData>& t) { validate_trace(*t); });
  m.def("tracer_push_module", &tracer::push_module);
  m.def("tracer_pop_module", &tracer::pop_module);
  m.def("tracer_set_phase", [](int phase) {
    BLINK_CHECK(phase >= 0 && phase <= 2, "phase must be 0 (forward), 1 (backward) or 2 (optimizer)");
    tracer::set_phase(static_cast<Phase>(phase));
  });
  m.def("tracer_last_failure", []() -> py::object {
    tracer::Failure f = tracer::last_failure();
    if (!f.present) return py::none();
    py::object module = py::none();
    if (f.module >= 0) module = py::str(f.module_path);  // "" is the model's own forward
    return py::make_tuple(f.op, module);
  });
  m.def("device_type_name", [](int t) {
    return c10::DeviceTypeName(static_cast<c10::DeviceType>(t), /*lower_case=*/true);
  });
  m.def("scalar_type_of", [](const at::Tensor& t) { return static_cast<int>(t.scalar_type()); });

  py::class_<CachingAllocatorSim>(m, "CachingAllocatorSim")
      .def(py::init([](bool expandable_segments, int64_t capacity_bytes) {
             return CachingAllocatorSim(sim_options(expandable_segments, capacity_bytes));
           }),
           py::arg("expandable_segments") = false, py::arg("capacity_bytes") = 0)
      .def("malloc", &CachingAllocatorSim::malloc, py::arg("id"), py::arg("size"),
           py::arg("stream") = 0)
      .def("free", &CachingAllocatorSim::free, py::arg("id"))
      .def("empty_cache", &CachingAllocatorSim::empty_cache)
      .def("reset_peak_stats", &CachingAllocatorSim::reset_peak_stats)
      .def("block_size", &CachingAllocatorSim::block_size, py::arg("id"))
      .def("stats", [](const CachingAllocatorSim& s) { return stats_dict(s.stats()); });

  m.def(
      "simulate_allocations",
      [](const std::vector<std::tuple<int64_t, int64_t, bool, int>>& events,
         bool expandable_segments, int64_t capacity_bytes) {
        std::vector<AllocEvent> ev;
        ev.reserve(events.size());
        for (const auto& e : events) {
          AllocEvent a;
          a.id = std::get<0>(e);
          a.size = std::get<1>(e);
          a.is_free = std::get<2>(e);
          a.stream = std::get<3>(e);
          ev.push_back(a);
        }
        AllocSimStats stats;
        {
          py::gil_scoped_release release;
          stats = simulate_allocations(ev, sim_options(expandable_segments, capacity_bytes));
        }
        return stats_dict(stats);
      },
      py::arg("events"), py::arg("expandable_segments") = false, py::arg("capacity_bytes") = 0);

  py::class_<GpuSpec>(m, "GpuSpec")
      .def(py::init([](std::string name, int sm_count, double clock_hz, double mem_bw, double l2_bytes,
                       double peak_fp32, double peak_tf32, double peak_bf16, double peak_fp16,
                       double peak_fp8, int cc_major, int cc_minor, double peak_fp64,
                       double sustained_fp32_ratio, double sustained_tc_ratio,
                       double boost_window_s, double max_clock_ratio, double dram_efficiency,
                       double simt_gemm_rate) {
             GpuSpec g;
             g.name = name; g.sm_count = sm_count; g.clock_hz = clock_hz; g.mem_bw = mem_bw;
             g.l2_bytes = l2_bytes; g.peak_fp32 = peak_fp32; g.peak_tf32 = peak_tf32;
             g.peak_bf16 = peak_bf16; g.peak_fp16 = peak_fp16; g.peak_fp8 = peak_fp8;
             g.cc_major = cc_major; g.cc_minor = cc_minor; g.peak_fp64 = peak_fp64;
             BLINK_CHECK(max_clock_ratio >= 1.0 && max_clock_ratio <= 1.5,
                         "GpuSpec '" + name + "': max_clock_ratio must be in [1, 1.5]");
             g.max_clock_ratio = max_clock_ratio;
             BLINK_CHECK(sustained_fp32_ratio > 0.0 && sustained_fp32_ratio <= max_clock_ratio &&
                             sustained_tc_ratio > 0.0 && sustained_tc_ratio <= max_clock_ratio,
                         "GpuSpec '" + name + "': sustained ratios must be in (0, max_clock_ratio]");
             g.sustained_fp32_ratio = sustained_fp32_ratio;
             g.sustained_tc_ratio = sustained_tc_ratio;
             BLINK_CHECK(boost_window_s >= 0.0 && boost_window_s < 10.0,
                         "GpuSpec '" + name + "': boost_window_s must be in [0, 10) s");
             g.boost_window_s = boost_window_s;
             BLINK_CHECK(dram_efficiency >= 0.3 && dram_efficiency <= 1.0,
                         "GpuSpec '" + name + "': dram_efficiency must be in [0.3, 1]");
             g.dram_efficiency = dram_efficiency;
             BLINK_CHECK(simt_gemm_rate >= 0.3 && simt_gemm_rate <= 1.0,
                         "GpuSpec '" + name + "': simt_gemm_rate must be in [0.3, 1]");
             g.simt_gemm_rate = simt_gemm_rate;
             return g;
           }),
           py::arg("name"), py::arg("sm_count"), py::arg("clock_hz"), py::arg("mem_bw"),
           py::arg("l2_bytes"), py::arg("peak_fp32"), py::arg("peak_tf32"), py::arg("peak_bf16"),
           py::arg("peak_fp16"), py::arg("peak_fp8"), py::arg("cc_major"), py::arg("cc_minor"),
           py::arg("peak_fp64") = 0.0, py::arg("sustained_fp32_ratio") = 1.0,
           py::arg("sustained_tc_ratio") = 1.0, py::arg("boost_window_s") = 0.0,
           py::arg("max_clock_ratio") = 1.0, py::arg("dram_efficiency") = 0.90,
           py::arg("simt_gemm_rate") = 1.0)
      .def_readonly("sustained_fp32_ratio", &GpuSpec::sustained_fp32_ratio)
      .def_readonly("max_clock_ratio", &GpuSpec::max_clock_ratio)
      .def_readonly("sustained_tc_ratio", &GpuSpec::sustained_tc_ratio)
      .def_readonly("boost_window_s", &GpuSpec::boost_window_s)
      .def_readonly("dram_efficiency", &GpuSpec::dram_efficiency)
      .def_readonly("simt_gemm_rate", &GpuSpec::simt_gemm_rate);
  m.def("features_for",
        [](const std::string& op, py::list inputs, py::list outputs, const GpuSpec& g,
           bool allow_tf32_matmul, bool allow_tf32_cudnn, bool cudnn_benchmark) {
          std::vector<Arg> in, out;
          for (py::handle h : inputs) in.push_back(arg_from_python(h, op + " input"));
          for (py::handle h : outputs) out.push_back(arg_from_python(h, op + " output"));
          const FeatureOptions o =
                feature_options(allow_tf32_matmul, allow_tf32_cudnn, cudnn_benchmark);
          UnitFeatures f = features_for(op, in, out, g, o);
          py::dict d = features_to_python(f);
          d["analytic_time_s"] = analytic_time_s(f, g);
          d["host_dispatch_time_s"] = host_dispatch_time_s(op);
          d["permuted"] = f.permuted;
          d["warp_softmax"] = f.warp_softmax;
          return d;
        },
        py::arg("op_name"), py::arg("inputs"), py::arg("outputs"), py::arg("gpu"),
        py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
        py::arg("cudnn_benchmark") = false);
}
