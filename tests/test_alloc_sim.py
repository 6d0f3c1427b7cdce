"""Tests of the CUDA caching-allocator simulator, blink._C.CachingAllocatorSim.

Every rule of torch's allocator (c10/cuda/CUDACachingAllocator.cpp) has its own test whose numbers
are derived in the test from the rule. The rule tests run on both the C++ simulator and the
pure-Python reference in tests/alloc_reference.py; a randomized test then checks that the two
agree step by step on 2,000 random event sequences. A GPU-only test compares them with torch's
real allocator.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from alloc_reference import STAT_KEYS, ReferenceAllocator, replay

from blink import _C
from blink.errors import BlinkError

KiB = 1 << 10
MiB = 1 << 20

# torch's constants, restated so each test can derive its numbers.
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 * MiB  # kSmallSize: largest small-pool request, and the large-pool split limit
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segment (and expandable small-pool page)
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment for 1-10 MiB requests (and expandable page)
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge


@pytest.fixture(params=["cpp", "reference"])
def make(request):
    """Builds an allocator: the C++ simulator or the Python reference, same API."""
    if request.param == "cpp":
        return _C.CachingAllocatorSim
    return ReferenceAllocator


def test_stats_keys():
    assert set(_C.CachingAllocatorSim().stats()) == set(STAT_KEYS)
    assert set(_C.simulate_allocations([])) == set(STAT_KEYS)
    assert all(v == 0 for v in _C.CachingAllocatorSim().stats().values())


# ---- rounding and pools ---------------------------------------------------------------------


def test_sizes_round_up_to_512_bytes(make):
    a = make()
    expected = {1: 512, 512: 512, 513: 1024, 0: 512, 1000: 1024, 4097: 4608}
    for i, size in enumerate(expected):
        assert a.malloc(i, size)
        assert a.block_size(i) == expected[size]
    s = a.stats()
    assert s["allocated_bytes"] == sum(expected.values())
    # all of them are small requests packed into one 2 MiB segment
    assert s["reserved_bytes"] == SMALL_BUFFER
    assert s["num_segments"] == 1


def test_small_requests_share_2mib_segments(make):
    a = make()
    assert a.malloc(0, 1)  # 1 B -> 512 B block in a new 2 MiB small segment
    s = a.stats()
    assert s["reserved_bytes"] == 2 * MiB
    assert s["num_segments"] == 1 and s["num_device_mallocs"] == 1
    assert a.malloc(1, SMALL_SIZE)  # 1 MiB is still small; 2 MiB - 512 B are left
    assert a.stats()["reserved_bytes"] == 2 * MiB
    assert a.malloc(2, SMALL_SIZE)  # only 1 MiB - 512 B left: a second 2 MiB segment
    s = a.stats()
    assert s["reserved_bytes"] == 4 * MiB
    assert s["num_segments"] == 2 and s["num_device_mallocs"] == 2
    assert s["allocated_bytes"] == 512 + 2 * SMALL_SIZE


@pytest.mark.parametrize("size", [SMALL_SIZE + 1, 5 * MiB, MIN_LARGE_ALLOC - 512])
def test_requests_between_1_and_10_mib_get_20mib_segments(make, size):
    a = make()
    assert a.malloc(0, size)
    rounded = -(-size // MIN_BLOCK) * MIN_BLOCK
    assert a.stats()["reserved_bytes"] == LARGE_BUFFER
    # the rest of the 20 MiB (more than 1 MiB) is split off and cached
    assert a.block_size(0) == rounded
    assert a.stats()["allocated_bytes"] == rounded


def test_two_mid_size_requests_share_one_20mib_segment(make):
    a = make()
    assert a.malloc(0, 5 * MiB) and a.malloc(1, 5 * MiB)
    s = a.stats()
    assert s["reserved_bytes"] == LARGE_BUFFER and s["num_segments"] == 1


@pytest.mark.parametrize(
    "size,segment,block",
    [
        # 10 MiB is not below kMinLargeAlloc: rounded to 2 MiB, exactly 10 MiB
        (10 * MiB, 10 * MiB, 10 * MiB),
        # 10 MiB + 1 -> 10 MiB + 512 B -> 12 MiB segment; 2 MiB - 512 B left (> 1 MiB): split
        (10 * MiB + 1, 12 * MiB, 10 * MiB + 512),
        # 11 MiB -> 12 MiB segment; exactly 1 MiB left: not split, the block is 12 MiB
        (11 * MiB, 12 * MiB, 12 * MiB),
        # 19.5 MiB -> 20 MiB segment; 512 KiB left: not split
        (19 * MiB + 512 * KiB, 20 * MiB, 20 * MiB),
        (33 * MiB + 5, 34 * MiB, 34 * MiB),
    ],
)
def test_large_requests_round_segments_to_2mib(make, size, segment, block):
    a = make()
    assert a.malloc(0, size)
    s = a.stats()
    assert s["reserved_bytes"] == segment
    assert a.block_size(0) == block
    assert s["allocated_bytes"] == block  # allocated_bytes counts the whole block


# ---- best fit and splitting -----------------------------------------------------------------


def test_best_fit_picks_the_smallest_block_that_fits(make):
    a = make()
    assert a.malloc(0, 12 * MiB)  # a 12 MiB segment
    assert a.malloc(1, 16 * MiB)  # a 16 MiB segment
    a.free(1)
    a.free(0)
    # 11 MiB fits both; best fit takes the 12 MiB block (1 MiB left: not split). Taking the
    # 16 MiB block would have split it and left an 11 MiB block.
    assert a.malloc(2, 11 * MiB)
    assert a.block_size(2) == 12 * MiB
    # 15 MiB then fits only the 16 MiB block (1 MiB left: not split)
    assert a.malloc(3, 15 * MiB)
    assert a.block_size(3) == 16 * MiB
    s = a.stats()
    assert s["reserved_bytes"] == 28 * MiB
    assert s["num_device_mallocs"] == 2


def test_large_pool_splits_only_remainders_above_1mib(make):
    a = make()
    assert a.malloc(0, 12 * MiB)
    a.free(0)
    # remainder exactly kSmallSize (1 MiB): the large pool does not split
    assert a.malloc(1, 11 * MiB)
    assert a.block_size(1) == 12 * MiB
    assert a.stats()["allocated_bytes"] == 12 * MiB
    a.free(1)
    # remainder 1 MiB + 512 B: split
    assert a.malloc(2, 11 * MiB - 512)
    assert a.block_size(2) == 11 * MiB - 512
    assert a.stats()["allocated_bytes"] == 11 * MiB - 512
    # the 1 MiB + 512 B remainder is cached and serves a large request of that size
    assert a.malloc(3, SMALL_SIZE + 512)
    s = a.stats()
    assert s["reserved_bytes"] == 12 * MiB and s["num_device_mallocs"] == 1


def test_small_pool_splits_remainders_of_512_bytes(make):
    a = make()
    assert a.malloc(0, SMALL_SIZE)
    # leaves exactly 512 B of the 2 MiB segment: still split off (>= kMinBlockSize)
    assert a.malloc(1, SMALL_SIZE - 512)
    assert a.block_size(1) == SMALL_SIZE - 512
    assert a.malloc(2, 1)  # served by the 512 B remainder, no new segment
    s = a.stats()
    assert s["reserved_bytes"] == SMALL_BUFFER and s["num_segments"] == 1
    assert s["allocated_bytes"] == SMALL_BUFFER


# ---- merging --------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_freed_blocks_merge_within_a_segment(make, order):
    a = make()
    assert a.malloc(0, 2 * MiB)  # a 20 MiB segment, split
    assert a.malloc(1, 2 * MiB)  # from the 18 MiB remainder
    assert a.stats()["num_segments"] == 1
    for i in order:
        a.free(i)
    # the pieces merged back into one 20 MiB block, which serves a 20 MiB request
    assert a.malloc(2, 20 * MiB)
    assert a.block_size(2) == 20 * MiB
    s = a.stats()
    assert s["reserved_bytes"] == 20 * MiB
    assert s["num_segments"] == 1 and s["num_device_mallocs"] == 1
    a.free(2)
    a.empty_cache()  # the segment is one free block again: released
    assert a.stats()["reserved_bytes"] == 0 and a.stats()["num_segments"] == 0


def test_free_blocks_never_merge_across_segments(make):
    a = make()
    assert a.malloc(0, 12 * MiB)
    assert a.malloc(1, 12 * MiB)
    a.free(0)
    a.free(1)
    # two free 12 MiB segments do not make room for 24 MiB: a third segment
    assert a.malloc(2, 24 * MiB)
    s = a.stats()
    assert s["reserved_bytes"] == 48 * MiB
    assert s["num_segments"] == 3


def test_empty_cache_keeps_partly_used_segments(make):
    a = make()
    assert a.malloc(0, 2 * MiB)  # 20 MiB segment, partly used
    assert a.malloc(1, 24 * MiB)  # 24 MiB segment (the 18 MiB left of the first are too few)
    a.free(1)
    a.empty_cache()  # releases the 24 MiB segment only
    s = a.stats()
    assert s["reserved_bytes"] == 20 * MiB and s["num_segments"] == 1


def test_streams_do_not_share_cached_blocks(make):
    a = make()
    assert a.malloc(0, 1, stream=0)
    a.free(0)
    assert a.malloc(1, 1, stream=1)  # stream 0's free segment is not used
    assert a.stats()["reserved_bytes"] == 2 * SMALL_BUFFER
    assert a.malloc(2, 1, stream=0)  # stream 0 reuses its own
    s = a.stats()
    assert s["reserved_bytes"] == 2 * SMALL_BUFFER and s["num_segments"] == 2


# ---- expandable segments --------------------------------------------------------------------


def test_expandable_segments_grow_by_pages(make):
    a = make(expandable_segments=True)
    assert a.malloc(0, 3 * MiB)  # large pool: one 20 MiB page mapped
    s = a.stats()
    assert s["reserved_bytes"] == LARGE_BUFFER and s["num_device_mallocs"] == 1
    assert a.block_size(0) == 3 * MiB
    assert a.malloc(1, 15 * MiB)  # fits the 17 MiB left
    assert a.stats()["reserved_bytes"] == LARGE_BUFFER
    # 2 MiB left, 3 MiB short: the segment grows by one more 20 MiB page
    assert a.malloc(2, 5 * MiB)
    s = a.stats()
    assert s["reserved_bytes"] == 2 * LARGE_BUFFER
    assert s["num_device_mallocs"] == 2 and s["num_segments"] == 1
    # the small pool has its own segment with 2 MiB pages
    assert a.malloc(3, 1)
    assert a.malloc(4, SMALL_SIZE)  # fits the 2 MiB - 512 B left
    assert a.stats()["reserved_bytes"] == 2 * LARGE_BUFFER + SMALL_BUFFER
    assert a.malloc(5, SMALL_SIZE)  # 1 MiB - 512 B left: one more 2 MiB page
    s = a.stats()
    assert s["reserved_bytes"] == 2 * LARGE_BUFFER + 2 * SMALL_BUFFER
    assert s["num_segments"] == 2 and s["num_device_mallocs"] == 4


def test_expandable_segments_map_whole_pages(make):
    a = make(expandable_segments=True)
    assert a.malloc(0, 50 * MiB)  # ceil(50 / 20) = 3 pages; a classic segment would be 50 MiB
    assert a.stats()["reserved_bytes"] == 3 * LARGE_BUFFER
    assert a.stats()["num_device_mallocs"] == 1


def test_expandable_segments_split_any_remainder(make):
    size = 19 * MiB + 512 * KiB
    classic, expandable = make(), make(expandable_segments=True)
    assert classic.malloc(0, size) and expandable.malloc(0, size)
    # both reserve 20 MiB; the 512 KiB left is split off only with expandable segments
    assert classic.block_size(0) == 20 * MiB
    assert expandable.block_size(0) == size
    assert classic.stats()["reserved_bytes"] == expandable.stats()["reserved_bytes"] == 20 * MiB


def test_expandable_segments_merge_frees_and_unmap_on_empty_cache(make):
    a = make(expandable_segments=True)
    for i in range(3):
        assert a.malloc(i, 10 * MiB)  # 30 MiB -> 2 pages
    assert a.stats()["reserved_bytes"] == 2 * LARGE_BUFFER
    for i in range(3):
        a.free(i)
    assert a.malloc(3, 40 * MiB)  # the merged 40 MiB block, no growth
    s = a.stats()
    assert s["reserved_bytes"] == 40 * MiB and s["num_device_mallocs"] == 2
    a.free(3)
    a.empty_cache()  # every page is free: all unmapped, the segment is gone
    s = a.stats()
    assert s["reserved_bytes"] == 0 and s["num_segments"] == 0
    assert s["peak_reserved_bytes"] == 40 * MiB


def test_expandable_empty_cache_keeps_partly_used_pages(make):
    a = make(expandable_segments=True)
    assert a.malloc(0, 30 * MiB)  # pages [0, 40) MiB
    assert a.malloc(1, 1 * MiB + 512)  # right after it, inside the second page
    a.free(0)
    a.empty_cache()
    # [0, 20) MiB is a whole free page and is unmapped; [20, 40) MiB still holds block 1
    s = a.stats()
    assert s["reserved_bytes"] == LARGE_BUFFER and s["num_segments"] == 1


# ---- capacity and OOM -----------------------------------------------------------------------


def test_capacity_releases_cached_segments_and_retries(make):
    a = make(capacity_bytes=40 * MiB)
    assert a.malloc(0, 12 * MiB) and a.malloc(1, 12 * MiB)  # 24 MiB reserved
    a.free(0)
    # 20 MiB fits no cached block; 24 + 20 > 40, so the free 12 MiB segment is released
    # (12 + 20 <= 40) and the retry succeeds
    assert a.malloc(2, 20 * MiB)
    s = a.stats()
    assert s["reserved_bytes"] == 32 * MiB
    assert s["num_alloc_retries"] == 1 and s["num_ooms"] == 0
    assert s["peak_reserved_bytes"] == 32 * MiB  # 24, down to 12, up to 32
    # 32 + 10 > 40 and nothing is cached: the retry fails too -> OOM
    assert a.malloc(3, 10 * MiB) is False
    s = a.stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 2
    assert s["allocated_bytes"] == 32 * MiB and s["reserved_bytes"] == 32 * MiB


def test_capacity_oom_with_expandable_segments(make):
    a = make(expandable_segments=True, capacity_bytes=40 * MiB)
    assert a.malloc(0, 30 * MiB)  # 2 pages = 40 MiB, the whole capacity
    # 10 MiB are free after it but 15 MiB need one more page: OOM (no whole free page to unmap)
    assert a.malloc(1, 15 * MiB) is False
    s = a.stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 1
    assert s["reserved_bytes"] == 40 * MiB
    a.free(0)
    assert a.malloc(2, 35 * MiB)  # the freed 40 MiB serve it without mapping
    assert a.stats()["num_device_mallocs"] == 1
    a.free(2)
    # 50 MiB needs a third page: fails, the OOM path unmaps the free pages, the retry needs
    # 3 pages (60 MiB > 40 MiB) and fails as well
    assert a.malloc(3, 50 * MiB) is False
    s = a.stats()
    assert s["num_ooms"] == 2 and s["num_alloc_retries"] == 2
    assert s["reserved_bytes"] == 0 and s["num_segments"] == 0


def test_oom_without_capacity_never_happens(make):
    a = make()
    for i in range(50):
        assert a.malloc(i, 100 * MiB)
    s = a.stats()
    assert s["reserved_bytes"] == 5000 * MiB and s["num_ooms"] == 0


# ---- peaks ----------------------------------------------------------------------------------


def test_peaks_and_reset_peak_stats(make):
    a = make()
    assert a.malloc(0, 12 * MiB)
    assert a.malloc(1, 1)
    a.free(0)
    a.empty_cache()
    s = a.stats()
    assert s["allocated_bytes"] == 512 and s["reserved_bytes"] == 2 * MiB
    assert s["peak_allocated_bytes"] == 12 * MiB + 512
    assert s["peak_reserved_bytes"] == 12 * MiB + 2 * MiB
    a.reset_peak_stats()
    s = a.stats()
    assert s["peak_allocated_bytes"] == 512 and s["peak_reserved_bytes"] == 2 * MiB
    assert s["num_device_mallocs"] == 2  # counters are not peaks: unchanged


# ---- errors and the batch API ---------------------------------------------------------------


def test_errors():
    a = _C.CachingAllocatorSim()
    with pytest.raises(BlinkError):
        a.free(7)
    assert a.malloc(7, 100)
    with pytest.raises(BlinkError):
        a.malloc(7, 100)  # id 7 is live
    with pytest.raises(BlinkError):
        a.malloc(8, -1)
    with pytest.raises(BlinkError):
        a.block_size(8)
    a.free(7)
    with pytest.raises(BlinkError):
        a.free(7)  # double free
    with pytest.raises(BlinkError):
        _C.simulate_allocations([(1, 0, True, 0)])
    with pytest.raises(BlinkError):
        _C.simulate_allocations([(1, 10, False, 0), (1, 10, False, 0)])


def test_reference_errors():
    a = ReferenceAllocator()
    with pytest.raises(KeyError):
        a.free(7)
    assert a.malloc(7, 100)
    with pytest.raises(KeyError):
        a.malloc(7, 100)
    with pytest.raises(ValueError):
        a.malloc(8, -1)


def test_simulate_allocations_matches_step_by_step():
    events = [(0, 5 * MiB, False, 0), (1, 100, False, 1), (0, 0, True, 0), (2, 30 * MiB, False, 0),
              (1, 0, True, 1)]
    a = _C.CachingAllocatorSim()
    for id_, size, is_free, stream in events:
        if is_free:
            a.free(id_)
        else:
            assert a.malloc(id_, size, stream)
    assert _C.simulate_allocations(events) == a.stats()


def test_simulate_allocations_skips_frees_of_failed_mallocs():
    events = [(0, 30 * MiB, False, 0), (1, 30 * MiB, False, 0), (1, 0, True, 0),
              (0, 0, True, 0)]
    s = _C.simulate_allocations(events, capacity_bytes=40 * MiB)
    # the second 30 MiB segment would exceed 40 MiB, nothing is cached: OOM; its free is skipped
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 1
    assert s["allocated_bytes"] == 0 and s["reserved_bytes"] == 30 * MiB
    assert s == replay(events, capacity_bytes=40 * MiB)


# ---- randomized comparison with the Python reference ----------------------------------------


def _random_size(r: random.Random) -> int:
    k = r.random()
    if k < 0.35:
        return r.randint(0, 64 * KiB)
    if k < 0.55:
        return r.randint(0, 2 * MiB)
    if k < 0.65:
        return r.choice([0, 1, 511, 512, 513, MiB - 512, MiB, MiB + 1, 2 * MiB, 10 * MiB - 512,
                         10 * MiB, 10 * MiB + 1, 20 * MiB])
    if k < 0.9:
        return r.randint(MiB, 12 * MiB)
    return r.randint(10 * MiB, 45 * MiB)


def _random_case(seed: int, n_ops: int = 80):
    """Options and ops for one random sequence. Ops: ("malloc", id, size, stream),
    ("free", id), ("empty_cache",), ("reset_peak_stats",)."""
    r = random.Random(seed)
    expandable = r.random() < 0.5
    capacity = 0
    if r.random() < 0.6:
        capacity = r.choice([r.randint(4, 40) * MiB, r.randint(40, 400) * MiB,
                             r.randint(1, 30) * MiB + r.randint(0, MiB)])
    n_streams = r.choice([1, 1, 2, 3])
    ops, issued, next_id = [], [], 0
    for _ in range(n_ops):
        k = r.random()
        if k < 0.55 or not issued:
            ops.append(("malloc", next_id, _random_size(r), r.randrange(n_streams)))
            issued.append(next_id)
            next_id += 1
        elif k < 0.97:
            ops.append(("free", issued.pop(r.randrange(len(issued)))))
        elif k < 0.985:
            ops.append(("empty_cache",))
        else:
            ops.append(("reset_peak_stats",))
    return expandable, capacity, ops


def test_random_sequences_match_reference():
    for seed in range(2000):
        expandable, capacity, ops = _random_case(seed)
        cpp = _C.CachingAllocatorSim(expandable_segments=expandable, capacity_bytes=capacity)
        ref = ReferenceAllocator(expandable_segments=expandable, capacity_bytes=capacity)
        ok = {}
        for step, op in enumerate(ops):
            where = f"seed {seed} step {step} op {op} expandable={expandable} capacity={capacity}"
            if op[0] == "malloc":
                _, id_, size, stream = op
                ok[id_] = cpp.malloc(id_, size, stream)
                assert ok[id_] == ref.malloc(id_, size, stream), where
                if ok[id_]:
                    assert cpp.block_size(id_) == ref.block_size(id_), where
            elif op[0] == "free":
                if ok[op[1]]:  # a failed malloc left nothing to free
                    cpp.free(op[1])
                    ref.free(op[1])
            elif op[0] == "empty_cache":
                cpp.empty_cache()
                ref.empty_cache()
            else:
                cpp.reset_peak_stats()
                ref.reset_peak_stats()
            assert cpp.stats() == ref.stats(), where
        # the batch API on the malloc/free events of the same sequence
        events = [(op[1], op[2], False, op[3]) if op[0] == "malloc" else (op[1], 0, True, 0)
                  for op in ops if op[0] in ("malloc", "free")]
        assert _C.simulate_allocations(events, expandable, capacity) == replay(
            events, expandable, capacity), f"simulate_allocations, seed {seed}"


# ---- against torch's real allocator (GPU only) ----------------------------------------------

_TORCH_REPLAY = r"""
import json, sys
import torch
ops = json.loads(sys.stdin.read())
dev = torch.device("cuda", 0)
streams = [torch.cuda.current_stream(dev)] + [torch.cuda.Stream(dev) for _ in range(2)]
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats(dev)
ptrs, out = {}, []
def snap():
    m = torch.cuda.memory_stats(dev)
    out.append([m.get("allocated_bytes.all.current", 0), m.get("reserved_bytes.all.current", 0),
                m.get("allocated_bytes.all.peak", 0), m.get("reserved_bytes.all.peak", 0),
                m.get("segment.all.current", 0), m.get("num_device_alloc", 0)])
snap()
for op in ops:
    if op[0] == "malloc":
        ptrs[op[1]] = torch.cuda.caching_allocator_alloc(op[2], dev, streams[op[3]])
    elif op[0] == "free":
        torch.cuda.caching_allocator_delete(ptrs.pop(op[1]))
    else:
        torch.cuda.empty_cache()
    snap()
print(json.dumps({"stats": out, "total": torch.cuda.get_device_properties(dev).total_memory}))
"""


def _torch_cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _torch_cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("expandable", [False, True])
def test_matches_torch_caching_allocator(expandable):
    """Replays random sequences through torch.cuda.caching_allocator_alloc in a fresh process
    and compares torch.cuda.memory_stats() with the simulator after every op. Classic mode skips
    empty_cache: after cudaFree, new segments can get lower addresses than older ones, which
    changes torch's best-fit tie-breaking but not the simulator's."""
    env = dict(os.environ)
    conf = "expandable_segments:True" if expandable else "expandable_segments:False"
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env["PYTORCH_ALLOC_CONF"] = conf
    for seed in range(8):
        r = random.Random(1000 + seed)
        ops, issued, next_id = [], [], 0
        for _ in range(300):
            k = r.random()
            if k < 0.55 or not issued:
                size = max(1, _random_size(r))  # torch never allocates 0 bytes
                ops.append(("malloc", next_id, size, r.randrange(3)))
                issued.append(next_id)
                next_id += 1
            elif k < 0.98 or not expandable:
                ops.append(("free", issued.pop(r.randrange(len(issued)))))
            else:
                ops.append(("empty_cache",))
        run = subprocess.run([sys.executable, "-c", _TORCH_REPLAY], input=json.dumps(ops),
                             capture_output=True, text=True, env=env, timeout=300, check=True)
        got = json.loads(run.stdout)
        # capacity = the device memory: no OOM in these small runs, and the expandable address
        # space is sized from it as torch sizes it from totalGlobalMem
        sim = _C.CachingAllocatorSim(expandable_segments=expandable, capacity_bytes=got["total"])
        for step, op in enumerate([None, *ops]):
            if op is not None:
                if op[0] == "malloc":
                    assert sim.malloc(op[1], op[2], op[3])
                elif op[0] == "free":
                    sim.free(op[1])
                else:
                    sim.empty_cache()
            s = sim.stats()
            mine = [s["allocated_bytes"], s["reserved_bytes"], s["peak_allocated_bytes"],
                    s["peak_reserved_bytes"], s["num_segments"], s["num_device_mallocs"]]
            theirs = got["stats"][step]
            if expandable:  # torch's segment stat ignores expandable segments
                mine[4] = theirs[4]
            assert mine == theirs, f"seed {seed} step {step} op {op}"
