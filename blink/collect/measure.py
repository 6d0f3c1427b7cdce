"""Measurements of one prepared call: end-to-end time, peak memory, per-unit times.

GPU: CUDA events around samples of back-to-back calls; the caching allocator's peak counters
over one call; the CUPTI tracer for per-unit kernel and launch times.
CPU (the same pipeline, for CI): ``time.perf_counter`` around samples; no memory peaks; per-unit
times are the ops' wall times on the host as torch.profiler records them (CPU activity only) —
i.e. CPU kernel time, not a GPU proxy.
"""
from __future__ import annotations

import gc
import inspect
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .cupti import CuptiTrace, OpTiming, TraceSummary
from .match import shapes_key_profiler
from .presets import Protocol

Call = Callable[..., None]  # call(on_phase=None)


@dataclass
class Timing:
    warmup: int
    calls_per_sample: int
    samples: list[float]  # seconds per call
    timer: str

    def stats(self) -> dict[str, Any]:
        s = sorted(self.samples)
        q = statistics.quantiles(s, n=4, method="inclusive") if len(s) >= 2 else [s[0]] * 3
        return {"warmup": self.warmup, "samples": len(s),
                "calls_per_sample": self.calls_per_sample, "timer": self.timer,
                "time_median_s": statistics.median(s), "time_min_s": s[0], "time_max_s": s[-1],
                "time_p25_s": q[0], "time_p75_s": q[2],
                "time_std_s": statistics.pstdev(s) if len(s) > 1 else 0.0}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Call, device: torch.device, p: Protocol, *, op: bool = False) -> Timing:
    """Warm up, then time samples; a sample repeats the call until it lasts min_sample_s."""
    warmup_s, time_s = (p.op_warmup_s, p.op_time_s) if op else (p.warmup_s, p.time_per_config_s)
    n = 0
    start = time.perf_counter()
    last = 0.0
    while n < p.warmup_min or (time.perf_counter() - start < warmup_s and n < 200):
        t0 = time.perf_counter()
        call()
        _sync(device)
        last = time.perf_counter() - t0
        n += 1
    per_call = max(last, 1e-7)
    k = max(1, min(1000, math.ceil(p.min_sample_s / per_call)))
    samples = int(time_s / (k * per_call))
    samples = max(3, min(p.samples, samples))
    times: list[float] = []
    if device.type == "cuda":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(samples)]
        for a, b in pairs:
            a.record()
            for _ in range(k):
                call()
            b.record()
        _sync(device)
        times = [a.elapsed_time(b) * 1e-3 / k for a, b in pairs]
        return Timing(n, k, times, "cuda_events")
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(k):
            call()
        times.append((time.perf_counter() - t0) / k)
    return Timing(n, k, times, "perf_counter")


_HISTORY_ACTIONS = {"alloc": 0, "free_requested": 1, "free_completed": 2, "segment_alloc": 3,
                    "segment_free": 4, "segment_map": 5, "segment_unmap": 6, "oom": 7,
                    "snapshot": 8}
MAX_HISTORY_EVENTS = 200_000


def measure_memory(call: Call, device: torch.device,
                   history: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Peaks of one call after empty_cache and a peak reset (resident tensors stay). With
    history, the allocator's events of that call: [action, address, size, stream] each."""
    if device.type != "cuda":
        return {}, None
    _sync(device)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    resident = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    record = torch.cuda.memory._record_memory_history
    kwargs: dict[str, Any] = {"context": None, "stacks": "python",
                              "max_entries": MAX_HISTORY_EVENTS}
    if "clear_history" in inspect.signature(record).parameters:
        kwargs["clear_history"] = True
    if history:
        record(enabled="all", **kwargs)
    try:
        call()
        _sync(device)
    finally:
        snap = None
        if history:
            snap = torch.cuda.memory._snapshot()
            record(enabled=None)
    out = {"mem_resident_bytes": resident, "peak_allocated_bytes":
           torch.cuda.max_memory_allocated(device), "peak_reserved_bytes":
           torch.cuda.max_memory_reserved(device), "mem_history": history}
    events = None
    if snap is not None:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        traces = snap.get("device_traces", [])
        raw = traces[idx] if idx < len(traces) else []
        events = {"resident_bytes": resident, "reserved_before_bytes": reserved,
                  "truncated": len(raw) >= MAX_HISTORY_EVENTS,
                  "actions": {v: k for k, v in _HISTORY_ACTIONS.items()},
                  "events": [[_HISTORY_ACTIONS.get(e.get("action"), -1), e.get("addr", 0),
                              e.get("size", 0), e.get("stream", 0)] for e in raw]}
    return out, events


def gpu_trace(call: Call, reps: int, extra_unit_ops: tuple[str, ...]) -> TraceSummary:
    with CuptiTrace(extra_unit_ops) as tr:
        for _ in range(reps):
            tr.mark()
            call(on_phase=tr.set_phase)
    return tr.summary


class _PhaseMarks:
    """on_phase for the profiler: brackets backward / optimizer work in labelled ranges."""

    def __init__(self) -> None:
        self._open: Any = None

    def __call__(self, code: int) -> None:
        from torch.autograd.profiler import record_function

        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
        if code:
            self._open = record_function(f"blink::phase{code}")
            self._open.__enter__()

    def close(self) -> None:
        self(0)


def cuda_kernel_ops() -> set[str]:
    """Names (without overload) of the ops with a CUDA kernel in this torch build (empty for a
    CPU-only build): torch.profiler records no overload, so the CPU cut goes by name."""
    try:
        regs = torch._C._dispatch_get_registrations_for_dispatch_key("CUDA")
    except (AttributeError, RuntimeError):
        return set()
    return {r.split(".")[0] for r in regs}


def cpu_trace(call: Call, reps: int, unit_names: set[str]) -> TraceSummary:
    """Per-unit CPU times from torch.profiler (CPU activity only): the outermost ops whose
    name is a unit op (of the dry run, or with a CUDA kernel), in call order."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    # kineto logs every profiler start / stop ("USDT: ... profiler_start") and, with no GPU, an
    # "ERROR: gpuGetDeviceCount failed" line to stderr; on a CPU run that is noise. It reads the
    # level when the first profiler starts; a level the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    marks = _PhaseMarks()
    with warnings.catch_warnings():
        # torch 2.11 warns that a profiler without a schedule keeps one cycle: that is all we use
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for r in range(reps):
                with record_function(f"blink::rep{r}"):
                    call(on_phase=marks)
                marks.close()
    events = sorted(prof.events(), key=lambda e: (e.time_range.start, -e.time_range.end))
    reps_at = [(e.time_range.start, e.time_range.end) for e in events
               if e.name.startswith("blink::rep")]
    phases = [(e.time_range.start, e.time_range.end, int(e.name[-1])) for e in events
              if e.name.startswith("blink::phase")]
    ops: list[OpTiming] = []
    marks_idx: list[int] = []
    rep = -1
    for e in events:
        if e.name not in unit_names:
            continue
        parent = e.cpu_parent
        nested = False
        while parent is not None:
            if parent.name in unit_names:
                nested = True
                break
            parent = parent.cpu_parent
        if nested:
            continue
        start = e.time_range.start
        while rep + 1 < len(reps_at) and start >= reps_at[rep + 1][0]:
            rep += 1
            marks_idx.append(len(ops))
        phase = next((c for a, b, c in phases if a <= start <= b), 0)
        dur = e.time_range.elapsed_us() * 1e-6
        ops.append(OpTiming(len(ops), e.name, "", shapes_key_profiler(e.input_shapes or []),
                            "", phase, dur, time_s=dur))
    while len(marks_idx) < reps:
        marks_idx.append(len(ops))
    summary = TraceSummary(ops, marks_idx)
    summary.kernel_time_s = sum(o.time_s for o in ops)
    return summary


def split_calls(summary: TraceSummary) -> list[list[OpTiming]]:
    bounds = summary.marks + [len(summary.ops)]
    return [summary.ops[bounds[i]:bounds[i + 1]] for i in range(len(summary.marks))]


def per_unit(summary: TraceSummary) -> tuple[list[OpTiming], list[float | None], str]:
    """One op list for one call: with several traced calls of the same op sequence, each
    position takes the call whose device time is the median there, and reports the spread
    (max - min) / median. Calls that disagree fall back to the first call."""
    calls = [c for c in split_calls(summary) if c]
    if not calls:
        return [], [], ""
    if len(calls) == 1:
        return calls[0], [None] * len(calls[0]), ""
    first = calls[0]
    same = all(len(c) == len(first) and all(a.name == b.name for a, b in zip(c, first, strict=True))
               for c in calls)
    if not same:
        return first, [None] * len(first), "traced calls differ; the first is used"
    out: list[OpTiming] = []
    spread: list[float | None] = []
    for j in range(len(first)):
        column = sorted((c[j] for c in calls), key=lambda o: o.time_s)
        mid = column[(len(column) - 1) // 2]
        out.append(mid)
        lo, hi = column[0].time_s, column[-1].time_s
        spread.append((hi - lo) / mid.time_s if mid.time_s > 0 else None)
    return out, spread, ""
