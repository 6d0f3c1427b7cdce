"""A slow, simple model of PyTorch's CUDA caching allocator (one device), used to cross-check
the C++ simulator in csrc/core/alloc_sim.cpp.

It is written from the allocator's rules, not from the C++ code: every segment is a list of
pieces (allocated, free or unmapped) kept in address order, every decision is a linear scan,
neighbouring free pieces (and neighbouring unmapped pieces) are coalesced after every change, and
the byte statistics are recomputed from the pieces instead of being kept as running sums.

The rules (torch's c10/cuda/CUDACachingAllocator.cpp, default PYTORCH_CUDA_ALLOC_CONF):
  * a request is rounded up to a multiple of 512 B, and 0 B counts as 512 B;
  * rounded requests up to 1 MiB use the small pool, larger ones the large pool; pools and
    streams never share memory;
  * a request is served from the smallest free piece of its pool and stream that is big enough
    (equal sizes: the lower address, i.e. the older segment, then the lower offset);
  * otherwise a new segment is made: 2 MiB for the small pool, 20 MiB for large requests under
    10 MiB, else the request rounded up to 2 MiB;
  * the piece is split when what is left is >= 512 B (small pool) or > 1 MiB (large pool);
  * a freed piece merges with free neighbours of the same segment only;
  * with a capacity, a segment that would push the reserved bytes past it fails; then every
    segment that is entirely free is released and the segment is tried once more (a retry);
    failing again is an OOM and the request is dropped.
With expandable segments:
  * each pool and stream gets one segment of address space (9/8 of the device memory) backed by
    pages mapped on demand: 2 MiB pages in the small pool, 20 MiB pages in the large pool; the
    reserved bytes are the mapped bytes;
  * any leftover of at least 512 B is split off, in both pools;
  * best fit first skips a free piece that could grow into unmapped space right after it, when the
    next candidate in (size, address) order could not grow as far;
  * when nothing fits, the lowest-address run of free and unmapped pieces that can hold the
    request is used: a run starts at an unmapped piece, or at the free piece right before it; the
    unmapped pages the request overlaps are mapped, one mapping per unmapped piece in address
    order, each failing alone against the capacity;
  * releasing (empty_cache, or the OOM path) unmaps the whole pages inside every free piece, and
    drops a segment whose free pieces all became unmapped space.
"""
from __future__ import annotations

MIB = 1 << 20
ROUND = 512
SMALL_REQUEST_MAX = 1 * MIB
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB
MID_REQUEST_LIMIT = 10 * MIB
LARGE_ROUNDING = 2 * MIB
NO_CAPACITY_MEMORY = 1 << 52  # device memory assumed when there is no capacity

ALLOCATED, FREE, UNMAPPED = "allocated", "free", "unmapped"
STAT_KEYS = (
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "num_segments",
    "num_device_mallocs",
    "num_ooms",
    "num_alloc_retries",
)


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


class _Piece:
    __slots__ = ("start", "size", "state", "segment")

    def __init__(self, start: int, size: int, state: str, segment: _Segment) -> None:
        self.start = start
        self.size = size
        self.state = state
        self.segment = segment

    @property
    def end(self) -> int:
        return self.start + self.size


class _Segment:
    def __init__(self, number: int, small: bool, stream: int, size: int, state: str) -> None:
        self.number = number  # creation order; later segments sit at higher addresses
        self.small = small
        self.stream = stream
        self.pieces = [_Piece(0, size, state, self)]

    def mapped_bytes(self) -> int:
        return sum(p.size for p in self.pieces if p.state != UNMAPPED)

    def index(self, piece: _Piece) -> int:
        return next(i for i, p in enumerate(self.pieces) if p is piece)

    def after(self, piece: _Piece) -> _Piece | None:
        i = self.index(piece)
        return self.pieces[i + 1] if i + 1 < len(self.pieces) else None

    def cut(self, piece: _Piece, at: int) -> _Piece:
        """Split `piece` at absolute offset `at`; returns the back half (same state)."""
        back = _Piece(at, piece.end - at, piece.state, self)
        piece.size = at - piece.start
        self.pieces.insert(self.index(piece) + 1, back)
        return back

    def coalesce(self) -> None:
        out: list[_Piece] = []
        for p in self.pieces:
            if out and p.state != ALLOCATED and out[-1].state == p.state:
                out[-1].size += p.size
            else:
                out.append(p)
        self.pieces = out

    def piece_at(self, start: int) -> _Piece:
        return next(p for p in self.pieces if p.start == start)


class ReferenceAllocator:
    def __init__(self, expandable_segments: bool = False, capacity_bytes: int = 0) -> None:
        self.expandable = expandable_segments
        self.capacity = capacity_bytes
        self.segments: list[_Segment] = []
        self.created = 0
        self.live: dict[int, _Piece] = {}
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.device_mallocs = 0
        self.ooms = 0
        self.retries = 0

    # ---- statistics -------------------------------------------------------------------------
    def _allocated(self) -> int:
        return sum(p.size for p in self.live.values())

    def _reserved(self) -> int:
        return sum(s.mapped_bytes() for s in self.segments)

    def _observe(self) -> None:
        self.peak_allocated = max(self.peak_allocated, self._allocated())
        self.peak_reserved = max(self.peak_reserved, self._reserved())

    def stats(self) -> dict:
        return {
            "allocated_bytes": self._allocated(),
            "reserved_bytes": self._reserved(),
            "peak_allocated_bytes": self.peak_allocated,
            "peak_reserved_bytes": self.peak_reserved,
            "num_segments": sum(1 for s in self.segments if s.mapped_bytes() > 0),
            "num_device_mallocs": self.device_mallocs,
            "num_ooms": self.ooms,
            "num_alloc_retries": self.retries,
        }

    def reset_peak_stats(self) -> None:
        self.peak_allocated = self._allocated()
        self.peak_reserved = self._reserved()

    def block_size(self, id: int) -> int:
        return self.live[id].size

    # ---- helpers ----------------------------------------------------------------------------
    def _room_for(self, nbytes: int) -> bool:
        return self.capacity == 0 or self._reserved() + nbytes <= self.capacity

    def _new_segment(self, small: bool, stream: int, size: int, state: str) -> _Segment:
        seg = _Segment(self.created, small, stream, size, state)
        self.created += 1
        self.segments.append(seg)
        return seg

    def _own(self, small: bool, stream: int) -> list[_Segment]:
        """The segments of one pool and stream, lowest address first."""
        return sorted(
            (s for s in self.segments if s.small == small and s.stream == stream),
            key=lambda s: s.number,
        )

    @staticmethod
    def _page(small: bool) -> int:
        return SMALL_SEGMENT if small else LARGE_SEGMENT

    @staticmethod
    def _reach(piece: _Piece) -> int:
        """How big a free piece can get by mapping the unmapped space right after it."""
        nxt = piece.segment.after(piece)
        return piece.size + (nxt.size if nxt is not None and nxt.state == UNMAPPED else 0)

    def _best_fit(self, small: bool, stream: int, size: int) -> _Piece | None:
        fits = [
            p
            for s in self._own(small, stream)
            for p in s.pieces
            if p.state == FREE and p.size >= size
        ]
        if not fits:
            return None
        fits.sort(key=lambda p: (p.size, p.segment.number, p.start))
        k = 0
        if self.expandable:
            while k + 1 < len(fits) and self._reach(fits[k + 1]) < self._reach(fits[k]):
                k += 1
        return fits[k]

    def _new_classic_segment(self, small: bool, stream: int, size: int) -> _Piece | None:
        if size <= SMALL_REQUEST_MAX:
            seg_size = SMALL_SEGMENT
        elif size < MID_REQUEST_LIMIT:
            seg_size = LARGE_SEGMENT
        else:
            seg_size = _ceil_to(size, LARGE_ROUNDING)
        if not self._room_for(seg_size):
            return None
        seg = self._new_segment(small, stream, seg_size, FREE)
        self.device_mallocs += 1
        self._observe()
        return seg.pieces[0]

    def _run_start(self, small: bool, stream: int, size: int) -> tuple[_Segment, int]:
        """Where expandable growth happens: (segment, start offset) of the first run of
        free/unmapped pieces that holds `size` bytes, or a brand-new segment."""
        for seg in self._own(small, stream):
            for i, p in enumerate(seg.pieces):
                if p.state != UNMAPPED:
                    continue
                first = i - 1 if i > 0 and seg.pieces[i - 1].state == FREE else i
                total = 0
                for q in seg.pieces[first:]:
                    if q.state == ALLOCATED or total >= size:
                        break
                    total += q.size
                if total >= size:
                    return seg, seg.pieces[first].start
        memory = min(self.capacity, NO_CAPACITY_MEMORY) if self.capacity else NO_CAPACITY_MEMORY
        span = _ceil_to(memory + memory // 8, self._page(small))
        return self._new_segment(small, stream, span, UNMAPPED), 0

    def _grow_expandable(self, small: bool, stream: int, size: int) -> _Piece | None:
        seg, start = self._run_start(small, stream, size)
        page = self._page(small)
        stop = start + size
        holes = [p for p in seg.pieces if p.state == UNMAPPED and p.start < stop and p.end > start]
        for hole in holes:
            nbytes = _ceil_to(min(hole.end, stop) - hole.start, page)
            if not self._room_for(nbytes):
                return None
            if nbytes < hole.size:
                seg.cut(hole, hole.start + nbytes)
            hole.state = FREE
            seg.coalesce()
            self.device_mallocs += 1
            self._observe()
        piece = seg.piece_at(start)
        assert piece.state == FREE and piece.size >= size
        return piece

    def _grow(self, small: bool, stream: int, size: int) -> _Piece | None:
        if self.expandable:
            return self._grow_expandable(small, stream, size)
        return self._new_classic_segment(small, stream, size)

    def empty_cache(self) -> None:
        if not self.expandable:
            self.segments = [
                s for s in self.segments if not (len(s.pieces) == 1 and s.pieces[0].state == FREE)
            ]
            return
        keep = []
        for seg in self.segments:
            had_free = any(p.state == FREE for p in seg.pieces)
            page = self._page(seg.small)
            for p in [p for p in seg.pieces if p.state == FREE]:
                lo, hi = _ceil_to(p.start, page), (p.end // page) * page
                if lo >= hi:
                    continue
                middle = seg.cut(p, lo) if lo > p.start else p
                if hi < middle.end:
                    seg.cut(middle, hi)
                middle.state = UNMAPPED
            seg.coalesce()
            if not (had_free and all(p.state == UNMAPPED for p in seg.pieces)):
                keep.append(seg)
        self.segments = keep

    # ---- the API ----------------------------------------------------------------------------
    def malloc(self, id: int, size: int, stream: int = 0) -> bool:
        if size < 0:
            raise ValueError(f"negative size {size}")
        if id in self.live:
            raise KeyError(f"id {id} is live")
        size = max(ROUND, _ceil_to(size, ROUND))
        small = size <= SMALL_REQUEST_MAX
        piece = self._best_fit(small, stream, size)
        if piece is None:
            piece = self._grow(small, stream, size)
            if piece is None:
                self.empty_cache()
                self.retries += 1
                piece = self._grow(small, stream, size)
            if piece is None:
                self.ooms += 1
                return False
        leftover = piece.size - size
        if small or self.expandable:
            split = leftover >= ROUND
        else:
            split = leftover > SMALL_REQUEST_MAX
        if split:
            piece.segment.cut(piece, piece.start + size).state = FREE
        piece.state = ALLOCATED
        self.live[id] = piece
        self._observe()
        return True

    def free(self, id: int) -> None:
        piece = self.live.pop(id)  # KeyError for an unknown id
        piece.state = FREE
        piece.segment.coalesce()


def replay(events: list[tuple[int, int, bool, int]], expandable_segments: bool = False,
           capacity_bytes: int = 0) -> dict:
    """The reference counterpart of blink._C.simulate_allocations: frees of ids whose malloc
    failed with OOM are skipped."""
    ref = ReferenceAllocator(expandable_segments, capacity_bytes)
    failed: set[int] = set()
    for id_, size, is_free, stream in events:
        if is_free:
            if id_ in failed:
                failed.discard(id_)
            else:
                ref.free(id_)
        elif ref.malloc(id_, size, stream):
            failed.discard(id_)
        else:
            failed.add(id_)
    return ref.stats()
