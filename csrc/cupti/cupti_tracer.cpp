#include "cupti_tracer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <cxxabi.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "blink/error.h"

#if !defined(CUPTI_API_VERSION) || CUPTI_API_VERSION < 18
#error "blink._cupti needs the CUPTI headers of CUDA 12.0 or newer (CUPTI_API_VERSION >= 18)"
#endif

namespace blink {
namespace cupti {
namespace {

// Record layouts only grow at the end from one version to the next, so reading the records of a
// newer library through these layouts is safe for every field used here (checked for CUDA 13.0:
// CUpti_ActivityKernel10 / Memcpy6 keep the offsets of Kernel9 / Memcpy5 for those fields). The
// current structs of the headers are used: CUDA 13 moved the older ones to
// cupti_activity_deprecated.h, which a later release may drop.
#if CUPTI_API_VERSION >= 130000
using KernelActivity = CUpti_ActivityKernel10;
using MemcpyActivity = CUpti_ActivityMemcpy6;
#else
using KernelActivity = CUpti_ActivityKernel9;
using MemcpyActivity = CUpti_ActivityMemcpy5;
#endif
using MemsetActivity = CUpti_ActivityMemset4;

[[noreturn]] void fail(CUptiResult status, const char* call, const char* file, int line) {
  const char* text = nullptr;
  if (cuptiGetResultString(status, &text) != CUPTI_SUCCESS || text == nullptr) {
    text = "unknown CUPTI error";
  }
  throw Error(std::string(call) + " failed: " + text + " (CUPTI status " +
              std::to_string(static_cast<int>(status)) + ", " + file + ":" +
              std::to_string(line) + ")");
}

// Every CUPTI call goes through this check; a failure becomes a blink::Error naming the call.
#define BLINK_CUPTI_CHECK(call)                                         \
  do {                                                                  \
    CUptiResult blink_cupti_status_ = (call);                           \
    if (blink_cupti_status_ != CUPTI_SUCCESS) {                         \
      ::blink::cupti::fail(blink_cupti_status_, #call, __FILE__, __LINE__); \
    }                                                                   \
  } while (0)

constexpr CUpti_ExternalCorrelationKind kCorrelationKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

struct Buffer {
  uint8_t* data;
  size_t valid;
};

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

struct Session {
  std::mutex mu;  // guards everything below
  std::deque<OpRecord> ops;
  std::vector<std::string> errors;
  std::map<std::pair<const char*, const char*>, bool> unit_cache;  // (name, overload) pointers
  std::unordered_set<std::string> extra_unit_ops;
  std::unordered_map<std::thread::id, int32_t> threads;
  std::vector<CUpti_ActivityKind> enabled;
  at::CallbackHandle handle = 0;
  std::thread::id owner;
  uint64_t start_ns = 0;
};

// The session is a static object, reset at each start, so that an observer callback that races
// a stop never sees freed memory; the generation tells a stale callback to do nothing.
Session g_session;
std::mutex g_lifecycle_mu;  // start/stop
std::atomic<bool> g_active{false};
std::atomic<uint64_t> g_generation{0};
std::atomic<int> g_phase{0};
std::atomic<int64_t> g_buffer_bytes{8 << 20};

// Completed activity buffers: the CUPTI callback only queues them under this lock; they are
// parsed at stop(), outside it. g_owned holds the buffers this module handed to CUPTI and not yet
// got back: the buffer callbacks are process-wide, so a buffer requested through another
// client's callbacks (torch.profiler's kineto) could come back through ours; it is never ours to
// parse or free.
std::mutex g_buffers_mu;
std::vector<Buffer> g_completed;
std::unordered_set<uint8_t*> g_owned;
std::atomic<uint64_t> g_dropped{0};
std::atomic<uint64_t> g_foreign{0};  // buffers returned to us that we did not allocate
std::vector<std::string> g_callback_errors;  // guarded by g_buffers_mu

void record_error(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_session.mu);
  if (g_session.errors.size() < 16) g_session.errors.push_back(what);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  const size_t bytes = static_cast<size_t>(g_buffer_bytes.load());
  // Activity buffers must be 8-byte aligned; a failed allocation makes CUPTI drop records,
  // which stop() reports through the dropped count.
  uint8_t* data = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, bytes));
  if (data != nullptr) {
    std::lock_guard<std::mutex> lock(g_buffers_mu);
    g_owned.insert(data);
  }
  *buffer = data;
  *size = data == nullptr ? 0 : bytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid) {
  size_t dropped = 0;
  std::string error;
  try {
    BLINK_CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(context, stream, &dropped));
  } catch (const Error& e) {
    error = e.what();
  }
  g_dropped.fetch_add(dropped);
  std::lock_guard<std::mutex> lock(g_buffers_mu);
  if (buffer != nullptr) {
    if (g_owned.erase(buffer) > 0) {
      g_completed.push_back(Buffer{buffer, valid});
    } else {
      g_foreign.fetch_add(1);  // another client's buffer: leave it (and its memory) alone
    }
  }
  if (!error.empty() && g_callback_errors.size() < 16) g_callback_errors.push_back(error);
}

void free_buffers(std::vector<Buffer>& buffers) {
  for (const Buffer& b : buffers) std::free(b.data);
  buffers.clear();
}

// True for ops that are cost units: an own CUDA kernel (cached per schema) or a rule name.
bool is_unit_op(Session& s, const at::RecordFunction& fn) {
  const std::pair<const char*, const char*> key(fn.name(), fn.overload_name());
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.unit_cache.find(key);
    if (it != s.unit_cache.end()) return it->second;
  }
  auto name = fn.operator_name();
  if (!name) return false;  // not a dispatcher op (a user scope): never a unit, never cached
  bool unit = false;
  if (auto handle = c10::Dispatcher::singleton().findSchema(*name)) {
    unit = handle->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
  }
  std::lock_guard<std::mutex> lock(s.mu);
  if (!unit) unit = s.extra_unit_ops.count(fn.name()) > 0;
  s.unit_cache.emplace(key, unit);
  return unit;
}

void append_sizes(const at::Tensor& t, std::string& out) {
  // Sparse, nested or symbolic tensors have no plain sizes; the dry run records none either.
  if (t.is_nested() || t.layout() != c10::kStrided ||
      t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return;
  }
  auto sizes = t.sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(sizes[i]);
  }
}

bool on_cuda(const at::Tensor& t) { return t.defined() && t.device().is_cuda(); }

// Input shapes in the matching-key format of blink/collect/match.py (shapes_key), and whether
// any tensor is on a CUDA device. Mirrors the argument kinds the dry-run tracer distinguishes.
void describe(c10::ArrayRef<const c10::IValue> inputs, OpRecord& rec) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    if (i) rec.shapes += ';';
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      append_sizes(t, rec.shapes);
      if (!rec.dtypes.empty()) rec.dtypes += ',';
      rec.dtypes += std::to_string(static_cast<int>(t.scalar_type()));
      rec.touches_cuda = rec.touches_cuda || on_cuda(t);
    } else if (v.isTensorList()) {
      rec.shapes += '[';
      bool first = true;
      for (const at::Tensor& t : v.toTensorVector()) {
        if (!first) rec.shapes += ',';
        first = false;
        if (t.defined()) {
          append_sizes(t, rec.shapes);
          rec.touches_cuda = rec.touches_cuda || on_cuda(t);
        } else {
          rec.shapes += '-';
        }
      }
      rec.shapes += ']';
    } else if (v.isIntList() || v.isBoolList() || v.isDoubleList()) {
      continue;
    } else if (v.isList()) {
      rec.shapes += '[';
      bool first = true;
      for (const c10::IValue& e : v.toListRef()) {
        if (!first) rec.shapes += ',';
        first = false;
        if (e.isTensor() && e.toTensor().defined()) {
          append_sizes(e.toTensor(), rec.shapes);
          rec.touches_cuda = rec.touches_cuda || on_cuda(e.toTensor());
        } else {
          rec.shapes += '-';
        }
      }
      rec.shapes += ']';
    }
  }
}

bool outputs_on_cuda(const std::vector<c10::IValue>& outputs) {
  for (const c10::IValue& v : outputs) {
    if (v.isTensor() && on_cuda(v.toTensor())) return true;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (on_cuda(t)) return true;
      }
    }
  }
  return false;
}

int32_t thread_index(Session& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  auto id = std::this_thread::get_id();
  auto it = s.threads.find(id);
  if (it != s.threads.end()) return it->second;
  int32_t index = static_cast<int32_t>(s.threads.size());
  s.threads.emplace(id, index);
  return index;
}

uint64_t timestamp() {
  uint64_t ts = 0;
  BLINK_CUPTI_CHECK(cuptiGetTimestamp(&ts));
  return ts;
}

struct UnitContext : public at::ObserverContext {
  uint64_t generation = 0;
  OpRecord* record = nullptr;  // std::deque keeps references stable across push_back
  uint64_t external = 0;       // the id pushed for it
  bool pushed = false;
  bool muted = false;
};

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!g_active.load(std::memory_order_acquire)) return nullptr;
  if (fn.scope() != at::RecordScope::FUNCTION) return nullptr;
  Session& s = g_session;
  if (!is_unit_op(s, fn)) return nullptr;
  auto ctx = std::make_unique<UnitContext>();
  ctx->generation = g_generation.load();
  OpRecord rec;
  rec.name = fn.name();
  rec.overload = fn.overload_name();
  describe(fn.inputs(), rec);
  rec.thread = thread_index(s);
  rec.phase = g_phase.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    rec.id = static_cast<int64_t>(s.ops.size());
    ctx->external = static_cast<uint64_t>(rec.id) + 1;
    s.ops.push_back(std::move(rec));
    ctx->record = &s.ops.back();
  }
  // Below a unit op nothing else is a unit (outermost only); muting the observer there also
  // spares the nested ops the argument boxing, which keeps the host times close to untraced.
  at::disableCallback(s.handle);
  ctx->muted = true;
  try {
    BLINK_CUPTI_CHECK(cuptiActivityPushExternalCorrelationId(kCorrelationKind, ctx->external));
    ctx->pushed = true;
    const uint64_t start = timestamp();
    std::lock_guard<std::mutex> lock(s.mu);
    ctx->record->start_ns = start;
  } catch (const Error& e) {
    record_error(e.what());
  }
  return ctx;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (raw == nullptr) return;
  auto* ctx = static_cast<UnitContext*>(raw);
  uint64_t end = 0;
  try {
    end = timestamp();
  } catch (const Error& e) {
    record_error(e.what());
  }
  Session& s = g_session;
  if (ctx->muted) at::reenableCallback(s.handle);
  if (ctx->pushed) {
    uint64_t last = 0;
    try {
      BLINK_CUPTI_CHECK(cuptiActivityPopExternalCorrelationId(kCorrelationKind, &last));
      if (last != ctx->external) {
        record_error("external correlation stack out of order: popped " + std::to_string(last) +
                     ", expected " + std::to_string(ctx->external));
      }
    } catch (const Error& e) {
      record_error(e.what());
    }
  }
  const bool cuda_out = std::uncaught_exceptions() == 0 && outputs_on_cuda(fn.outputs());
  std::lock_guard<std::mutex> lock(s.mu);
  if (ctx->generation != g_generation.load()) return;  // the trace ended meanwhile
  ctx->record->end_ns = end;
  ctx->record->touches_cuda = ctx->record->touches_cuda || cuda_out;
}

std::string demangle(const char* name) {
  if (name == nullptr) return "<unnamed>";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

void disable_all(Session& s, bool check) {
  for (auto it = s.enabled.rbegin(); it != s.enabled.rend(); ++it) {
    if (check) {
      BLINK_CUPTI_CHECK(cuptiActivityDisable(*it));
    } else {
      (void)cuptiActivityDisable(*it);  // best effort while unwinding a failed start
    }
  }
  s.enabled.clear();
}

struct Parsed {
  std::vector<KernelRecord> kernels;
  std::vector<TransferRecord> transfers;
  std::vector<ApiRecord> apis;
  std::vector<std::string> names;
  std::unordered_map<const char*, int32_t> name_index;
  std::unordered_map<uint32_t, uint64_t> external;  // correlation id -> external id
  uint64_t incomplete = 0;
};

// The fields every GPU activity record (kernel, memcpy, memset) shares.
template <typename Out, typename In>
void copy_gpu_span(const In* in, Out& out, Parsed& p) {
  out.start_ns = in->start;
  out.end_ns = in->end;
  out.device = in->deviceId;
  out.stream = in->streamId;
  out.correlation = in->correlationId;
  if (out.end_ns == 0) ++p.incomplete;  // CUPTI had not filled the record in
}

void parse_record(const CUpti_Activity* record, Parsed& p) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const KernelActivity*>(record);
      KernelRecord r;
      auto it = p.name_index.find(k->name);
      if (it == p.name_index.end()) {
        it = p.name_index.emplace(k->name, static_cast<int32_t>(p.names.size())).first;
        p.names.push_back(demangle(k->name));
      }
      r.name = it->second;
      copy_gpu_span(k, r, p);
      r.grid[0] = k->gridX;
      r.grid[1] = k->gridY;
      r.grid[2] = k->gridZ;
      r.block[0] = k->blockX;
      r.block[1] = k->blockY;
      r.block[2] = k->blockZ;
      r.registers = k->registersPerThread;
      r.static_smem = k->staticSharedMemory;
      r.dynamic_smem = k->dynamicSharedMemory;
      p.kernels.push_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const MemcpyActivity*>(record);
      TransferRecord r;
      r.copy_kind = m->copyKind;
      r.bytes = m->bytes;
      copy_gpu_span(m, r, p);
      p.transfers.push_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const MemsetActivity*>(record);
      TransferRecord r;
      r.is_memset = true;
      r.bytes = m->bytes;
      copy_gpu_span(m, r, p);
      p.transfers.push_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      ApiRecord r;
      r.driver = record->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      r.cbid = a->cbid;
      r.start_ns = a->start;
      r.end_ns = a->end;
      r.correlation = a->correlationId;
      r.thread = a->threadId;
      p.apis.push_back(r);
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (e->externalKind == kCorrelationKind) p.external[e->correlationId] = e->externalId;
      break;
    }
    default:
      break;
  }
}

void parse_buffers(std::vector<Buffer>& buffers, Parsed& p) {
  // Own every buffer first so that all are freed even if parsing one fails.
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> owned;
  owned.reserve(buffers.size());
  for (const Buffer& b : buffers) owned.emplace_back(b.data);
  for (const Buffer& b : buffers) {
    CUpti_Activity* record = nullptr;
    while (b.valid > 0) {
      CUptiResult status = cuptiActivityGetNextRecord(b.data, b.valid, &record);
      if (status == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of this buffer
      BLINK_CUPTI_CHECK(status);
      parse_record(record, p);
    }
  }
}

int64_t op_of(const Parsed& p, uint32_t correlation) {
  auto it = p.external.find(correlation);
  return it == p.external.end() || it->second == 0 ? -1 : static_cast<int64_t>(it->second) - 1;
}

}  // namespace

void start(const Options& options) {
  std::lock_guard<std::mutex> guard(g_lifecycle_mu);
  BLINK_CHECK(!g_active.load(), "a blink CUPTI trace is already running in this process");
  BLINK_CHECK(!torch::profiler::impl::profilerEnabled() &&
                  !torch::autograd::profiler::isProfilerEnabledInMainThread(),
              "torch.profiler is active: CUPTI has one activity subscriber per process, so the "
              "blink CUPTI tracer cannot run inside a torch.profiler.profile() block. Exit the "
              "profiler first.");
  BLINK_CHECK(options.buffer_bytes >= (64 << 10) && options.buffer_bytes % 8 == 0,
              "buffer_bytes must be a multiple of 8 and at least 64 KiB");
  Session& s = g_session;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.ops.clear();
    s.errors.clear();
    s.unit_cache.clear();
    s.threads.clear();
    s.extra_unit_ops = std::unordered_set<std::string>(options.extra_unit_ops.begin(),
                                                       options.extra_unit_ops.end());
    s.threads.emplace(std::this_thread::get_id(), 0);
    s.owner = std::this_thread::get_id();
  }
  {
    std::lock_guard<std::mutex> lock(g_buffers_mu);
    free_buffers(g_completed);  // handed back after the last stop (none expected)
    g_callback_errors.clear();
  }
  g_dropped.store(0);
  g_foreign.store(0);
  g_phase.store(0);
  g_buffer_bytes.store(options.buffer_bytes);
  g_generation.fetch_add(1);
  try {
    // Registered at every start: torch.profiler (kineto) registers its own when it runs.
    BLINK_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    std::vector<CUpti_ActivityKind> kinds = {
        CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME,
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET};
    if (options.driver_api) kinds.push_back(CUPTI_ACTIVITY_KIND_DRIVER);
    for (CUpti_ActivityKind kind : kinds) {
      BLINK_CUPTI_CHECK(cuptiActivityEnable(kind));
      s.enabled.push_back(kind);
    }
    s.start_ns = timestamp();
  } catch (...) {
    disable_all(s, /*check=*/false);
    throw;
  }
  // FUNCTION scope only: autograd nodes are not ops, the ATen ops they call are. Thread-local
  // callbacks travel with at::ThreadLocalState into the autograd engine's device threads.
  s.handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                            .needsInputs(true)
                                            .needsOutputs(true)
                                            .scopes({at::RecordScope::FUNCTION}));
  g_active.store(true, std::memory_order_release);
}

Result stop() {
  std::lock_guard<std::mutex> guard(g_lifecycle_mu);
  BLINK_CHECK(g_active.load(), "no blink CUPTI trace is running");
  Session& s = g_session;
  BLINK_CHECK(std::this_thread::get_id() == s.owner,
              "stop the blink CUPTI trace on the thread that started it");
  g_active.store(false, std::memory_order_release);
  at::removeCallback(s.handle);
  Result out;
  uint64_t end_ns = 0;
  std::string failure;
  try {
    end_ns = timestamp();
    disable_all(s, /*check=*/true);
  } catch (const Error& e) {
    failure = e.what();
    disable_all(s, /*check=*/false);
  }
  try {
    // Forced: also hand over buffers that are not full, so that none of ours is left with CUPTI
    // for the next client's callbacks (torch.profiler registers its own). CUPTI calls
    // buffer_completed for each before returning. Done even when a disable failed.
    BLINK_CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  } catch (const Error& e) {
    if (failure.empty()) failure = e.what();
  }
  std::vector<Buffer> buffers;
  {
    std::lock_guard<std::mutex> lock(g_buffers_mu);
    buffers.swap(g_completed);
    for (const std::string& e : g_callback_errors) out.errors.push_back(e);
    g_callback_errors.clear();
  }
  Parsed p;
  try {
    parse_buffers(buffers, p);  // no lock held: the buffers are ours now
  } catch (const Error& e) {
    if (failure.empty()) failure = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    out.ops.assign(std::make_move_iterator(s.ops.begin()), std::make_move_iterator(s.ops.end()));
    s.ops.clear();
    for (const std::string& e : s.errors) out.errors.push_back(e);
    s.errors.clear();
    out.start_ns = s.start_ns;
    g_generation.fetch_add(1);  // under s.mu: a late on_exit now leaves the records alone
  }
  BLINK_CHECK(failure.empty(), "CUPTI trace failed: " + failure);
  if (!out.errors.empty()) {
    std::string msg = "CUPTI trace failed while recording: " + out.errors.front();
    if (out.errors.size() > 1) msg += " (and " + std::to_string(out.errors.size() - 1) + " more)";
    throw Error(msg);
  }
  out.end_ns = end_ns;
  out.dropped = g_dropped.load();
  out.foreign_buffers = g_foreign.load();
  out.incomplete = p.incomplete;
  std::unordered_set<uint32_t> launched;
  for (KernelRecord& k : p.kernels) {
    k.op = op_of(p, k.correlation);
    launched.insert(k.correlation);
  }
  for (TransferRecord& t : p.transfers) {
    t.op = op_of(p, t.correlation);
    launched.insert(t.correlation);
  }
  // API calls: those that launched a recorded activity, and runtime calls made inside a unit op
  // (synchronizations, event records); the driver's own bookkeeping calls are left out.
  for (ApiRecord& a : p.apis) {
    a.op = op_of(p, a.correlation);
    if (launched.count(a.correlation) > 0 || (!a.driver && a.op >= 0)) {
      out.apis.push_back(a);
    }
  }
  out.kernels = std::move(p.kernels);
  out.transfers = std::move(p.transfers);
  out.names = std::move(p.names);
  return out;
}

bool active() { return g_active.load(); }

int64_t op_count() {
  std::lock_guard<std::mutex> lock(g_session.mu);
  return static_cast<int64_t>(g_session.ops.size());
}

void set_phase(int phase) {
  BLINK_CHECK(phase >= 0 && phase <= 2, "phase must be 0 (forward), 1 (backward) or 2 (optimizer)");
  g_phase.store(phase);
}

std::string api_name(bool driver, uint32_t cbid) {
  static std::mutex mu;
  static std::map<std::pair<bool, uint32_t>, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(driver, cbid);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const char* name = nullptr;
  BLINK_CUPTI_CHECK(cuptiGetCallbackName(
      driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name));
  std::string text = name == nullptr ? std::string("?") : std::string(name);
  cache.emplace(key, text);
  return text;
}

int compiled_api_version() { return CUPTI_API_VERSION; }

int library_api_version() {
  uint32_t version = 0;
  BLINK_CUPTI_CHECK(cuptiGetVersion(&version));
  return static_cast<int>(version);
}

}  // namespace cupti
}  // namespace blink
