"""Host time as the dry run measured it: calibrating what Blink's own tracer adds.

The dry run executes the user's real Python on this CPU. Every op record carries the time the
RecordFunction observer saw it begin and end (csrc/torch/tracer.cpp), so the time between one
op issued by the caller and the next is the caller's own work: the Python between the calls,
nn.Module.__call__, the torch.nn.functional wrapper, python_arg_parser, the autograd engine's
per-node work in backward and the optimizer's Python loop. blink.predict uses it as each op's
caller-side host time (host_time="measured"; csrc/core/cost_model.cpp), plus the op's CUDA-side
dispatch from the table in csrc/core/roofline.cpp, instead of the meta kernel's own time.

Two things Blink itself adds to those gaps are measured here once per process and subtracted:

- tracer_gap_overhead_s: what the full recording (argument boxing by RecordFunction, the
  observer's copies of shapes and storages) adds to one gap over a timestamp-only observer
  (`blink.trace(timing_only=True)`), on the same workload (an MLP's forward and backward, run
  several times in one trace): the difference of the median gaps. The observer stamps its
  entry before it records arguments and its exit after, so most recording falls inside the
  ops' own spans, which are replaced by the CUDA-side table: measured here at well under 1 us.
  The timestamp-only observer's own cost (~0.2-0.5 us a call) is not removed.
- module_hook_s: one call of Blink's module pre / post hook (a module path pushed or popped),
  from a loop of module calls with and without the hooks (a timestamp-only trace around the
  hooked loop, so this also holds that observer's cost, divided over the two hooks).

- autocast_overhead_s(dtype), for amp-* traces only: what blink.autocast's TorchFunctionMode
  (Python, run before every torch call of the forward pass; CUDA autocast is a C++ dispatch
  key and costs a GPU run well under 1 us) adds per forward op: the total forward gap time of
  the same MLP with and without it (timestamp-only traces), over the ops issued with it.

All depend on this CPU and its load; the workloads are fixed and small (~0.3 s each).

The dry run should be warm, as eager timings are taken after warm-up: a model's first call
pays one-off Python costs (imports, first-call caches) that can triple its gaps. blink.predict
with host_time="measured" therefore traces a warm-up pass first and discards it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["HOST_TIME_MODES", "TracerOverhead", "autocast_overhead_s", "tracer_overhead"]

# measured: the caller's CPU time between ops (robust to a loaded machine: a preempted or
# sleeping thread uses none); wall: the steady clock (also counts sleeps, I/O waits and
# preemption); table: constants, deterministic.
HOST_TIME_MODES = ("measured", "wall", "table")
_BLOCKS = 12
_WIDTH = 64
_RUNS = 5
_HOOK_CALLS = 400


@dataclass(frozen=True)
class TracerOverhead:
    tracer_gap_overhead_s: float
    module_hook_s: float
    full_gap_s: float     # median gap between issued ops, full recording
    timing_gap_s: float   # the same with the timestamp-only observer


def _workload() -> tuple[torch.nn.Module, torch.Tensor]:
    layers: list[torch.nn.Module] = []
    for _ in range(_BLOCKS):
        layers += [torch.nn.Linear(_WIDTH, _WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to("meta"), torch.empty(8, _WIDTH, device="meta")


def _issue_gaps(t: object) -> list[float]:
    """Gaps (s) between consecutive top-level aten ops of thread 0, as cost_model.cpp reads
    them (an op's start minus the previous issued op's end), on the CPU-time clock."""
    gaps = []
    prev_end = None
    ops = t.ops  # type: ignore[attr-defined]
    for op in ops:
        if op.thread != 0 or not op.name.startswith("aten::"):
            continue
        if op.parent >= 0 and ops[op.parent].name.startswith(("aten::", "prims::")):
            continue
        if prev_end is not None:
            gaps.append((op.cpu_start_ns - prev_end) * 1e-9)
        prev_end = op.cpu_end_ns
    return gaps


def _run(net: torch.nn.Module, x: torch.Tensor, timing_only: bool) -> float:
    """Median gap of _RUNS forward + backward passes inside one trace (the first pass warms
    Python's and the dispatcher's first-call caches and is left out)."""
    from .trace import trace

    with trace(net, timing_only=timing_only) as t:
        for _ in range(_RUNS + 1):
            y = net(x)
            y.sum().backward()
    gaps = _issue_gaps(t)
    per_run = len(gaps) // (_RUNS + 1)
    return statistics.median(gaps[per_run:])


@lru_cache(maxsize=1)
def tracer_overhead() -> TracerOverhead:
    """The calibration, measured on first use and then cached for the process."""
    from .trace import trace

    net, x = _workload()
    for p in net.parameters():
        p.requires_grad_(True)
    full_gap, timing_gap = _run(net, x, False), _run(net, x, True)

    mods = [torch.nn.Identity() for _ in range(_HOOK_CALLS)]
    holder = torch.nn.ModuleList(mods)

    def loop() -> float:
        t0 = time.thread_time()
        for m in mods:
            m(x)
        return time.thread_time() - t0

    loop()
    plain = min(loop() for _ in range(_RUNS))
    with trace(holder, timing_only=True):
        hooked = min(loop() for _ in range(_RUNS))
    per_hook = max(0.0, (hooked - plain) / (2 * _HOOK_CALLS))
    return TracerOverhead(max(0.0, full_gap - timing_gap), per_hook, full_gap, timing_gap)


def _forward_gaps(net: torch.nn.Module, x: torch.Tensor,
                  amp: torch.dtype | None) -> tuple[float, int]:
    """(total gap time, issued ops) of one forward pass, the median over _RUNS runs."""
    from contextlib import nullcontext

    from .autocast import meta_autocast
    from .trace import trace

    totals, counts = [], []
    for _ in range(_RUNS + 1):
        with trace(net, timing_only=True) as t:
            with meta_autocast(amp) if amp is not None else nullcontext():
                net(x)
        gaps = _issue_gaps(t)
        totals.append(sum(gaps))
        counts.append(len(gaps) + 1)
    return statistics.median(totals[1:]), counts[-1]


@lru_cache(maxsize=4)
def autocast_overhead_s(dtype: str) -> float:
    """Per forward issue, what blink.autocast's function mode adds for an amp-* dtype
    ("amp-bf16", "amp-fp16"): the forward's total gap time with the mode minus without it,
    over the issued ops with it (its casts included); cached per process."""
    amp = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}[dtype]
    net, x = _workload()
    with torch.no_grad():
        with_mode, issues = _forward_gaps(net, x, amp)
        without, _ = _forward_gaps(net, x, None)
    return max(0.0, (with_mode - without) / max(1, issues))
