#include "tracer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "blink/error.h"

namespace blink {
namespace tracer {
namespace {

constexpr uint64_t kCtxMagic = 0x626c696e6b616c63ULL;  // "blinkalc"
// SetAllocator keeps the highest priority; ours must beat the static meta registration (0)
// and still be restorable, so install and restore at the maximum.
constexpr uint8_t kAllocatorPriority = 255;
constexpr char kEngineRoot[] = "autograd::engine::evaluate_function";

struct AllocCtx {
  uint64_t magic;
  uint64_t generation;
  int64_t id;
  int64_t nbytes;
};

struct Frame {
  int64_t op;
  int32_t module;
  bool backward;
  bool muted;  // this op switched the observer off for its subtree
  // Not recorded (see is_transparent): `op` and `module` are the enclosing recorded op's.
  bool transparent = false;
  bool python_mode = false;  // a "PythonDispatchMode" frame
  // For is_mode_unpack_detach: a dispatch mode was active when the op began, and a
  // "PythonDispatchMode" frame ran somewhere below it; the trace's sizes at its start.
  bool mode_active = false;
  bool saw_mode = false;
  size_t allocs_at_start = 0;
  size_t externals_at_start = 0;
};

struct ThreadState {
  uint64_t generation = 0;
  int32_t thread = -1;
  std::vector<Frame> stack;
  std::vector<int32_t> modules;
  int backward_depth = 0;
  int transparent_depth = 0;  // transparent frames on `stack`
  int64_t skipped_cpu_ns = 0;  // thread CPU time of the ops dropped on this thread
};

struct Session {
  std::mutex mu;
  TraceData data;
  std::unordered_map<std::string, int32_t> name_index;
  std::unordered_map<std::string, int32_t> module_index;
  // StorageImpl* -> id (< 0). Each entry holds a weak reference to its StorageImpl: the
  // object's memory then stays allocated (not its data), so a storage freed during the trace
  // (a zero-byte tensor, a CPU scalar) cannot have its address reused by a later one, which
  // would give two storages one id and the dataflow graph edges between unrelated ops,
  // differing from run to run with the allocator's state.
  struct External {
    int64_t id;
    c10::weak_intrusive_ptr<c10::StorageImpl> keep;
  };
  std::unordered_map<const void*, External> externals;
  // Resident storages the run may release (register_external(watch)): their last owner can be
  // the model's own state, so the free is seen as the weak reference expiring.
  struct Watched {
    int64_t id;
    int64_t nbytes;
    c10::weak_intrusive_ptr<c10::StorageImpl> keep;
  };
  std::vector<Watched> watched;
  std::unordered_map<int64_t, int32_t> seq_module;     // autograd seq nr -> module
  std::unordered_map<const void*, bool> is_kernel;      // schema name ptr -> has a CUDA kernel
  bool record_all = false;
  bool timing_only = false;
  std::chrono::steady_clock::time_point t0;
  // Wall time of dropped ops (is_mode_unpack_detach), taken off every later stamp so that the
  // gaps around them are those of the run without them.
  std::atomic<int64_t> skipped_ns{0};
  int64_t next_storage = 1;
  int32_t next_thread = 0;
  at::CallbackHandle handle = 0;
  c10::Allocator* previous_allocator = nullptr;
  Failure failure;
};

std::atomic<bool> g_active{false};
std::atomic<uint64_t> g_generation{0};
std::atomic<uint8_t> g_phase{0};
std::mutex g_session_mu;  // guards g_session's lifetime (start/stop)
Session* g_session = nullptr;
thread_local ThreadState t_state;

ThreadState& thread_state(Session& s) {
  uint64_t gen = g_generation.load();
  if (t_state.generation != gen) {
    t_state = ThreadState();
    t_state.generation = gen;
    std::lock_guard<std::mutex> lock(s.mu);
    t_state.thread = s.next_thread++;
  }
  return t_state;
}

int32_t intern(std::unordered_map<std::string, int32_t>& index, std::vector<std::string>& table,
               const char* text) {
  std::string key(text ? text : "");
  auto it = index.find(key);
  if (it != index.end()) return it->second;
  int32_t id = static_cast<int32_t>(table.size());
  table.push_back(key);
  index.emplace(std::move(key), id);
  return id;
}

void delete_ctx(void* raw);

// Storage id of a tensor: ours if the recording allocator made it, else a stable negative id.
// Caller holds s.mu.
void storage_of(Session& s, const at::Tensor& t, TensorInfo& info) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage()) return;
  const c10::Storage& storage = impl->storage();
  const c10::DataPtr& ptr = storage.data_ptr();
  info.storage_nbytes = static_cast<int64_t>(storage.nbytes());
  if (ptr.get_deleter() == &delete_ctx) {
    auto* ctx = static_cast<AllocCtx*>(ptr.get_context());
    if (ctx->generation == g_generation.load()) {
      info.storage = ctx->id;
      return;
    }
  }
  const void* key = storage.unsafeGetStorageImpl();
  auto it = s.externals.find(key);
  if (it != s.externals.end()) {
    info.storage = it->second.id;
    return;
  }
  int64_t id = -static_cast<int64_t>(s.externals.size()) - 1;
  s.externals.emplace(key, Session::External{id, storage.getWeakStorageImpl()});
  s.data.externals.push_back(ExternalStorage{id, info.storage_nbytes, info.device_type});
  info.storage = id;
}

void tensor_info(Session& s, const at::Tensor& t, TensorInfo& info) {
  info.dtype = static_cast<int16_t>(t.scalar_type());
  info.device_type = static_cast<int8_t>(t.device().type());
  info.requires_grad = t.requires_grad();
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  // Symbolic, sparse or nested tensors have no plain sizes/strides; record dtype only.
  if (impl->has_symbolic_sizes_strides() || t.is_nested() || t.layout() != c10::kStrided) return;
  auto sizes = t.sizes();
  auto strides = t.strides();
  info.sizes.assign(sizes.begin(), sizes.end());
  info.strides.assign(strides.begin(), strides.end());
  info.storage_offset = t.storage_offset();
  storage_of(s, t, info);
}

void record_value(Session& s, const c10::IValue& v, Arg& arg) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;  // kNone
    arg.kind = ArgKind::kTensor;
    arg.tensors.emplace_back();
    tensor_info(s, t, arg.tensors.back());
  } else if (v.isTensorList()) {
    arg.kind = ArgKind::kTensorList;
    for (const at::Tensor& t : v.toTensorVector()) {
      arg.tensors.emplace_back();
      if (t.defined()) tensor_info(s, t, arg.tensors.back());
    }
  } else if (v.isInt()) {
    arg.kind = ArgKind::kInt;
    arg.i = v.toInt();
  } else if (v.isDouble()) {
    arg.kind = ArgKind::kDouble;
    arg.d = v.toDouble();
  } else if (v.isBool()) {
    arg.kind = ArgKind::kBool;
    arg.i = v.toBool() ? 1 : 0;
  } else if (v.isString()) {
    arg.kind = ArgKind::kString;
    arg.s = v.toStringRef();
  } else if (v.isIntList()) {
    arg.kind = ArgKind::kIntList;
    auto list = v.toIntList();
    arg.ints.assign(list.begin(), list.end());
  } else if (v.isBoolList()) {
    // bool[] (convolution_backward's output_mask): kept as 0/1 integers.
    arg.kind = ArgKind::kIntList;
    for (bool b : v.toBoolList()) arg.ints.push_back(b ? 1 : 0);
  } else if (v.isDoubleList()) {
    arg.kind = ArgKind::kDoubleList;
    auto list = v.toDoubleList();
    arg.doubles.assign(list.begin(), list.end());
  } else if (v.isNone()) {
    arg.kind = ArgKind::kNone;
  } else if (v.isList()) {
    // Optional-tensor lists (index) and the like: keep the tensors they hold.
    arg.kind = ArgKind::kTensorList;
    for (const c10::IValue& e : v.toListRef()) {
      arg.tensors.emplace_back();
      if (e.isTensor() && e.toTensor().defined()) tensor_info(s, e.toTensor(), arg.tensors.back());
    }
  } else if (v.isComplexDouble()) {
    // A complex scalar (polar's backward, complex mul): toDouble() would throw in the
    // callback and lose the record.
    arg.kind = ArgKind::kOther;
    arg.s = "ComplexDouble";
  } else if (v.isScalar()) {
    arg.kind = ArgKind::kDouble;
    arg.d = v.toScalar().toDouble();
  } else {
    arg.kind = ArgKind::kOther;
    arg.s = v.tagKind();
  }
}

// True when the op has its own CUDA kernel: on a GPU it is one launch, and what it calls on the
// meta device (Python refs, prims) is a meta-only decomposition. Cached per schema; the name
// pointer is stable for the lifetime of the registration. Caller holds s.mu.
bool has_cuda_kernel(Session& s, const at::RecordFunction& fn) {
  const void* key = fn.overload_name();
  auto it = s.is_kernel.find(key);
  if (it != s.is_kernel.end()) return it->second;
  bool kernel = false;
  if (auto name = fn.operator_name()) {
    if (auto handle = c10::Dispatcher::singleton().findSchema(*name)) {
      kernel = handle->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
    }
  }
  s.is_kernel.emplace(key, kernel);
  return kernel;
}

constexpr char kPythonMode[] = "PythonDispatchMode";

const char* base_name(const char* name) {
  const char* colon = std::strrchr(name, ':');
  return colon == nullptr ? name : colon + 1;
}

// A TorchDispatchMode (blink.known_values, or the user's own) runs between an op's dispatcher
// entry and its kernel: torch records a "PythonDispatchMode" frame and the mode's func(*args)
// enters the same op again. A GPU run without the mode dispatches it once, so neither is
// recorded (their children go to the outer op): the trace, and the host gaps between its ops,
// are those of the run without the mode. `python_mode`: fn is that frame. Caller holds s.mu.
bool is_transparent(const Session& s, const ThreadState& ts, const at::RecordFunction& fn,
                    bool python_mode) {
  if (python_mode) return true;
  if (ts.stack.empty() || !ts.stack.back().python_mode || ts.stack.back().op < 0) return false;
  const OpRecord& outer = s.data.ops[static_cast<size_t>(ts.stack.back().op)];
  return std::strcmp(base_name(s.data.names[static_cast<size_t>(outer.name)].c_str()),
                     base_name(fn.name())) == 0;
}

// Records the free of each watched resident storage released since the last check, at `op`.
// Caller holds s.mu.
void check_watched(Session& s, int64_t op, int32_t thread) {
  for (size_t i = 0; i < s.watched.size();) {
    if (!s.watched[i].keep.expired()) {
      ++i;
      continue;
    }
    AllocRecord rec;
    rec.storage = s.watched[i].id;
    rec.nbytes = s.watched[i].nbytes;
    rec.op = op;
    rec.is_free = true;
    rec.thread = thread;
    s.data.allocs.push_back(rec);
    s.watched.erase(s.watched.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

int64_t since_start_ns(const Session& s) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              s.t0)
             .count() -
         s.skipped_ns.load(std::memory_order_relaxed);
}

int64_t thread_cpu_ns(const ThreadState& ts) {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return -1;
  return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec - ts.skipped_cpu_ns;
}

constexpr char kDetach[] = "aten::detach";

// Under a TorchDispatchMode torch unpacks a backward node's saved *output*
// (torch/csrc/autograd/saved_variable.cpp: saved as tensor_data(), re-wrapped by make_variable)
// through TensorImpl::shallow_copy_and_detach, which with a mode on the stack hands the detach
// to the mode's interpreter (c10/core/TensorImpl.cpp): the mode's handler runs with the mode
// popped and its func(*args) records an aten::detach straight under the node, one per such
// node, that a run without the mode never makes (ReluBackward0, TanhBackward0,
// LogSoftmaxBackward0, the SDPA backwards). A detach the node itself calls goes through the
// dispatcher with the mode still on the stack ("PythonDispatchMode" below it). So a detach
// under a node that began with a mode on the stack, begun with none and with no mode frame
// below it, nothing allocated or first seen inside it and only its own subtree after it, is
// dropped. `node`: the frame below it. Caller holds s.mu.
bool is_mode_unpack_detach(const Session& s, const ThreadState& ts, const Frame& frame,
                           const Frame* node, const OpRecord& rec) {
  if (frame.mode_active || frame.saw_mode || rec.phase != Phase::kBackward || rec.parent < 0 ||
      node == nullptr || node->transparent || node->op != rec.parent || !node->mode_active) {
    return false;
  }
  if (s.data.names[static_cast<size_t>(rec.name)] != kDetach) return false;
  const OpRecord& parent = s.data.ops[static_cast<size_t>(rec.parent)];
  if (parent.scope != static_cast<uint8_t>(at::RecordScope::BACKWARD_FUNCTION)) return false;
  if (s.data.allocs.size() != frame.allocs_at_start ||
      s.data.externals.size() != frame.externals_at_start) {
    return false;
  }
  for (size_t i = static_cast<size_t>(rec.id); i < s.data.ops.size(); ++i) {
    if (s.data.ops[i].thread != ts.thread) return false;
  }
  return true;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  Session* sp = g_session;
  if (sp == nullptr || !g_active.load(std::memory_order_relaxed)) return nullptr;
  Session& s = *sp;
  ThreadState& ts = thread_state(s);
  const int64_t t_start = since_start_ns(s);
  const int64_t cpu_start = thread_cpu_ns(ts);
  int64_t parent = ts.stack.empty() ? -1 : ts.stack.back().op;
  const bool is_node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  // The engine wraps each node in "autograd::engine::evaluate_function: X" (FUNCTION scope);
  // the gradient reductions it runs after the node belong to the backward pass too.
  const bool is_backward_fn =
      is_node || (parent == -1 && std::strncmp(fn.name(), kEngineRoot, sizeof(kEngineRoot) - 1) == 0);
  int32_t module;
  if (!ts.stack.empty()) {
    module = ts.stack.back().module;
  } else if (!ts.modules.empty()) {
    module = ts.modules.back();
  } else {
    module = -1;
  }
  Phase phase = static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
  if (is_backward_fn || ts.backward_depth > 0) phase = Phase::kBackward;

  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.watched.empty()) check_watched(s, parent, ts.thread);
  const bool python_mode = std::strcmp(fn.name(), kPythonMode) == 0;
  if (is_transparent(s, ts, fn, python_mode)) {
    Frame frame{parent, module, false, false};
    frame.transparent = true;
    frame.python_mode = python_mode;
    frame.saw_mode = python_mode;
    ts.stack.push_back(frame);
    ++ts.transparent_depth;
    return nullptr;
  }
  if (is_node && fn.seqNr() >= 0) {
    // A backward node carries its forward op's sequence number: it belongs to that op's module.
    auto it = s.seq_module.find(fn.seqNr());
    if (it != s.seq_module.end()) {
      module = it->second;
      if (!ts.stack.empty() && ts.stack.back().backward && ts.stack.back().module == -1) {
        ts.stack.back().module = module;
        s.data.ops[static_cast<size_t>(parent)].module = module;
      }
    }
  }
  OpRecord rec;
  rec.id = static_cast<int64_t>(s.data.ops.size());
  rec.parent = parent;
  rec.name = intern(s.name_index, s.data.names, fn.name());
  rec.overload = intern(s.name_index, s.data.names, fn.overload_name());
  rec.module = module;
  rec.seq_nr = fn.seqNr();
  rec.phase = phase;
  rec.scope = static_cast<uint8_t>(fn.scope());
  rec.thread = ts.thread;
  rec.depth = static_cast<int32_t>(ts.stack.size()) - ts.transparent_depth;
  rec.t_start_ns = t_start;
  rec.cpu_start_ns = cpu_start;
  if (!s.timing_only) {
    auto inputs = fn.inputs();
    rec.inputs.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) record_value(s, inputs[i], rec.inputs[i]);
  }
  if (!is_backward_fn && phase != Phase::kBackward && rec.seq_nr >= 0 && module >= 0) {
    s.seq_module.emplace(rec.seq_nr, module);
  }
  // Below an op with a CUDA kernel the meta device runs decompositions CUDA never runs; muting
  // the observer there skips their recording and the dispatcher's argument boxing (the bulk of
  // the tracing cost). Storage events inside are still recorded, attributed to this op.
  bool muted = false;
  const bool kernel = fn.scope() == at::RecordScope::FUNCTION && has_cuda_kernel(s, fn);
  rec.kernel = kernel;
  if (!s.record_all && kernel) {
    at::disableCallback(s.handle);
    muted = true;
  }
  Frame frame{rec.id, module, is_backward_fn, muted};
  frame.mode_active = c10::impl::TorchDispatchModeTLS::stack_len() > 0;
  frame.allocs_at_start = s.data.allocs.size();
  frame.externals_at_start = s.data.externals.size();
  ts.stack.push_back(frame);
  if (is_backward_fn) ++ts.backward_depth;
  s.data.ops.push_back(std::move(rec));
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  Session* sp = g_session;
  if (sp == nullptr) return;
  Session& s = *sp;
  ThreadState& ts = thread_state(s);
  if (ts.stack.empty()) return;  // entered before this trace started
  Frame frame = ts.stack.back();
  ts.stack.pop_back();
  if (frame.saw_mode && !ts.stack.empty()) ts.stack.back().saw_mode = true;
  if (frame.transparent) {
    --ts.transparent_depth;
    return;
  }
  if (frame.muted) at::reenableCallback(s.handle);
  if (frame.backward) --ts.backward_depth;
  std::lock_guard<std::mutex> lock(s.mu);
  OpRecord& rec = s.data.ops[static_cast<size_t>(frame.op)];
  if (std::uncaught_exceptions() > 0) {
    // The innermost op that was unwinding is the one that failed.
    if (!s.failure.present) {
      s.failure.present = true;
      s.failure.op = s.data.names[static_cast<size_t>(rec.name)];
      s.failure.module = rec.module;
    }
    rec.t_end_ns = since_start_ns(s);
    rec.cpu_end_ns = thread_cpu_ns(ts);
    return;
  }
  if (is_mode_unpack_detach(s, ts, frame, ts.stack.empty() ? nullptr : &ts.stack.back(), rec)) {
    const int64_t wall = since_start_ns(s) - rec.t_start_ns;
    const int64_t cpu = thread_cpu_ns(ts) - rec.cpu_start_ns;
    if (wall > 0) s.skipped_ns.fetch_add(wall, std::memory_order_relaxed);
    if (rec.cpu_start_ns >= 0 && cpu > 0) ts.skipped_cpu_ns += cpu;
    s.data.ops.resize(static_cast<size_t>(frame.op));  // the record and its subtree
    return;
  }
  if (!s.timing_only) {
    const auto& outputs = fn.outputs();
    rec.outputs.resize(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) record_value(s, outputs[i], rec.outputs[i]);
  }
  rec.t_end_ns = since_start_ns(s);
  rec.cpu_end_ns = thread_cpu_ns(ts);
}

void record_storage_event(AllocCtx* ctx, bool is_free) {
  if (!g_active.load()) return;
  std::lock_guard<std::mutex> guard(g_session_mu);
  Session* sp = g_session;
  if (sp == nullptr || ctx->generation != g_generation.load()) return;
  Session& s = *sp;
  ThreadState& ts = thread_state(s);
  std::lock_guard<std::mutex> lock(s.mu);
  AllocRecord rec;
  rec.storage = ctx->id;
  rec.nbytes = ctx->nbytes;
  rec.op = ts.stack.empty() ? -1 : ts.stack.back().op;
  rec.is_free = is_free;
  rec.thread = ts.thread;
  s.data.allocs.push_back(rec);
}

void delete_ctx(void* raw) {
  auto* ctx = static_cast<AllocCtx*>(raw);
  if (ctx == nullptr || ctx->magic != kCtxMagic) return;
  record_storage_event(ctx, /*is_free=*/true);
  delete ctx;
}

// Meta storages hold no data; this allocator hands out a null data pointer like the stock meta
// allocator, with a context that identifies the storage so its free can be recorded.
class RecordingMetaAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device device(c10::DeviceType::Meta);
    // The CUDA caching allocator hands out nothing for zero bytes; neither do we.
    if (nbytes == 0 || !g_active.load()) return c10::DataPtr(nullptr, device);
    auto* ctx = new AllocCtx{kCtxMagic, g_generation.load(), 0, static_cast<int64_t>(nbytes)};
    {
      std::lock_guard<std::mutex> guard(g_session_mu);
      Session* sp = g_session;
      if (sp == nullptr) {
        delete ctx;
        return c10::DataPtr(nullptr, device);
      }
      std::lock_guard<std::mutex> lock(sp->mu);
      ctx->id = sp->next_storage++;
    }
    record_storage_event(ctx, /*is_free=*/false);
    return c10::DataPtr(nullptr, ctx, &delete_ctx, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}
};

RecordingMetaAllocator g_allocator;

}  // namespace

void start(bool record_all, bool timing_only) {
  std::lock_guard<std::mutex> guard(g_session_mu);
  BLINK_CHECK(g_session == nullptr,
              "a blink trace is already running in this process; finish it before starting another");
  auto* s = new Session();
  s->record_all = record_all;
  s->timing_only = timing_only;
  s->t0 = std::chrono::steady_clock::now();
  s->previous_allocator = c10::GetAllocator(c10::DeviceType::Meta);
  g_generation.fetch_add(1);
  g_phase.store(static_cast<uint8_t>(Phase::kForward));
  g_session = s;
  t_state = ThreadState();
  t_state.generation = g_generation.load();
  t_state.thread = s->next_thread++;
  // FUNCTION covers every dispatcher op; BACKWARD_FUNCTION the autograd nodes, which carry the
  // forward op's sequence number. Thread-local callbacks travel with at::ThreadLocalState into
  // the autograd engine's worker threads, so backward work on other threads is seen too.
  s->handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&on_enter, &on_exit)
          .needsInputs(!timing_only)
          .needsOutputs(!timing_only)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  c10::SetAllocator(c10::DeviceType::Meta, &g_allocator, kAllocatorPriority);
  g_active.store(true);
}

TraceData stop() {
  Session* s;
  {
    std::lock_guard<std::mutex> guard(g_session_mu);
    BLINK_CHECK(g_session != nullptr, "no blink trace is running");
    s = g_session;
    g_active.store(false);
    at::removeCallback(s->handle);
    c10::SetAllocator(c10::DeviceType::Meta, s->previous_allocator, kAllocatorPriority);
    g_session = nullptr;
  }
  TraceData out;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    out = std::move(s->data);
  }
  delete s;
  t_state = ThreadState();
  return out;
}

bool active() { return g_active.load(); }

void push_module(const std::string& path) {
  std::lock_guard<std::mutex> guard(g_session_mu);
  Session* s = g_session;
  if (s == nullptr) return;
  ThreadState& ts = thread_state(*s);
  std::lock_guard<std::mutex> lock(s->mu);
  ts.modules.push_back(intern(s->module_index, s->data.modules, path.c_str()));
}

void pop_module() {
  std::lock_guard<std::mutex> guard(g_session_mu);
  Session* s = g_session;
  if (s == nullptr) return;
  ThreadState& ts = thread_state(*s);
  if (!ts.modules.empty()) ts.modules.pop_back();
}

void set_phase(Phase phase) { g_phase.store(static_cast<uint8_t>(phase)); }

int64_t register_external(const at::Tensor& t, bool watch) {
  std::lock_guard<std::mutex> guard(g_session_mu);
  Session* s = g_session;
  BLINK_CHECK(s != nullptr, "no blink trace is running");
  std::lock_guard<std::mutex> lock(s->mu);
  TensorInfo info;
  info.device_type = static_cast<int8_t>(t.device().type());
  storage_of(*s, t, info);
  if (watch && info.storage < 0 && t.has_storage()) {
    const bool known = std::any_of(s->watched.begin(), s->watched.end(),
                                   [&](const Session::Watched& w) { return w.id == info.storage; });
    if (!known) {
      s->watched.push_back(Session::Watched{info.storage, info.storage_nbytes,
                                            t.storage().getWeakStorageImpl()});
    }
  }
  return info.storage;
}

Failure last_failure() {
  std::lock_guard<std::mutex> guard(g_session_mu);
  Session* s = g_session;
  if (s == nullptr) return Failure();
  std::lock_guard<std::mutex> lock(s->mu);
  Failure f = s->failure;
  if (f.present && f.module >= 0) f.module_path = s->data.modules[static_cast<size_t>(f.module)];
  return f;
}

}  // namespace tracer
}  // namespace blink
