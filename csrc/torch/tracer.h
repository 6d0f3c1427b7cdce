#pragma once
// The dispatch tracer: a thread-local RecordFunction observer plus a recording allocator for
// the meta device. One trace at a time per process.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "blink/trace_types.h"

namespace blink {
namespace tracer {

struct Failure {
  bool present = false;
  std::string op;
  int32_t module = -1;
  std::string module_path;
};

// Starts observing this thread (and the autograd threads it hands work to). Throws blink::Error
// when a trace is already running. record_all: also record the meta-only decompositions that
// run below ops with a CUDA kernel (for debugging the tracer; slower).
// timing_only: record the call tree and the timestamps but no arguments (the observer then
// asks RecordFunction for no inputs or outputs); used to calibrate what the full recording adds
// to the time between ops.
void start(bool record_all = false, bool timing_only = false);
// Stops observing, restores the previous meta allocator and returns everything recorded.
TraceData stop();
bool active();

// Called from the Python module hooks and the phase markers of the one-call API.
void push_module(const std::string& path);
void pop_module();
void set_phase(Phase phase);

// Gives a tensor that exists before the run (a weight, an input, optimizer state) its external
// storage id now, in call order (-1, -2, ...), so the caller knows which id holds what even if
// no op touches it; a resident storage is resident whether or not an op reads it. Returns the
// id (0 for a tensor without storage; > 0 for one the recording allocator made). watch: the
// run may drop it (a KV cache layer the model replaces with a longer one): when its storage is
// released during the trace, a free of its id is recorded at the op running then.
int64_t register_external(const at::Tensor& t, bool watch = false);

// The innermost op that was unwinding an exception, if any (for error messages).
Failure last_failure();

}  // namespace tracer
}  // namespace blink
