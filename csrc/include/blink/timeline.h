#pragma once
// The eager-PyTorch timeline: one CPU thread issues the units in program order, one CUDA
// stream runs their kernels in the same order. At small batch the GPU waits for the CPU
// (launch-bound) and end-to-end time is the host's; at large batch the CPU runs ahead and it
// is the GPU's.
//
// A unit that synchronises (it copies a device value to the host: .item(), nonzero's count,
// _grouped_mm's offsets) holds the host until the stream has run everything before it.
//
// Not modelled: the launch queue's finite depth (the host blocks once ~1000 launches are
// pending), multiple streams.
#include <cstdint>
#include <vector>

#include "blink/error.h"

namespace blink {

struct TimelineEvent {
  int64_t unit = 0;          // index into the inputs
  double host_start = 0.0;   // the host works on the unit in [host_start, host_end)
  double host_end = 0.0;     // its kernels are enqueued at host_end
  double gpu_start = 0.0;    // max(host_end, previous gpu_end)
  double gpu_end = 0.0;      // gpu_start + gpu time
};

// host_times[i], gpu_times[i]: seconds unit i spends on the CPU (dispatch) and on the GPU
// (kernels; 0 for a unit without kernels, which then never waits for the GPU). Units are issued
// back to back from t = 0. host_waits (empty, or one flag per unit): unit i's host work starts
// only once the GPU has finished every earlier kernel (a device-to-host sync). Throws
// blink::Error for unequal lengths or a negative / non-finite time.
std::vector<TimelineEvent> simulate_eager_timeline(const std::vector<double>& host_times,
                                                   const std::vector<double>& gpu_times,
                                                   const std::vector<char>& host_waits = {});

// End-to-end time of a simulated timeline: the later of the last kernel's end and the host's
// end (trailing host work after the last kernel). 0 for an empty timeline.
double timeline_end_to_end_s(const std::vector<TimelineEvent>& events);

}  // namespace blink
