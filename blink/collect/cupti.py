"""Python side of blink._cupti: availability, the tracing context, and per-op aggregation of
the kernel, memcpy/memset and launch-API records the C++ tracer ties to each unit op."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from .._ext import load as _load_ext
from ..errors import BlinkError

_C = _load_ext()

# Ops that are cost units although the dispatcher gives them no CUDA kernel of their own: the
# one list the dry run's cut uses (unit_rule_ops in csrc/core/cost_model.cpp).
UNIT_BY_RULE: tuple[str, ...] = tuple(_C.unit_rule_ops())

_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")

# torch.profiler's kineto can tear CUPTI down after a profiling session (cuptiFinalize, run from
# a later CUDA call on a helper thread; on by default in some kineto versions). A blink trace
# started soon after a torch.profiler session would race it and lose its records, so processes
# that use this tracer keep CUPTI attached unless told otherwise.
os.environ.setdefault("TEARDOWN_CUPTI", "0")


def load() -> tuple[ModuleType | None, str]:
    """(blink._cupti, "") or (None, why it cannot be used here)."""
    try:
        mod = importlib.import_module("blink._cupti")
    except ImportError as exc:
        return None, (f"blink._cupti is not built ({exc}); it is built where CUDA's CUPTI is "
                      "found (python csrc/cupti/find_cupti.py says why not)")
    return mod, ""


def unavailable_reason() -> str | None:
    """None when CUPTI tracing can run here, else why not."""
    mod, why = load()
    if mod is None:
        return why
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def profiler_active() -> bool:
    prof = getattr(torch.autograd, "profiler", None)
    if prof is not None and getattr(prof, "_is_profiler_enabled", False):
        return True
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except AttributeError:
        return False


@dataclass
class OpTiming:
    """What the GPU did for one unit op (one call)."""

    seq: int
    name: str
    overload: str
    shapes: str
    dtypes: str
    phase: int
    host_s: float                 # the op's span on the host (observer enter to exit)
    time_s: float = 0.0           # kernel + memcpy + memset time on the device
    n_kernels: int = 0
    kernel_s: float = 0.0
    memcpy_n: int = 0
    memcpy_s: float = 0.0
    memcpy_bytes: int = 0
    memset_n: int = 0
    memset_s: float = 0.0
    launch_n: int = 0             # launch API calls (kernel launches, async copies, memsets)
    launch_s: float = 0.0         # their total duration on the host
    launch_delay_s: float = float("nan")  # op start to its first launch call
    span_s: float = 0.0           # first activity start to last activity end on the device
    main_kernel: str = ""         # the longest kernel and its launch geometry
    main_grid: str = ""
    main_block: str = ""
    main_regs: int | None = None
    main_smem_static: int | None = None
    main_smem_dynamic: int | None = None
    start_ns: int = field(default=0, repr=False)  # host clock of the op's start (CUPTI's)


@dataclass
class TraceSummary:
    ops: list[OpTiming]
    marks: list[int]              # op index at which each traced call began
    n_kernels: int = 0
    kernel_time_s: float = 0.0    # all device activity, attributed or not
    unattributed_n: int = 0       # activities launched outside any unit op (reported, kept)
    unattributed_s: float = 0.0
    unattributed_top: str = ""
    dropped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class CuptiTrace:
    """``with CuptiTrace() as t: ...; torch.cuda.synchronize()`` then ``t.summary``."""

    def __init__(self, extra_unit_ops: tuple[str, ...] = UNIT_BY_RULE,
                 driver_api: bool = True) -> None:
        mod, why = load()
        if mod is None:
            raise BlinkError(why)
        if not torch.cuda.is_available():
            raise BlinkError("the CUPTI tracer needs a CUDA device; none is available")
        if profiler_active():
            raise BlinkError("torch.profiler is active: CUPTI has one activity subscriber per "
                             "process, so blink's CUPTI tracer cannot run inside a "
                             "torch.profiler.profile() block")
        self._mod = mod
        self._extra = list(extra_unit_ops)
        self._driver = driver_api
        self.raw: dict[str, Any] | None = None
        self.marks: list[int] = []
        self._summary: TraceSummary | None = None

    def set_phase(self, code: int) -> None:
        self._mod.set_phase(code)

    def mark(self) -> None:
        """Call before each traced call: the op count there splits the record per call."""
        self.marks.append(self._mod.op_count())

    def __enter__(self) -> CuptiTrace:
        torch.cuda.synchronize()
        self._mod.start(extra_unit_ops=self._extra, driver_api=self._driver)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            torch.cuda.synchronize()
        finally:
            self.raw = self._mod.stop()

    @property
    def summary(self) -> TraceSummary:
        if self._summary is None:
            if self.raw is None:
                raise BlinkError("the CUPTI trace has not finished")
            self._summary = summarize(self.raw, self.marks, self._mod.api_name)
        return self._summary


def summarize(raw: dict[str, Any], marks: list[int], api_name: Any) -> TraceSummary:
    """Aggregate the raw records per unit op. Ops that touched no CUDA tensor and launched
    nothing (CPU-side bookkeeping) are left out; device activity outside any op is counted."""
    names: list[str] = raw["names"]
    ops_raw = raw["ops"]
    per_op: dict[int, OpTiming] = {}
    launched: set[int] = set()
    for k in raw["kernels"]:
        launched.add(k[6])
    for t in raw["transfers"]:
        launched.add(t[8])
    kept: list[OpTiming] = []
    index_of: dict[int, int] = {}
    for (oid, name, overload, shapes, dtypes, _thread, phase, cuda, start, end) in ops_raw:
        if not cuda and oid not in launched:
            continue
        op = OpTiming(oid, name, overload, shapes, dtypes, phase, max(0, end - start) * 1e-9,
                      start_ns=start)
        index_of[oid] = len(kept)
        kept.append(op)
        per_op[oid] = op
    spans: dict[int, list[int]] = {}
    longest: dict[int, int] = {}
    summary = TraceSummary(kept, _remap_marks(marks, index_of, len(ops_raw), len(kept)))
    stray: dict[str, float] = {}
    for k in raw["kernels"]:
        (name_i, start, end, _dev, _stream, _corr, oid, grid, block, regs, ssm, dsm) = k
        dur = max(0, end - start) * 1e-9
        summary.n_kernels += 1
        summary.kernel_time_s += dur
        op = per_op.get(oid)
        if op is None:
            summary.unattributed_n += 1
            summary.unattributed_s += dur
            stray[names[name_i]] = stray.get(names[name_i], 0.0) + dur
            continue
        op.n_kernels += 1
        op.kernel_s += dur
        s = spans.setdefault(oid, [start, end])
        s[0], s[1] = min(s[0], start), max(s[1], end)
        if oid not in longest or dur > longest[oid]:
            longest[oid] = dur
            op.main_kernel = names[name_i][:240]
            op.main_grid = ",".join(map(str, grid))
            op.main_block = ",".join(map(str, block))
            op.main_regs, op.main_smem_static, op.main_smem_dynamic = regs, ssm, dsm
    for t in raw["transfers"]:
        (is_memset, _kind, nbytes, start, end, _dev, _stream, _corr, oid) = t
        dur = max(0, end - start) * 1e-9
        summary.kernel_time_s += dur
        op = per_op.get(oid)
        if op is None:
            summary.unattributed_n += 1
            summary.unattributed_s += dur
            label = "memset" if is_memset else "memcpy"
            stray[label] = stray.get(label, 0.0) + dur
            continue
        if is_memset:
            op.memset_n += 1
            op.memset_s += dur
        else:
            op.memcpy_n += 1
            op.memcpy_s += dur
            op.memcpy_bytes += nbytes
        s = spans.setdefault(oid, [start, end])
        s[0], s[1] = min(s[0], start), max(s[1], end)
    launch_names: dict[tuple[bool, int], bool] = {}
    for (driver, cbid, start, end, _corr, _thread, oid) in raw["apis"]:
        op = per_op.get(oid)
        if op is None:
            continue
        key = (driver, cbid)
        if key not in launch_names:
            try:
                name = api_name(driver, cbid)
            except BlinkError:  # a callback id this CUPTI cannot name: not counted as a launch
                name = ""
            launch_names[key] = any(w in name for w in _LAUNCH_WORDS)
        if not launch_names[key]:
            continue
        op.launch_n += 1
        op.launch_s += max(0, end - start) * 1e-9
        delay = (start - op.start_ns) * 1e-9
        if op.launch_delay_s != op.launch_delay_s or delay < op.launch_delay_s:  # NaN or less
            op.launch_delay_s = delay
    for oid, (start, end) in spans.items():
        per_op[oid].span_s = (end - start) * 1e-9
    for op in kept:
        op.time_s = op.kernel_s + op.memcpy_s + op.memset_s
    top = sorted(stray.items(), key=lambda kv: -kv[1])[:3]
    summary.unattributed_top = "; ".join(f"{n[:80]} ({s * 1e6:.1f} us)" for n, s in top)
    summary.dropped = int(raw["dropped"])
    summary.extra = {"incomplete": int(raw["incomplete"]),
                     "foreign_buffers": int(raw.get("foreign_buffers", 0))}
    return summary


def _remap_marks(marks: list[int], index_of: dict[int, int], n_raw: int, n_kept: int) -> list[int]:
    """Marks are raw op indices; turn them into indices of the kept ops."""
    out = []
    for m in marks:
        j = m
        while j < n_raw and j not in index_of:
            j += 1
        out.append(index_of[j] if j < n_raw else n_kept)
    return out
