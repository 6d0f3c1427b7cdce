// The eager CPU-issue / GPU-execute timeline (see blink/timeline.h).
#include "blink/timeline.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace blink {

std::vector<TimelineEvent> simulate_eager_timeline(const std::vector<double>& host_times,
                                                   const std::vector<double>& gpu_times,
                                                   const std::vector<char>& host_waits) {
  BLINK_CHECK(host_times.size() == gpu_times.size(),
              "simulate_eager_timeline: " + std::to_string(host_times.size()) +
                  " host times but " + std::to_string(gpu_times.size()) + " GPU times");
  BLINK_CHECK(host_waits.empty() || host_waits.size() == host_times.size(),
              "simulate_eager_timeline: " + std::to_string(host_waits.size()) +
                  " wait flags for " + std::to_string(host_times.size()) + " units");
  std::vector<TimelineEvent> events;
  events.reserve(host_times.size());
  double host = 0.0;      // when the host is free to issue the next unit
  double gpu_free = 0.0;  // when the stream finishes the last enqueued kernel
  for (size_t i = 0; i < host_times.size(); ++i) {
    const double h = host_times[i], g = gpu_times[i];
    BLINK_CHECK(std::isfinite(h) && h >= 0.0 && std::isfinite(g) && g >= 0.0,
                "simulate_eager_timeline: unit " + std::to_string(i) +
                    " has a negative or non-finite time");
    TimelineEvent e;
    e.unit = static_cast<int64_t>(i);
    e.host_start = host;
    // A sync: the host's copy returns once the stream has drained.
    e.host_end = (host_waits.empty() || !host_waits[i] ? host : std::max(host, gpu_free)) + h;
    if (g > 0.0) {
      // A stream runs kernels in order: this one starts once it is enqueued and the previous
      // one is done.
      e.gpu_start = std::max(e.host_end, gpu_free);
      e.gpu_end = e.gpu_start + g;
      gpu_free = e.gpu_end;
    } else {
      // No kernel: nothing is enqueued, so the unit neither waits for nor delays the GPU.
      e.gpu_start = e.gpu_end = e.host_end;
    }
    host = e.host_end;
    events.push_back(e);
  }
  return events;
}

double timeline_end_to_end_s(const std::vector<TimelineEvent>& events) {
  double end = 0.0;
  for (const TimelineEvent& e : events) end = std::max(end, std::max(e.host_end, e.gpu_end));
  return end;
}

}  // namespace blink
