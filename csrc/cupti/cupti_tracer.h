#pragma once
// Ground-truth tracer for `blink collect` on a real GPU: CUPTI activity records (kernels,
// memcpys, memsets, runtime/driver API calls) tied to the ATen op that launched them.
//
// A thread-local RecordFunction observer picks the ops that are cost units (outermost ops with
// their own CUDA kernel, the same rule as the dry run's cut) and pushes a CUPTI external
// correlation id for each while it runs, so every activity CUPTI reports carries the op's id.
// Activities with no id (launched outside any unit op) are returned too, never dropped.
// One trace at a time per process; it refuses to start while torch.profiler is active (CUPTI
// has one set of activity-buffer callbacks per process).
#include <cstdint>
#include <string>
#include <vector>

namespace blink {
namespace cupti {

struct Options {
  // Ops that are units although the dispatcher gives them no CUDA kernel of their own (the
  // dry run's cut counts aten::convolution / aten::_convolution so; see csrc/core/cost_model.cpp).
  std::vector<std::string> extra_unit_ops;
  bool driver_api = true;  // also record driver API calls (cuBLAS/cuDNN/Triton launch through it)
  int64_t buffer_bytes = 8 << 20;
};

// One unit op as the observer saw it (host side).
struct OpRecord {
  int64_t id = 0;         // also its external correlation id (id + 1 is pushed; 0 means none)
  std::string name;       // "aten::addmm"
  std::string overload;   // "" or "out", "Tensor", ...
  std::string shapes;     // input shapes, ";"-separated, "AxB" per tensor, "[..,..]" per list
  std::string dtypes;     // c10::ScalarType codes of the tensor inputs, ","-separated
  int32_t thread = 0;     // small id, 0 = the thread that started the trace
  int32_t phase = 0;      // 0 forward, 1 backward, 2 optimizer (set from Python)
  bool touches_cuda = false;  // an input or output lives on a CUDA device
  uint64_t start_ns = 0;  // CUPTI timestamps (the clock of the activity records)
  uint64_t end_ns = 0;
};

struct KernelRecord {
  int32_t name = 0;  // index into Result::names (demangled)
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, stream = 0, correlation = 0;
  int64_t op = -1;  // OpRecord::id, -1 when launched outside any unit op
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
  int32_t registers = 0;  // per thread
  int32_t static_smem = 0, dynamic_smem = 0;
};

struct TransferRecord {
  bool is_memset = false;
  int32_t copy_kind = 0;  // CUpti_ActivityMemcpyKind for memcpys
  uint64_t bytes = 0;
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, stream = 0, correlation = 0;
  int64_t op = -1;
};

// A runtime or driver API call that launched a recorded GPU activity or ran inside a unit op.
struct ApiRecord {
  bool driver = false;
  uint32_t cbid = 0;
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t correlation = 0, thread = 0;
  int64_t op = -1;
};

struct Result {
  std::vector<OpRecord> ops;
  std::vector<KernelRecord> kernels;
  std::vector<TransferRecord> transfers;
  std::vector<ApiRecord> apis;
  std::vector<std::string> names;  // kernel names
  uint64_t dropped = 0;     // records CUPTI could not store (buffers full)
  uint64_t incomplete = 0;  // records with no end time (the device was not synchronized)
  uint64_t foreign_buffers = 0;  // buffers of another CUPTI client handed to us (not parsed)
  uint64_t start_ns = 0, end_ns = 0;
  std::vector<std::string> errors;  // CUPTI failures inside callbacks (stop() throws on these)
};

// Throws blink::Error when a trace is running, torch.profiler is active, or a CUPTI call fails.
void start(const Options& options);
// Flushes CUPTI (the caller must have synchronized the device), disables the activity kinds and
// returns everything recorded. Throws blink::Error when no trace is running or a CUPTI call
// failed during the trace.
Result stop();
bool active();
void set_phase(int phase);
// Unit ops recorded so far (a marker between calls traced back to back).
int64_t op_count();

// Name of a runtime (driver = false) or driver API callback id, e.g. "cudaLaunchKernel".
std::string api_name(bool driver, uint32_t cbid);
// CUPTI_API_VERSION of the headers this module was compiled against, and of the library.
int compiled_api_version();
int library_api_version();

}  // namespace cupti
}  // namespace blink
