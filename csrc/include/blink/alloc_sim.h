#pragma once
// A torch-free simulator of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
// DeviceCachingAllocator) for one device. It replays malloc/free events and reports the
// statistics torch.cuda.memory_stats() would report, without a GPU.
//
// Modelled: 512 B rounding, the small (<= 1 MiB) and large pools, segment sizing
// (get_allocation_size), best fit by (stream, size, address), the split rules, merging of free
// neighbours inside a segment, per-stream pools, an optional device capacity with torch's
// "release all fully free cached segments and retry" OOM path, and expandable segments
// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True). Not modelled: cross-stream uses
// (recordStream / events), CUDA graph private pools, max_split_size_mb,
// roundup_power2_divisions, garbage_collection_threshold, set_per_process_memory_fraction.
// See csrc/core/alloc_sim.cpp for the rule-by-rule notes.
#include <cstdint>
#include <memory>
#include <vector>

#include "blink/error.h"

namespace blink {

struct AllocSimOptions {
  bool expandable_segments = false;
  int64_t capacity_bytes = 0;  // bytes the allocator may reserve on the device; 0 = unlimited
};

struct AllocSimStats {
  int64_t allocated_bytes = 0;       // sum of (rounded) sizes of live blocks
  int64_t reserved_bytes = 0;        // cudaMalloc'd segments, or mapped pages (expandable)
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t num_segments = 0;          // live segments (expandable: segments with a mapped page)
  int64_t num_device_mallocs = 0;    // cudaMalloc calls, or page-mapping calls (expandable)
  int64_t num_ooms = 0;              // mallocs that failed after the release-and-retry
  int64_t num_alloc_retries = 0;     // retries after releasing cached segments
};

struct AllocEvent {
  int64_t id;
  int64_t size;  // ignored for frees
  bool is_free;
  int stream = 0;
};

class CachingAllocatorSim {
 public:
  explicit CachingAllocatorSim(AllocSimOptions opts = {});
  ~CachingAllocatorSim();
  CachingAllocatorSim(CachingAllocatorSim&&) noexcept;
  CachingAllocatorSim& operator=(CachingAllocatorSim&&) noexcept;
  CachingAllocatorSim(const CachingAllocatorSim&) = delete;
  CachingAllocatorSim& operator=(const CachingAllocatorSim&) = delete;

  // Allocates `size` bytes on `stream` under the handle `id`. Returns false on OOM (only possible
  // with a capacity): the allocation is not made, num_ooms is counted and last_malloc_oom() is
  // set. Throws blink::Error when `id` is live or `size` is negative or absurdly large.
  bool malloc(int64_t id, int64_t size, int stream = 0);
  // Frees a live allocation. Throws blink::Error for an id that is not live.
  void free(int64_t id);
  // torch.cuda.empty_cache(): release every fully free cached segment (expandable: unmap every
  // fully free page).
  void empty_cache();
  // torch.cuda.reset_peak_memory_stats(): peaks become the current values.
  void reset_peak_stats();
  AllocSimStats stats() const;
  // Rounded size of the block behind a live allocation (may exceed the rounded request when
  // the remainder of a cached block was too small to split). Throws for an id that is not live.
  int64_t block_size(int64_t id) const;
  // Whether the most recent malloc() call failed with OOM.
  bool last_malloc_oom() const;
  // Number of live allocations.
  int64_t num_live() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Replays `events` on a fresh simulator. A malloc that fails with OOM is recorded (num_ooms) and
// the matching later free of that id is skipped. A free of an id never allocated, or a malloc of
// a live id, throws blink::Error.
AllocSimStats simulate_allocations(const std::vector<AllocEvent>& events,
                                   AllocSimOptions opts = {});

}  // namespace blink
