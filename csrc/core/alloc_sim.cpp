// Simulator of PyTorch's CUDA caching allocator, one device. The rules follow
// c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator) with the default
// PYTORCH_CUDA_ALLOC_CONF; the constants are those of c10/core/AllocatorConfig.h in the torch 2.14
// headers (large_segment_size defaults to kLargeBuffer, max_split_size to unlimited). Function
// names in the comments are torch's, so each rule can be checked against the source.
//
// Addresses: torch orders free blocks by (stream, size, pointer). Real cudaMalloc pointers are
// unknowable, so every new segment gets a higher address than all earlier ones (older segments
// win size ties) and a block's address is (segment number, offset in segment).
//
// Capacity: a cudaMalloc or a page mapping fails exactly when it would push the reserved bytes
// past capacity_bytes (no driver overhead, other processes or physical fragmentation).
//
// Expandable segments (expandable_segments:True) are modelled as torch does them: per pool and
// stream one segment of virtual address space (totalGlobalMem * 9/8, rounded to pages) whose
// pages are mapped on demand, page = kSmallBuffer (2 MiB) in the small pool and kLargeBuffer
// (20 MiB) in the large pool; a request that fits no free block maps the pages it overlaps in
// the lowest run of free/unmapped space, normally the shortfall at the mapped end rounded up to
// pages (find_expandable_block / try_allocate_expandable_block / map_block); every split leaves
// any remainder >= 512 B; empty_cache and the OOM path unmap the whole pages inside free blocks
// (unmap_block), and a segment left entirely unmapped is dropped. Simplified: totalGlobalMem is
// capacity_bytes (2^52 B when unlimited), which only matters for best-fit ties between blocks
// that border unmapped holes; torch never raises its segment.all.current stat for expandable
// memory, so num_segments counts the segments with at least one mapped page instead (what
// torch.cuda.memory_snapshot() lists when the mapping has no holes); num_device_mallocs counts
// map_block calls, as torch's num_device_alloc does.
#include "blink/alloc_sim.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace blink {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kMinBlockSize = 512;        // all sizes are rounded to at least 512 bytes
constexpr int64_t kSmallSize = 1 * kMiB;      // largest "small" allocation is 1 MiB
constexpr int64_t kSmallBuffer = 2 * kMiB;    // "small" allocations are packed in 2 MiB blocks
constexpr int64_t kMinLargeAlloc = 10 * kMiB; // allocations between 1 and 10 MiB use kLargeBuffer
constexpr int64_t kRoundLarge = 2 * kMiB;     // round up large allocations to 2 MiB
constexpr int64_t kLargeBuffer = 20 * kMiB;   // "large" allocations may be packed in 20 MiB
// Stand-in for totalGlobalMem when there is no capacity: sizes the expandable address space.
constexpr int64_t kUnlimitedMemory = int64_t{1} << 52;
// Larger requests are rejected: they would overflow the rounding and the address space above.
constexpr int64_t kMaxRequest = int64_t{1} << 52;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// round_size(): below kMinBlockSize -> kMinBlockSize, else up to a multiple of kMinBlockSize
// (roundup_power2_divisions is off by default).
int64_t round_size(int64_t size) {
  return size < kMinBlockSize ? kMinBlockSize : round_up(size, kMinBlockSize);
}

// get_allocation_size(): the cudaMalloc size of a new segment for a rounded request.
int64_t allocation_size(int64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

// find_expandable_block(): an expandable segment maps pages of kSmallBuffer in the small pool and
// kLargeBuffer in the large pool.
int64_t page_size(bool small) { return small ? kSmallBuffer : kLargeBuffer; }

enum class State : uint8_t { kAllocated, kFree, kUnmapped };

struct Block {
  int64_t seg;   // segment number (higher = created later = higher address)
  int64_t off;   // offset inside the segment
  int64_t size;
  int32_t prev;  // neighbours in the segment, -1 at its ends
  int32_t next;
  int stream;
  State state;
  bool small;
};

// BlockComparatorSize: (stream, size, address).
struct FreeKey {
  int stream;
  int64_t size;
  int64_t seg;
  int64_t off;
  int32_t idx;
  bool operator<(const FreeKey& o) const {
    if (stream != o.stream) return stream < o.stream;
    if (size != o.size) return size < o.size;
    if (seg != o.seg) return seg < o.seg;
    return off < o.off;
  }
};

// BlockComparatorAddress: (stream, address), for unmapped expandable ranges.
struct AddrKey {
  int stream;
  int64_t seg;
  int64_t off;
  int32_t idx;
  bool operator<(const AddrKey& o) const {
    if (stream != o.stream) return stream < o.stream;
    if (seg != o.seg) return seg < o.seg;
    return off < o.off;
  }
};

struct Pool {
  std::set<FreeKey> free;        // BlockPool::blocks: cached free (mapped) blocks
  std::set<AddrKey> unmapped;    // BlockPool::unmapped: unmapped expandable address ranges
  // The free blocks release_cached_blocks() can act on: whole free segments, or (expandable)
  // free blocks holding at least one whole page. Kept so that the OOM path does not scan every
  // free block; whether a block qualifies cannot change while it sits in `free`.
  std::set<FreeKey> releasable;
};

struct Segment {
  int64_t mapped = 0;  // bytes backed by memory (the whole segment when not expandable)
};

}  // namespace

struct CachingAllocatorSim::Impl {
  AllocSimOptions opts;
  std::vector<Block> blocks;     // arena; indices are stable while a block lives
  std::vector<int32_t> spare;    // dead arena slots
  std::vector<Segment> segments; // indexed by segment number, never reused
  Pool pools[2];                 // [0] large pool, [1] small pool
  std::unordered_map<int64_t, int32_t> live;
  AllocSimStats st;
  bool last_oom = false;

  explicit Impl(AllocSimOptions o) : opts(o) {
    BLINK_CHECK(o.capacity_bytes >= 0, "capacity_bytes must be >= 0 (0 = unlimited)");
  }

  int32_t new_block(int64_t seg, int64_t off, int64_t size, int stream, bool small, State s) {
    Block b{seg, off, size, -1, -1, stream, s, small};
    if (!spare.empty()) {
      int32_t i = spare.back();
      spare.pop_back();
      blocks[i] = b;
      return i;
    }
    BLINK_CHECK(blocks.size() < static_cast<size_t>(INT32_MAX), "allocator simulator: too many blocks");
    blocks.push_back(b);
    return static_cast<int32_t>(blocks.size() - 1);
  }

  FreeKey free_key(int32_t i) const {
    const Block& b = blocks[i];
    return FreeKey{b.stream, b.size, b.seg, b.off, i};
  }
  AddrKey addr_key(int32_t i) const {
    const Block& b = blocks[i];
    return AddrKey{b.stream, b.seg, b.off, i};
  }
  Pool& pool_of(int32_t i) { return pools[blocks[i].small ? 1 : 0]; }
  bool releasable(int32_t i) const {
    const Block& b = blocks[i];
    if (!opts.expandable_segments) return b.prev < 0 && b.next < 0;
    const int64_t page = page_size(b.small);
    return round_up(b.off, page) < (b.off + b.size) / page * page;
  }
  void insert_free(int32_t i) {
    Pool& p = pool_of(i);
    p.free.insert(free_key(i));
    if (releasable(i)) p.releasable.insert(free_key(i));
  }
  void erase_free(int32_t i) {
    Pool& p = pool_of(i);
    p.free.erase(free_key(i));
    p.releasable.erase(free_key(i));
  }
  void insert_unmapped(int32_t i) { pool_of(i).unmapped.insert(addr_key(i)); }
  void erase_unmapped(int32_t i) { pool_of(i).unmapped.erase(addr_key(i)); }

  void add_reserved(int64_t bytes) {
    st.reserved_bytes += bytes;
    st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
  }

  // Places `mid` between the linked blocks `before` and `after` (either may be -1).
  void splice(int32_t mid, int32_t before, int32_t after) {
    blocks[mid].prev = before;
    blocks[mid].next = after;
    if (before >= 0) blocks[before].next = mid;
    if (after >= 0) blocks[after].prev = mid;
  }

  // try_merge_blocks(): `dst` (in no set) absorbs its neighbour `src` when src is in the same
  // state, free or unmapped. Neighbours only exist inside one segment, so segments never merge.
  void try_merge(int32_t dst, int32_t src) {
    if (src < 0) return;
    const State s = blocks[src].state;
    if (s == State::kAllocated || s != blocks[dst].state) return;
    if (s == State::kFree) {
      erase_free(src);
    } else {
      erase_unmapped(src);
    }
    Block& d = blocks[dst];
    const Block& o = blocks[src];
    if (d.prev == src) {
      d.off = o.off;
      d.prev = o.prev;
      if (d.prev >= 0) blocks[d.prev].next = dst;
    } else {
      d.next = o.next;
      if (d.next >= 0) blocks[d.next].prev = dst;
    }
    d.size += o.size;
    spare.push_back(src);
  }

  // The size an expandable free block can reach by mapping the unmapped range after it.
  int64_t expandable_size(int32_t i) const {
    const Block& b = blocks[i];
    if (b.next >= 0 && blocks[b.next].state == State::kUnmapped) return b.size + blocks[b.next].size;
    return b.size;
  }

  // get_free_block(): best fit, the first block in (stream, size, address) order on this stream
  // with size >= the request. With expandable segments torch then steps forward while the next
  // candidate's expandable_size is smaller, so a block that could grow into the unmapped tail is
  // only used when nothing else fits.
  int32_t get_free_block(bool small, int stream, int64_t size) {
    std::set<FreeKey>& fs = pools[small ? 1 : 0].free;
    auto it = fs.lower_bound(FreeKey{stream, size, INT64_MIN, INT64_MIN, 0});
    if (it == fs.end() || it->stream != stream) return -1;
    if (opts.expandable_segments) {
      auto nx = std::next(it);
      while (nx != fs.end() && nx->stream == stream &&
             expandable_size(nx->idx) < expandable_size(it->idx)) {
        it = nx++;
      }
    }
    const int32_t i = it->idx;
    erase_free(i);
    return i;
  }

  // should_split(): small pool (and every pool with expandable segments) splits a remainder of at
  // least kMinBlockSize; the large pool only a remainder above kSmallSize (max_split_size unset).
  bool should_split(int32_t i, int64_t size) const {
    const int64_t remaining = blocks[i].size - size;
    if (blocks[i].small || opts.expandable_segments) return remaining >= kMinBlockSize;
    return remaining > kSmallSize;
  }

  // alloc_found_block(): the front `size` bytes become the allocation, the rest stays cached.
  int32_t alloc_found_block(int32_t i, int64_t size) {
    int32_t a = i;
    if (should_split(i, size)) {
      const Block r = blocks[i];
      a = new_block(r.seg, r.off, size, r.stream, r.small, State::kAllocated);
      splice(a, r.prev, i);
      blocks[i].off += size;
      blocks[i].size -= size;
      insert_free(i);
    } else {
      blocks[i].state = State::kAllocated;
    }
    // allocated_bytes counts block->size, the (rounded, possibly unsplit) block.
    st.allocated_bytes += blocks[a].size;
    st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
    return a;
  }

  bool fits(int64_t bytes) const {
    return opts.capacity_bytes == 0 || bytes <= opts.capacity_bytes - st.reserved_bytes;
  }

  // alloc_block(), classic path: one cudaMalloc of get_allocation_size() bytes, a new segment.
  int32_t alloc_segment(bool small, int stream, int64_t alloc_size) {
    if (!fits(alloc_size)) return -1;  // cudaErrorMemoryAllocation
    const int64_t seg = static_cast<int64_t>(segments.size());
    segments.push_back(Segment{alloc_size});
    add_reserved(alloc_size);
    st.num_segments += 1;
    st.num_device_mallocs += 1;
    return new_block(seg, 0, alloc_size, stream, small, State::kFree);
  }

  // find_expandable_block(): the lowest-address unmapped range on this stream (together with the
  // free block just before it) whose run of free/unmapped blocks holds `size` bytes; otherwise a
  // new segment whose address space covers totalGlobalMem * 9/8.
  int32_t find_expandable_block(bool small, int stream, int64_t size) {
    std::set<AddrKey>& um = pools[small ? 1 : 0].unmapped;
    for (auto it = um.lower_bound(AddrKey{stream, INT64_MIN, INT64_MIN, 0});
         it != um.end() && it->stream == stream; ++it) {
      int32_t c = it->idx;
      const int32_t p = blocks[c].prev;
      if (p >= 0 && blocks[p].state == State::kFree) c = p;
      int64_t bytes = 0;
      for (int32_t b = c; bytes < size && b >= 0 && blocks[b].state != State::kAllocated;
           b = blocks[b].next) {
        bytes += blocks[b].size;
      }
      if (bytes >= size) return c;
    }
    const int64_t total = opts.capacity_bytes > 0 ? std::min(opts.capacity_bytes, kUnlimitedMemory)
                                                  : kUnlimitedMemory;
    const int64_t va = round_up(total + total / 8, page_size(small));
    const int64_t seg = static_cast<int64_t>(segments.size());
    segments.push_back(Segment{0});
    const int32_t c = new_block(seg, 0, va, stream, small, State::kUnmapped);
    insert_unmapped(c);
    return c;
  }

  // map_block(): maps the pages covering the first `size` bytes of unmapped block i (size rounded
  // up to the page), splits off the still-unmapped rest and merges with free neighbours.
  bool map_block(int32_t i, int64_t size) {
    const int64_t bytes = round_up(size, page_size(blocks[i].small));
    if (!fits(bytes)) return false;  // cuMemCreate fails; the call's pages are rolled back
    erase_unmapped(i);
    blocks[i].state = State::kFree;
    if (bytes < blocks[i].size) {
      const Block b = blocks[i];
      const int32_t r = new_block(b.seg, b.off + bytes, b.size - bytes, b.stream, b.small,
                                  State::kUnmapped);
      splice(r, i, b.next);
      insert_unmapped(r);
      blocks[i].size = bytes;
    }
    const int64_t seg = blocks[i].seg;
    try_merge(i, blocks[i].prev);
    try_merge(i, blocks[i].next);
    insert_free(i);
    if (segments[seg].mapped == 0) st.num_segments += 1;
    segments[seg].mapped += bytes;
    add_reserved(bytes);
    st.num_device_mallocs += 1;
    return true;
  }

  // try_allocate_expandable_block(): map the candidate, then keep mapping the unmapped range after
  // it (by the shortfall, rounded to pages) until the merged free block holds `size` bytes.
  int32_t alloc_expandable(bool small, int stream, int64_t size) {
    int32_t c = find_expandable_block(small, stream, size);
    if (blocks[c].state == State::kUnmapped && !map_block(c, std::min(blocks[c].size, size))) {
      return -1;
    }
    while (blocks[c].size < size) {
      const int32_t n = blocks[c].next;
      BLINK_CHECK(n >= 0 && blocks[n].state == State::kUnmapped,
                  "allocator simulator: broken expandable segment");
      if (!map_block(n, std::min(size - blocks[c].size, blocks[n].size))) return -1;
      c = n;  // n absorbed c
    }
    erase_free(c);
    return c;
  }

  int32_t alloc_block(bool small, int stream, int64_t size) {
    if (opts.expandable_segments) return alloc_expandable(small, stream, size);
    return alloc_segment(small, stream, allocation_size(size));
  }

  // unmap_block(): unmap the whole pages inside free block i; partial pages at its ends stay
  // mapped as free blocks.
  void unmap_block(int32_t i) {
    const int64_t page = page_size(blocks[i].small);
    const Block b = blocks[i];
    const int64_t begin = round_up(b.off, page);
    const int64_t end = (b.off + b.size) / page * page;
    if (begin >= end) return;
    erase_free(i);
    if (begin > b.off) {
      const int32_t f = new_block(b.seg, b.off, begin - b.off, b.stream, b.small, State::kFree);
      splice(f, blocks[i].prev, i);
      insert_free(f);
    }
    if (b.off + b.size > end) {
      const int32_t f = new_block(b.seg, end, b.off + b.size - end, b.stream, b.small, State::kFree);
      splice(f, i, blocks[i].next);
      insert_free(f);
    }
    blocks[i].off = begin;
    blocks[i].size = end - begin;
    blocks[i].state = State::kUnmapped;
    try_merge(i, blocks[i].prev);
    try_merge(i, blocks[i].next);
    insert_unmapped(i);
    st.reserved_bytes -= end - begin;
    segments[b.seg].mapped -= end - begin;
    if (segments[b.seg].mapped == 0) st.num_segments -= 1;
  }

  // release_cached_blocks() / release_blocks(), large pool then small pool: cudaFree every
  // segment that is one whole free block; with expandable segments unmap the free pages and drop
  // segments left wholly unmapped. Torch visits every free block; the ones skipped here (not in
  // `releasable`) are exactly those it leaves untouched, and the result does not depend on the
  // visiting order.
  void release_cached_blocks() {
    for (int p : {0, 1}) {
      std::vector<int32_t> todo;
      todo.reserve(pools[p].releasable.size());
      for (const FreeKey& k : pools[p].releasable) todo.push_back(k.idx);
      for (int32_t i : todo) {
        if (!opts.expandable_segments) {
          erase_free(i);
          st.reserved_bytes -= blocks[i].size;
          segments[blocks[i].seg].mapped = 0;
          st.num_segments -= 1;
          spare.push_back(i);
          continue;
        }
        unmap_block(i);
        if (blocks[i].state == State::kUnmapped && blocks[i].prev < 0 && blocks[i].next < 0) {
          erase_unmapped(i);  // release_expandable_segment()
          spare.push_back(i);
        }
      }
    }
  }

  bool malloc(int64_t id, int64_t size, int stream) {
    BLINK_CHECK(size >= 0, "allocator simulator: negative size " + std::to_string(size) +
                               " for id " + std::to_string(id));
    BLINK_CHECK(size <= kMaxRequest, "allocator simulator: size " + std::to_string(size) +
                                         " is beyond the simulated address space");
    BLINK_CHECK(live.find(id) == live.end(),
                "allocator simulator: id " + std::to_string(id) + " is already allocated");
    last_oom = false;
    const int64_t rsize = round_size(size);
    const bool small = rsize <= kSmallSize;  // get_pool()
    int32_t b = get_free_block(small, stream, rsize);
    if (b < 0) {
      b = alloc_block(small, stream, rsize);
      if (b < 0) {
        // release_available_cached_blocks() is a no-op without max_split_size; then
        // release_cached_blocks() and a counted retry (alloc_block(isRetry=true)).
        release_cached_blocks();
        st.num_alloc_retries += 1;
        b = alloc_block(small, stream, rsize);
      }
      if (b < 0) {
        st.num_ooms += 1;
        last_oom = true;
        return false;
      }
    }
    live.emplace(id, alloc_found_block(b, rsize));
    return true;
  }

  // free() / free_block(): back to the pool, merged with free neighbours in its segment.
  void free(int64_t id) {
    auto it = live.find(id);
    BLINK_CHECK(it != live.end(),
                "allocator simulator: free of unknown id " + std::to_string(id));
    const int32_t i = it->second;
    live.erase(it);
    st.allocated_bytes -= blocks[i].size;
    blocks[i].state = State::kFree;
    const int32_t p = blocks[i].prev;
    const int32_t n = blocks[i].next;
    try_merge(i, p);
    try_merge(i, n);
    insert_free(i);
  }
};

CachingAllocatorSim::CachingAllocatorSim(AllocSimOptions opts)
    : impl_(std::make_unique<Impl>(opts)) {}
CachingAllocatorSim::~CachingAllocatorSim() = default;
CachingAllocatorSim::CachingAllocatorSim(CachingAllocatorSim&&) noexcept = default;
CachingAllocatorSim& CachingAllocatorSim::operator=(CachingAllocatorSim&&) noexcept = default;

bool CachingAllocatorSim::malloc(int64_t id, int64_t size, int stream) {
  return impl_->malloc(id, size, stream);
}
void CachingAllocatorSim::free(int64_t id) { impl_->free(id); }
void CachingAllocatorSim::empty_cache() { impl_->release_cached_blocks(); }
void CachingAllocatorSim::reset_peak_stats() {
  impl_->st.peak_allocated_bytes = impl_->st.allocated_bytes;
  impl_->st.peak_reserved_bytes = impl_->st.reserved_bytes;
}
AllocSimStats CachingAllocatorSim::stats() const { return impl_->st; }
int64_t CachingAllocatorSim::block_size(int64_t id) const {
  auto it = impl_->live.find(id);
  BLINK_CHECK(it != impl_->live.end(),
              "allocator simulator: block_size of unknown id " + std::to_string(id));
  return impl_->blocks[it->second].size;
}
bool CachingAllocatorSim::last_malloc_oom() const { return impl_->last_oom; }
int64_t CachingAllocatorSim::num_live() const { return static_cast<int64_t>(impl_->live.size()); }

AllocSimStats simulate_allocations(const std::vector<AllocEvent>& events, AllocSimOptions opts) {
  CachingAllocatorSim sim(opts);
  std::unordered_set<int64_t> failed;  // ids whose malloc hit OOM; their frees are skipped
  for (const AllocEvent& e : events) {
    if (e.is_free) {
      if (failed.erase(e.id) > 0) continue;
      sim.free(e.id);
    } else if (sim.malloc(e.id, e.size, e.stream)) {
      failed.erase(e.id);
    } else {
      failed.insert(e.id);
    }
  }
  return sim.stats();
}

}  // namespace blink
