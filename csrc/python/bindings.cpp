// The one binding file: exposes the tracer and the torch-free core to Python as blink._C.
#include <torch/extension.h>
#include <torch/version.h>
#include <pybind11/numpy.h>

#include <cmath>
#include <cstring>
#include <string>

#include "../torch/tracer.h"
#include "blink/alloc_sim.h"
#include "blink/cost_model.h"
#include "blink/error.h"
#include "blink/features.h"
#include "blink/forest.h"
#include "blink/gnn.h"
#include "blink/learned.h"
#include "blink/roofline.h"
#include "blink/trace_types.h"

namespace py = pybind11;

namespace blink {
namespace {

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
                              r.depth, args_list(r.inputs), args_list(r.outputs), r.kernel));
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

// The inverse of arg_tuple: the raw trace format back into core records.
TensorInfo tensor_from_python(py::handle h) {
  py::tuple v = h.cast<py::tuple>();
  TensorInfo t;
  t.sizes = v[0].cast<std::vector<int64_t>>();
  t.strides = v[1].cast<std::vector<int64_t>>();
  t.storage_offset = v[2].cast<int64_t>();
  t.storage = v[3].cast<int64_t>();
  t.storage_nbytes = v[4].cast<int64_t>();
  t.dtype = v[5].cast<int16_t>();
  t.device_type = v[6].cast<int8_t>();
  t.requires_grad = v[7].cast<bool>();
  return t;
}

Arg arg_from_python(py::handle h) {
  py::tuple tup = h.cast<py::tuple>();
  Arg a;
  a.kind = static_cast<ArgKind>(tup[0].cast<int>());
  py::object v = tup[1];
  switch (a.kind) {
    case ArgKind::kTensor: a.tensors.push_back(tensor_from_python(v)); break;
    case ArgKind::kTensorList:
      for (py::handle e : v) a.tensors.push_back(e.is_none() ? TensorInfo{} : tensor_from_python(e));
      break;
    case ArgKind::kInt: a.i = v.cast<int64_t>(); break;
    case ArgKind::kBool: a.i = v.cast<bool>() ? 1 : 0; break;
    case ArgKind::kDouble: a.d = v.cast<double>(); break;
    case ArgKind::kString: case ArgKind::kOther: a.s = v.cast<std::string>(); break;
    case ArgKind::kIntList: a.ints = v.cast<std::vector<int64_t>>(); break;
    case ArgKind::kDoubleList: a.doubles = v.cast<std::vector<double>>(); break;
    default: break;
  }
  return a;
}

// A trace read back from JSON (the dict trace_to_python makes) as core records.
std::shared_ptr<TraceData> trace_from_python(const py::dict& d) {
  auto t = std::make_shared<TraceData>();
  t->names = d["names"].cast<std::vector<std::string>>();
  t->modules = d["modules"].cast<std::vector<std::string>>();
  for (py::handle h : d["ops"]) {
    py::sequence r = h.cast<py::sequence>();
    BLINK_CHECK(py::len(r) == 13, "trace op record has " + std::to_string(py::len(r)) +
                                      " fields, expected 13 (format_version mismatch?)");
    OpRecord op;
    op.id = r[0].cast<int64_t>();
    op.parent = r[1].cast<int64_t>();
    op.name = r[2].cast<int32_t>();
    op.overload = r[3].cast<int32_t>();
    op.module = r[4].cast<int32_t>();
    op.seq_nr = r[5].cast<int64_t>();
    op.phase = static_cast<Phase>(r[6].cast<int>());
    op.scope = static_cast<uint8_t>(r[7].cast<int>());
    op.thread = r[8].cast<int32_t>();
    op.depth = r[9].cast<int32_t>();
    for (py::handle a : r[10]) op.inputs.push_back(arg_from_python(a));
    for (py::handle a : r[11]) op.outputs.push_back(arg_from_python(a));
    op.kernel = r[12].cast<bool>();
    const size_t n = t->names.size();
    BLINK_CHECK(op.id == static_cast<int64_t>(t->ops.size()) && op.parent < op.id &&
                    op.name >= 0 && static_cast<size_t>(op.name) < n && op.overload >= 0 &&
                    static_cast<size_t>(op.overload) < n,
                "trace op record " + std::to_string(t->ops.size()) + " is inconsistent");
    t->ops.push_back(std::move(op));
  }
  for (py::handle h : d["allocs"]) {
    py::sequence r = h.cast<py::sequence>();
    AllocRecord a;
    a.storage = r[0].cast<int64_t>();
    a.nbytes = r[1].cast<int64_t>();
    a.op = r[2].cast<int64_t>();
    a.is_free = r[3].cast<bool>();
    a.thread = r[4].cast<int32_t>();
    BLINK_CHECK(a.op < static_cast<int64_t>(t->ops.size()), "storage event names a missing op");
    t->allocs.push_back(a);
  }
  for (py::handle h : d["externals"]) {
    py::sequence r = h.cast<py::sequence>();
    t->externals.push_back(ExternalStorage{r[0].cast<int64_t>(), r[1].cast<int64_t>(),
                                           static_cast<int8_t>(r[2].cast<int>())});
  }
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

// Units: (op, kind, time_s, roofline_s, flops, bytes_read, bytes_written, kernels, matched,
// math_mode, error, (name, module, phase), source, analytic_s, log_ratio). source is "trees"
// where a unit model set time_s, else "analytic" ("none" when features failed); log_ratio is
// the applied log(time / analytic), NaN for analytic units.
py::dict cost_to_python(const TraceData& t, const TraceCost& c, const LearnedResult* lr) {
  py::list units;
  const double nan = std::nan("");
  for (size_t i = 0; i < c.units.size(); ++i) {
    const UnitCost& u = c.units[i];
    const UnitFeatures& f = u.features;
    const double q = lr != nullptr ? lr->log_ratio[i] : nan;
    const char* source = !u.error.empty() ? "none" : (std::isnan(q) ? "analytic" : "trees");
    const double analytic = lr != nullptr ? lr->analytic_s[i] : u.time_s;
    units.append(py::make_tuple(u.op, unit_kind_name(f.kind), u.time_s, u.roofline_s, f.flops,
                                f.bytes_read, f.bytes_written, f.kernels, f.matched,
                                math_mode_name(f.math_mode), u.error, op_label(t, u.op), source,
                                analytic, q));
  }
  py::list issues;
  for (size_t i = 0; i < c.issues.size(); ++i) {
    const IssueCost& is = c.issues[i];
    const TimelineEvent& e = c.timeline[i];
    issues.append(py::make_tuple(is.op, is.host_s, is.gpu_s, e.host_start, e.host_end,
                                 e.gpu_start, e.gpu_end, op_label(t, is.op)));
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
             std::shared_ptr<const UnitModels> models, std::shared_ptr<const Gnn> gnn) {
            FeatureOptions o;
            o.allow_tf32_matmul = allow_tf32_matmul;
            o.allow_tf32_cudnn = allow_tf32_cudnn;
            TraceCost c;
            LearnedResult lr;
            double correction = std::nan("");
            double uncorrected = 0.0;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o);
              if (models) lr = apply_unit_models(c, *models, g);
              uncorrected = c.end_to_end_s;
              if (gnn) {
                correction = gnn->forward(build_unit_graph(d, c, models ? &lr : nullptr, g));
                c.end_to_end_s *= std::exp(correction);
              }
            }
            py::dict out = cost_to_python(d, c, models ? &lr : nullptr);
            out["gnn_log_correction"] = correction;
            out["timeline_end_to_end_s"] = uncorrected;
            return out;
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
          py::arg("models") = nullptr, py::arg("gnn") = nullptr,
          "Cost the trace on `gpu`; with `models` (a UnitModels), covered units take the "
          "forests' times and the timeline is re-run with them; with `gnn` (a Gnn), "
          "end_to_end_s is the timeline's times exp(gnn_log_correction).")
      .def(
          "unit_graph",
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn,
             std::shared_ptr<const UnitModels> models) {
            FeatureOptions o;
            o.allow_tf32_matmul = allow_tf32_matmul;
            o.allow_tf32_cudnn = allow_tf32_cudnn;
            TraceCost c;
            LearnedResult lr;
            UnitGraph graph;
            {
              py::gil_scoped_release release;
              c = cost_trace(d, meta_device(), g, o);
              if (models) lr = apply_unit_models(c, *models, g);
              graph = build_unit_graph(d, c, models ? &lr : nullptr, g);
            }
            return graph_to_python(c, graph);
          },
          py::arg("gpu"), py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true,
          py::arg("models") = nullptr,
          "The GNN's input: {x: units x node_features, edges: E x 2 (producer, consumer), "
          "g: graph features, op: unit op ids, node_features, graph_features}.")
      .def(
          "unit_model_inputs",
          [](const TraceData& d, const GpuSpec& g, bool allow_tf32_matmul, bool allow_tf32_cudnn) {
            FeatureOptions o;
            o.allow_tf32_matmul = allow_tf32_matmul;
            o.allow_tf32_cudnn = allow_tf32_cudnn;
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
          "memory",
          [](const TraceData& d, bool expandable_segments, int64_t capacity_bytes,
             int64_t workspace_bytes) {
            MemoryOptions o;
            o.sim = sim_options(expandable_segments, capacity_bytes);
            o.workspace_bytes = workspace_bytes;
            MemoryResult r;
            {
              py::gil_scoped_release release;
              r = simulate_trace_memory(d, meta_device(), o);
            }
            py::dict out = stats_dict(r.stats);
            out["resident_bytes"] = r.resident_bytes;
            out["temporaries_dropped"] = r.temporaries_dropped;
            out["events"] = r.events;
            return out;
          },
          py::arg("expandable_segments") = false, py::arg("capacity_bytes") = 0,
          py::arg("workspace_bytes") = 0)
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
           py::arg("clip_lo") = -4.0, py::arg("clip_hi") = 4.0)
      .def("kinds", &UnitModels::kinds);
  py::class_<Gnn, std::shared_ptr<Gnn>>(m, "Gnn")
      .def_readonly("source", &Gnn::source)
      .def_readonly("hidden", &Gnn::hidden)
      .def_property_readonly("layers", [](const Gnn& g) { return g.layers.size(); })
      .def_property_readonly("clip", [](const Gnn& g) { return py::make_tuple(g.clip_lo, g.clip_hi); })
      .def(
          "forward",
          [](const Gnn& g, const py::dict& graph) {
            UnitGraph ug = graph_from_python(graph);
            py::gil_scoped_release release;
            return g.forward(ug);
          },
          py::arg("graph"), "The clipped log correction for a unit graph {x, edges, g}.");
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
  m.def("unit_kind_names", []() {
    std::vector<std::string> out;
    for (int k = 0; k <= static_cast<int>(UnitKind::kOther); ++k)
      out.emplace_back(unit_kind_name(static_cast<UnitKind>(k)));
    return out;
  }, "Unit kind names in code order (the numeric 'kind' feature is the index).");
  m.def("math_mode_names", []() {
    std::vector<std::string> out;
    for (int k = 0; k <= static_cast<int>(MathMode::kOther); ++k)
      out.emplace_back(math_mode_name(static_cast<MathMode>(k)));
    return out;
  }, "Math mode names in code order (the numeric 'math_mode' feature is the index).");
  m.def("unit_rule_ops", []() { return unit_rule_ops(); },
        "Op names the cut counts as units besides those with their own CUDA kernel.");
  m.def("host_dispatch_time_s", &host_dispatch_time_s, py::arg("op_name"));
  m.def("tracer_stop", []() { return std::make_shared<TraceData>(tracer::stop()); },
        "Stop recording and return the raw trace (a RawTrace).");
  m.def("tracer_active", &tracer::active);
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
                       double peak_fp8, int cc_major, int cc_minor) {
             GpuSpec g;
             g.name = name; g.sm_count = sm_count; g.clock_hz = clock_hz; g.mem_bw = mem_bw;
             g.l2_bytes = l2_bytes; g.peak_fp32 = peak_fp32; g.peak_tf32 = peak_tf32;
             g.peak_bf16 = peak_bf16; g.peak_fp16 = peak_fp16; g.peak_fp8 = peak_fp8;
             g.cc_major = cc_major; g.cc_minor = cc_minor;
             return g;
           }),
           py::arg("name"), py::arg("sm_count"), py::arg("clock_hz"), py::arg("mem_bw"),
           py::arg("l2_bytes"), py::arg("peak_fp32"), py::arg("peak_tf32"), py::arg("peak_bf16"),
           py::arg("peak_fp16"), py::arg("peak_fp8"), py::arg("cc_major"), py::arg("cc_minor"));
  m.def("features_for",
        [](const std::string& op, py::list inputs, py::list outputs, const GpuSpec& g,
           bool allow_tf32_matmul, bool allow_tf32_cudnn) {
          std::vector<Arg> in, out;
          for (py::handle h : inputs) in.push_back(arg_from_python(h));
          for (py::handle h : outputs) out.push_back(arg_from_python(h));
          FeatureOptions o;
          o.allow_tf32_matmul = allow_tf32_matmul;
          o.allow_tf32_cudnn = allow_tf32_cudnn;
          UnitFeatures f = features_for(op, in, out, g, o);
          py::dict d;
          for (const auto& kv : feature_values(f)) d[kv.first] = kv.second;
          d["kind"] = unit_kind_name(f.kind);
          d["math_mode"] = math_mode_name(f.math_mode);
          for (const char* k : {"matched", "backward", "trans_a", "trans_b", "transposed", "causal"})
            d[k] = d[k].cast<double>() != 0.0;
          d["analytic_time_s"] = analytic_time_s(f, g);
          d["host_dispatch_time_s"] = host_dispatch_time_s(op);
          return d;
        },
        py::arg("op_name"), py::arg("inputs"), py::arg("outputs"), py::arg("gpu"),
        py::arg("allow_tf32_matmul") = false, py::arg("allow_tf32_cudnn") = true);
}
