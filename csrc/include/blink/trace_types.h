#pragma once
// Plain records of one dry run: the ops the dispatcher ran and the storage events of the
// recording allocator. Torch-free so that the core (features, simulators) can read them.
#include <cstdint>
#include <string>
#include <vector>

namespace blink {

enum class Phase : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2 };

// Storage ids: > 0 a storage the recording allocator saw allocated during the trace;
// < 0 a storage that existed before it (weights, inputs); 0 no storage.
struct TensorInfo {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  int64_t storage = 0;
  int64_t storage_nbytes = 0;
  int16_t dtype = -1;  // c10::ScalarType as an integer
  int8_t device_type = -1;
  bool requires_grad = false;
};

enum class ArgKind : uint8_t {
  kNone = 0,
  kTensor,
  kTensorList,
  kInt,
  kDouble,
  kBool,
  kString,
  kIntList,
  kDoubleList,
  kOther,
};

struct Arg {
  ArgKind kind = ArgKind::kNone;
  int64_t i = 0;
  double d = 0.0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> doubles;
  std::vector<TensorInfo> tensors;  // one for kTensor, any number for kTensorList
};

struct OpRecord {
  int64_t id = 0;
  int64_t parent = -1;  // id of the enclosing op, -1 at the top
  int32_t name = -1;    // index into TraceData::names ("aten::addmm")
  int32_t overload = -1;
  int32_t module = -1;  // index into TraceData::modules, -1 outside any module
  int64_t seq_nr = -1;  // autograd sequence number (links backward nodes to forward ops)
  Phase phase = Phase::kForward;
  uint8_t scope = 0;    // at::RecordScope
  int32_t thread = 0;   // small id, 0 = the thread that started the trace
  int32_t depth = 0;
  bool kernel = false;  // the op has its own CUDA kernel (one launch group on a GPU)
  // Steady-clock nanoseconds since the trace started, stamped first thing when the observer is
  // entered and last thing when it exits: the time between one op's end and the next op's
  // start is the caller's own work (Python, the autograd engine). -1: not recorded.
  int64_t t_start_ns = -1;
  int64_t t_end_ns = -1;
  // The same two moments on the recording thread's CPU-time clock (CLOCK_THREAD_CPUTIME_ID,
  // ns): the caller's work without the time the thread slept or was preempted. -1: not recorded.
  int64_t cpu_start_ns = -1;
  int64_t cpu_end_ns = -1;
  std::vector<Arg> inputs;
  std::vector<Arg> outputs;
};

struct AllocRecord {
  int64_t storage = 0;  // > 0
  int64_t nbytes = 0;
  int64_t op = -1;      // the innermost op running when it happened, -1 outside any op
  bool is_free = false;
  int32_t thread = 0;
};

struct ExternalStorage {
  int64_t storage = 0;  // < 0
  int64_t nbytes = 0;
  int8_t device_type = -1;
};

struct TraceData {
  std::vector<OpRecord> ops;
  std::vector<AllocRecord> allocs;
  std::vector<ExternalStorage> externals;
  std::vector<std::string> names;
  std::vector<std::string> modules;
};

}  // namespace blink
