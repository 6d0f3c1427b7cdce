// blink._cupti: the CUPTI ground-truth tracer, a module of its own so that blink._C never links
// CUPTI. Built only where CUDA's CUPTI headers and library are found (setup.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/version.h>

#include <string>
#include <vector>

#include "blink/error.h"
#include "cupti_tracer.h"

namespace py = pybind11;

namespace blink {
namespace cupti {
namespace {

py::dict to_python(const Result& r) {
  py::list ops;
  for (const OpRecord& o : r.ops) {
    ops.append(py::make_tuple(o.id, o.name, o.overload, o.shapes, o.dtypes, o.thread, o.phase,
                              o.touches_cuda, o.start_ns, o.end_ns));
  }
  py::list kernels;
  for (const KernelRecord& k : r.kernels) {
    kernels.append(py::make_tuple(k.name, k.start_ns, k.end_ns, k.device, k.stream,
                                  k.correlation, k.op, py::make_tuple(k.grid[0], k.grid[1], k.grid[2]),
                                  py::make_tuple(k.block[0], k.block[1], k.block[2]), k.registers,
                                  k.static_smem, k.dynamic_smem));
  }
  py::list transfers;
  for (const TransferRecord& t : r.transfers) {
    transfers.append(py::make_tuple(t.is_memset, t.copy_kind, t.bytes, t.start_ns, t.end_ns,
                                    t.device, t.stream, t.correlation, t.op));
  }
  py::list apis;
  for (const ApiRecord& a : r.apis) {
    apis.append(py::make_tuple(a.driver, a.cbid, a.start_ns, a.end_ns, a.correlation, a.thread,
                               a.op));
  }
  py::dict d;
  d["ops"] = ops;
  d["kernels"] = kernels;
  d["transfers"] = transfers;
  d["apis"] = apis;
  d["names"] = py::cast(r.names);
  d["dropped"] = r.dropped;
  d["incomplete"] = r.incomplete;
  d["foreign_buffers"] = r.foreign_buffers;
  d["start_ns"] = r.start_ns;
  d["end_ns"] = r.end_ns;
  return d;
}

}  // namespace
}  // namespace cupti
}  // namespace blink

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace blink::cupti;
  m.doc() = "Blink's CUPTI activity tracer (ground truth for `blink collect` on a GPU).";
  // blink::Error thrown by this module arrives as blink._cupti.Error, a BlinkError. Local, so
  // that it never replaces blink._C's translation of the same C++ type.
  py::object base = py::module_::import("blink.errors").attr("BlinkError");
  py::register_local_exception<blink::Error>(m, "Error", base);

  m.def(
      "start",
      [](const std::vector<std::string>& extra_unit_ops, bool driver_api, int64_t buffer_bytes) {
        Options o;
        o.extra_unit_ops = extra_unit_ops;
        o.driver_api = driver_api;
        o.buffer_bytes = buffer_bytes;
        start(o);
      },
      py::arg("extra_unit_ops") = std::vector<std::string>{}, py::arg("driver_api") = true,
      py::arg("buffer_bytes") = int64_t{8} << 20,
      "Start tracing: CUPTI activities plus the unit ops that launched them (this thread and the "
      "autograd threads it hands work to). Synchronize the device before stop().");
  m.def(
      "stop",
      []() {
        Result r;
        {
          py::gil_scoped_release release;
          r = stop();
        }
        return to_python(r);
      },
      "Stop tracing and return the records as a dict of lists of tuples.");
  m.def("active", &active);
  m.def("op_count", &op_count, "Unit ops recorded so far in this trace.");
  m.def("set_phase", &set_phase, py::arg("phase"),
        "Mark later ops as forward (0), backward (1) or optimizer (2).");
  m.def("api_name", &api_name, py::arg("driver"), py::arg("cbid"));
  m.def("build_info", []() {
    py::dict d;
    d["cupti_api_version"] = compiled_api_version();
    d["torch_version"] = std::string(TORCH_VERSION);
    return d;
  });
  m.def("library_api_version", &library_api_version,
        "CUPTI_API_VERSION of the libcupti loaded in this process.");
}
