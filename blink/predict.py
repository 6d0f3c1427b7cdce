"""`blink.predict`: time and memory of an inference forward or a training step on a target GPU.

The trace's units are costed in C++ (csrc/core/cost_model.cpp): analytic per-kernel times on
the eager CPU/GPU timeline, and a replay of the storage events through the CUDA caching-allocator
simulator. Where models/card.json (blink.learned) has a forest for a unit's kind, the C++ core
evaluates it and the unit's time becomes analytic * exp(p) (UnitRow.source "trees"); the timeline
is re-run with the corrected times. With models/conformal.json the interval is split-conformal;
without trained models every number is analytic and the interval is the uncalibrated band below
(Prediction.interval_method says which).
"""
from __future__ import annotations

import bisect
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from math import exp, nan
from typing import Any, NamedTuple

import torch

from .cost import core_gpu_spec
from .dryrun import trace_model
from .errors import BlinkError, ConfigError
from .hardware import GPUSpec, get_gpu
from .hosttime import HOST_TIME_MODES, autocast_overhead_s, tracer_overhead
from .learned import (
    blend_ms,
    conformal_interval,
    gnn_skip_reason,
    image_side,
    load_models,
    model_correction_ms,
    model_summary,
    models_dir,
    train_correction_skip_reason,
    unit_quantile,
)
from .trace import PHASES, RESIDENT_ROLES, Trace, _fmt_bytes, read_json_document

FORMAT_VERSION = 1

# cuBLAS workspace PyTorch allocates through the caching allocator on a handle's first GEMM
# (aten/src/ATen/cuda/CublasHandlePool.cpp, _getWorkspaceSize): 32 MiB from Hopper on, else
# 4096 KiB * 2 + 16 KiB * 8.
def cublas_workspace_bytes(gpu: GPUSpec) -> int:
    if gpu.compute_capability[0] >= 9:
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


# The CUDA context and loaded kernels, outside the caching allocator: what nvidia-smi shows on
# top of reserved memory. A rough figure for CUDA 12/13 with lazy module loading; to be replaced
# by the measured value from the first H200 memory harvest.
CUDA_CONTEXT_BYTES = 512 * 1024 * 1024

# Heuristic band around the analytic estimate until a trained model with conformal intervals
# ships: the lower end is the roofline timeline (no kernel beats its roofline), the upper end
# 1.5x the analytic estimate. Not calibrated against measurements.
_UPPER_FACTOR = 1.5
INTERVAL_METHOD = "roofline lower bound .. 1.5x analytic (uncalibrated: no GPU data yet)"


@dataclass(frozen=True)
class UnitRow:
    op_id: int
    op: str
    module: str | None
    phase: str
    kind: str
    time_ms: float
    roofline_ms: float
    flops: float
    bytes: float
    kernels: int
    math_mode: str
    source: str  # which model produced time_ms: "trees", "analytic" (or "none" when it failed)
    error: str = ""
    analytic_ms: float | None = None  # the analytic time, before any learned correction
    lower_ms: float | None = None     # per-unit conformal interval (trees units with a table)
    upper_ms: float | None = None
    # Why an analytic unit was not timed by a forest (the C++ core decides: blink::Fallback):
    # "no_forest" (none for its kind, or no models), "op_not_fitted" (its forest never saw the
    # op), "other_generation" (the GPU's generation is outside its forest's); "" for trees
    # units and failed ones.
    fallback: str = ""


@dataclass
class Prediction:
    model: str
    gpu: str
    mode: str
    dtype: str
    batch_size: int | None
    seq_len: int | None
    time_ms: float
    lower_ms: float
    upper_ms: float
    host_ms: float
    gpu_busy_ms: float
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    nvidia_smi_bytes: int
    context_bytes: int
    resident_bytes: int
    workspace_bytes: int
    units: list[UnitRow]
    timeline: list[dict[str, Any]] = field(repr=False)
    interval_method: str = INTERVAL_METHOD
    expandable_segments: bool = False
    host_time: str = "table"  # where host time came from: "measured" / "wall" (this CPU), "table"
    gpu_memory_bytes: int = 0
    fits: bool = True
    notes: list[str] = field(default_factory=list)
    # "trees" where forests covered units, "+gnn" / "gnn" where the GNN corrected time_ms,
    # else "analytic"
    predictor: str = "analytic"
    # The memory the run may use, CUDA context included (default: the GPU's); the allocator is
    # replayed against it less the context, so `fits` means the real run would not OOM.
    memory_budget_bytes: int = 0
    alloc_retries: int = 0  # mallocs that fitted only after releasing cached segments
    # Where the replay ran out of memory (fits=False): {"op", "module", "phase", "request_bytes",
    # "reserved_bytes" (reserved when that malloc failed, after the release and retry)}
    oom: dict[str, Any] | None = None
    # Breakdowns: parameters, total FLOPs, the dense peak the dtype's math runs at, memory by
    # category at the peak (MEMORY_CATEGORIES; they sum to nvidia_smi_bytes) and over the step.
    params: int = 0
    flops: float = 0.0
    peak_flops: float = 0.0
    peak_flops_kind: str = ""
    memory_by_category: dict[str, int] = field(default_factory=dict)
    memory_curve: list[dict[str, Any]] = field(default_factory=list, repr=False)
    compiled: bool = False  # costed as torch.compile (Inductor) would run it, see blink.compile
    channels_last: bool = False  # the model and its 4-D inputs ran channels-last (NHWC)
    grad_checkpointing: bool = False  # the model's own activation checkpointing was on
    kv_cache: int | None = None  # a generation step after this many tokens in the KV cache

    # -- breakdowns ------------------------------------------------------------------------
    @property
    def achieved_tflops(self) -> float:
        """FLOPs of the step over its predicted time, in TFLOP/s."""
        return self.flops / (self.time_ms * 1e-3) / 1e12 if self.time_ms > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: achieved FLOP/s over the dense peak of the dtype's math."""
        return self.flops / (self.time_ms * 1e-3) / self.peak_flops \
            if self.time_ms > 0 and self.peak_flops > 0 else 0.0

    def _wall_shares(self) -> list[tuple[str, str | None, str, str, float, float, float]]:
        """(op, module, phase, kind, wall ms, GPU ms, FLOPs) per unit, plus one row per
        host-only timeline entry. Wall ms splits the end-to-end time: each timeline entry owns
        the time by which it moves the step's completion (the later of host and GPU end so far),
        shared among its units by GPU time; so the rows sum to time_ms exactly. An end-to-end
        correction (the GNN's factor on the timeline) scales every share by the same factor."""
        shares: list[tuple[int, float, dict[str, Any]]] = []
        done = 0.0
        for e in self.timeline:  # time order
            end = max(done, e["host_end_s"], e["gpu_end_s"])
            shares.append((e["op_id"], (end - done) * 1e3, e))
            done = end
        scale = self.time_ms / (done * 1e3) if done > 0 else 1.0
        shares = [(i, ms * scale, e) for i, ms, e in shares]
        shares.sort(key=lambda x: x[0])
        ids = [x[0] for x in shares]
        members: list[list[UnitRow]] = [[] for _ in shares]
        orphans: list[UnitRow] = []
        for u in self.units:  # a unit belongs to the entry whose op subtree holds it
            k = bisect.bisect_right(ids, u.op_id) - 1
            (members[k] if k >= 0 else orphans).append(u)
        rows: list[tuple[str, str | None, str, str, float, float, float]] = []
        for (_id, ms, e), us in zip(shares, members, strict=True):
            gpu = sum(u.time_ms for u in us)
            if not us:
                rows.append((e["op"], e["module"], e["phase"], "host only", ms, 0.0, 0.0))
                continue
            for u in us:
                w = ms * (u.time_ms / gpu if gpu > 0 else 1.0 / len(us))
                rows.append((u.op, u.module, u.phase, u.kind, w, u.time_ms, u.flops))
        rows += [(u.op, u.module, u.phase, u.kind, 0.0, u.time_ms, u.flops) for u in orphans]
        return rows

    def breakdown(self, by: str = "op", depth: int = 1) -> list[BreakdownRow]:
        """Where the time goes, by "op", "phase", "module" (module path cut at `depth`) or
        "kind": rows of (key, wall ms, GPU ms, units, FLOPs), largest wall time first (phases in
        step order). Wall ms sums to time_ms; GPU ms to gpu_busy_ms."""
        if by not in BREAKDOWNS:
            raise BlinkError(f"unknown breakdown {by!r}; choose one of {', '.join(BREAKDOWNS)}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise BlinkError(f"depth must be a positive integer, not {depth!r}")
        acc: dict[str, list[float]] = {}
        for op, module, phase, kind, wall, gpu, flops in self._wall_shares():
            if by == "op":
                key = op
            elif by == "phase":
                key = phase
            elif by == "kind":
                key = kind
            else:
                key = "(root)" if not module else ".".join(module.split(".")[:depth])
            row = acc.setdefault(key, [0.0, 0.0, 0, 0.0])
            row[0] += wall
            row[1] += gpu
            row[2] += 0 if kind == "host only" else 1
            row[3] += flops
        out = [BreakdownRow(k, v[0], v[1], int(v[2]), v[3]) for k, v in acc.items()]
        if by == "phase":
            return sorted(out, key=lambda r: PHASES.index(r.key) if r.key in PHASES else 9)
        return sorted(out, key=lambda r: -r.wall_ms)

    # -- views -----------------------------------------------------------------------------
    def by_op(self) -> list[tuple[str, int, float]]:
        """(op, units, total ms) sorted by time."""
        acc: dict[str, list[float]] = {}
        for u in self.units:
            row = acc.setdefault(u.op, [0, 0.0])
            row[0] += 1
            row[1] += u.time_ms
        return sorted(((k, int(v[0]), v[1]) for k, v in acc.items()), key=lambda r: -r[2])

    def by_module(self, depth: int = 1) -> list[tuple[str, float]]:
        acc: dict[str, float] = {}
        for u in self.units:
            key = "(root)" if not u.module else ".".join(u.module.split(".")[:depth])
            acc[key] = acc.get(key, 0.0) + u.time_ms
        return sorted(acc.items(), key=lambda kv: -kv[1])

    def table(self, max_rows: int = 15, by: str = "op", depth: int = 1) -> str:
        """The prediction as text: totals, compute, memory at the peak by category, time by
        phase, and the top `max_rows` rows of breakdown(by, depth)."""
        bound = "launch-bound (CPU)" if self.host_ms >= self.gpu_busy_ms else "GPU-bound"
        batch = "?" if self.batch_size is None else self.batch_size
        mode = f"{self.mode}, compiled" if self.compiled else self.mode
        mode += ", channels-last" if self.channels_last else ""
        mode += ", grad checkpointing" if self.grad_checkpointing else ""
        mode += f", {self.kv_cache} cached tokens" if self.kv_cache else ""
        head = [
            f"blink predict: {self.model} on {self.gpu} ({mode}, {self.dtype}, "
            f"batch {batch}{'' if self.seq_len is None else f', seq {self.seq_len}'})",
            f"  time       {self.time_ms:10.3f} ms   [{self.lower_ms:.3f} .. {self.upper_ms:.3f}]"
            f"  {bound}: host {self.host_ms:.3f} ms, GPU busy {self.gpu_busy_ms:.3f} ms",
        ]
        if self.compiled:
            head.append("  compiled   torch.compile (Inductor) first model: fused pointwise / "
                        "reduction chains, one memory-bound kernel each, no intermediates")
        if self.flops > 0:
            mfu = (f", MFU {100 * self.mfu:.1f}% of {self.peak_flops_kind} dense peak"
                   if self.peak_flops > 0 else "")
            head.append(f"  compute    {_fmt_count(self.params)} params, "
                        f"{_fmt_flops(self.flops)}, achieved "
                        f"{_fmt_flops(self.achieved_tflops * 1e12)}/s{mfu}")
        head.append(
            f"  memory     peak allocated {_fmt_bytes(self.peak_allocated_bytes)}, "
            f"peak reserved {_fmt_bytes(self.peak_reserved_bytes)}, nvidia-smi ~"
            f"{_fmt_bytes(self.nvidia_smi_bytes)} of {_fmt_bytes(self.gpu_memory_bytes)}"
            f"{_budget_text(self.memory_budget_bytes, self.gpu_memory_bytes)}"
            f"{'' if self.fits else '  (DOES NOT FIT: ' + _oom_text(self.oom) + ')'}")
        cats = self.memory_by_category
        if cats:
            parts = [f"{k.replace('_', ' ')} {_fmt_bytes(v)}" for k, v in cats.items() if v]
            head.append("  at peak    " + ", ".join(parts))
        else:
            head.append(f"  resident   {_fmt_bytes(self.resident_bytes)} (weights, inputs and "
                        f"any optimizer state), cuBLAS workspace "
                        f"{_fmt_bytes(self.workspace_bytes)}, CUDA context "
                        f"~{_fmt_bytes(self.context_bytes)}")
        phases = self.breakdown("phase")
        if len(phases) > 1 or self.mode == "train":
            total = self.time_ms or 1.0
            head.append("  phases     " + ", ".join(
                f"{r.key} {r.wall_ms:.3f} ms ({100 * r.wall_ms / total:.0f}%)" for r in phases))
        head.append(f"  interval   {self.interval_method}")
        rows = self.breakdown(by, depth) if by != "phase" else phases
        label = {"op": "op", "phase": "phase", "kind": "kind",
                 "module": f"module (depth {depth})"}[by]
        width = min(max([len(label)] + [len(r.key) for r in rows[:max_rows]]), _MAX_KEY)
        head += ["", f"  {label:<{width}} {'units':>6} {'wall ms':>10} {'GPU ms':>10} "
                     f"{'share':>7}"]
        total = self.time_ms or 1.0
        for r in rows[:max_rows]:
            head.append(f"  {_fit(r.key, width):<{width}} {r.units:>6} {r.wall_ms:>10.3f} "
                        f"{r.gpu_ms:>10.3f} {100 * r.wall_ms / total:>6.1f}%")
        if len(rows) > max_rows:
            rest = rows[max_rows:]
            head.append(f"  {'(' + str(len(rest)) + ' more)':<{width}} "
                        f"{sum(r.units for r in rest):>6} {sum(r.wall_ms for r in rest):>10.3f} "
                        f"{sum(r.gpu_ms for r in rest):>10.3f} "
                        f"{100 * sum(r.wall_ms for r in rest) / total:>6.1f}%")
        for note in self.notes:
            head.append(f"  note: {note}")
        return "\n".join(head)

    def __repr__(self) -> str:
        # Small on purpose: a notebook shows this, and units / timeline can be 100k entries.
        return (f"<blink.Prediction {self.model} on {self.gpu} ({self.mode}, {self.dtype}, "
                f"batch {self.batch_size}{', compiled' if self.compiled else ''}): "
                f"{self.time_ms:.3f} ms, peak reserved {_fmt_bytes(self.peak_reserved_bytes)}, "
                f"{len(self.units)} units>")

    def __str__(self) -> str:
        return self.table()

    # -- export ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = "blink.prediction"
        d["format_version"] = FORMAT_VERSION
        return d

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=None, separators=(",", ":"))
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, source: str | os.PathLike[str]) -> Prediction:
        """Load what to_json wrote (a JSON string or a file path)."""
        doc, where = read_json_document(source, "prediction")
        if doc.get("format_version") != FORMAT_VERSION:
            raise BlinkError(f"{where} has prediction format_version "
                             f"{doc.get('format_version')!r}; this blink reads {FORMAT_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        unit_names = {f.name for f in dataclasses.fields(UnitRow)}
        try:
            fields = {k: v for k, v in doc.items() if k in names}
            fields["units"] = [UnitRow(**{k: v for k, v in u.items() if k in unit_names})
                               for u in doc.get("units", [])]
            return cls(**fields)
        except (TypeError, AttributeError) as exc:
            raise BlinkError(f"{where} is a damaged blink prediction: {exc}") from exc

    def to_chrome_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The predicted timeline as a Chrome / Perfetto trace (load in ui.perfetto.dev)."""
        events: list[dict[str, Any]] = [
            {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "CPU (host)"}},
            {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "GPU stream"}},
        ]
        for ev in self.timeline:
            us = 1e6
            events.append({"ph": "X", "pid": 1, "tid": 1, "name": ev["op"],
                           "ts": ev["host_start_s"] * us,
                           "dur": (ev["host_end_s"] - ev["host_start_s"]) * us,
                           "args": {"module": ev["module"], "phase": ev["phase"],
                                    **({"waits_for_gpu": True} if ev.get("syncs") else {})}})
            if ev["gpu_end_s"] > ev["gpu_start_s"]:
                events.append({"ph": "X", "pid": 1, "tid": 2, "name": ev["op"],
                               "ts": ev["gpu_start_s"] * us,
                               "dur": (ev["gpu_end_s"] - ev["gpu_start_s"]) * us,
                               "args": {"module": ev["module"], "phase": ev["phase"]}})
        for c in self.memory_curve:  # counter tracks: memory over the step
            events.append({"ph": "C", "pid": 1, "name": "GPU memory", "ts": c["t_ms"] * 1e3,
                           "args": {"allocated MiB": c["allocated_bytes"] / 2**20,
                                    "reserved MiB": c["reserved_bytes"] / 2**20}})
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"model": self.model, "gpu": self.gpu, "blink": "prediction"}}
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
        return doc


# auto: every shipped model where it applies; trees: the per-unit forests only (no end-to-end
# GNN or model-level correction: the per-unit estimate); analytic: no learned model.
PREDICTORS = ("auto", "trees", "analytic")


def _budget_text(budget: int, gpu_memory: int) -> str:
    return "" if not budget or budget == gpu_memory else f" (budget {_fmt_bytes(budget)})"


def _oom_text(oom: dict[str, Any] | None) -> str:
    if not oom:
        return "over the memory budget"
    where = oom["op"] or "placing the weights and inputs"
    if oom.get("module"):
        where += f" in {oom['module']}"
    return f"out of memory at {where}, requesting {_fmt_bytes(oom['request_bytes'])}"


def replay_memory(native: Any, *, capacity_bytes: int, expandable_segments: bool,
                  workspace_bytes: int,
                  **extra: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The allocator replay of a trace as a run limited to `capacity_bytes` would see it.

    Unlimited first: when its peak reserved stays within the capacity the limit never bites and
    the numbers are final. Otherwise the replay is repeated against the capacity, where the
    simulator does what c10/cuda/CUDACachingAllocator.cpp's malloc does on a failed cudaMalloc
    (release_cached_blocks(), then one retry) before it declares OOM. Returns the stats and,
    on OOM, where it happened (the stats are then the unlimited ones: what the run would need).
    `extra` goes to every replay (resident roles, the curve, storages compiled mode skips).
    """
    mem = native.memory(expandable_segments=expandable_segments,
                        workspace_bytes=workspace_bytes, **extra)
    if mem["peak_reserved_bytes"] <= capacity_bytes:
        return mem, None
    capped = native.memory(expandable_segments=expandable_segments,
                           capacity_bytes=capacity_bytes, workspace_bytes=workspace_bytes,
                           **extra)
    if not capped["oom"]:
        return capped, None
    label = capped["oom_label"]
    oom = {"op": None if label is None else label[0],
           "module": None if label is None else label[1],
           "phase": None if label is None else PHASES[label[2]],
           "request_bytes": int(capped["oom_request_bytes"]),
           "reserved_bytes": int(capped["reserved_bytes"])}  # held when the malloc failed
    mem = dict(mem, num_alloc_retries=capped["num_alloc_retries"])
    return mem, oom


def _group_norm_note(t: Trace, units: list[UnitRow]) -> str | None:
    """Where an AMP inference's time goes when its group norms run in float32 (autocast's fp32
    list); None when they are under 5% of the unit time."""
    if t.meta.get("mode") != "inference" or not str(t.meta.get("dtype", "")).startswith("amp-"):
        return None
    total = sum(u.time_ms for u in units)
    gn = sum(u.time_ms for u in units if "group_norm" in u.op)
    if total <= 0 or gn < 0.05 * total:
        return None
    return (f"{100 * gn / total:.0f}% of the unit time is float32 group norm: CUDA autocast keeps "
            "group_norm in fp32, with casts around it (and the activation after it in fp32). "
            "A norm run in the autocast dtype (timm.layers.set_fast_norm() before building a "
            "timm model) avoids them; the public timm RTX 3090 inference times were measured "
            "that way (benchmarks/timm_group_norm.py)")


def _memory_budget(spec: GPUSpec, memory_budget: object) -> int:
    budget = spec.memory_bytes if memory_budget is None else memory_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= CUDA_CONTEXT_BYTES:
        raise ConfigError(f"memory_budget must be a number of bytes above the CUDA context "
                          f"({_fmt_bytes(CUDA_CONTEXT_BYTES)}), got {memory_budget!r}")
    return budget


BREAKDOWNS = ("op", "phase", "module", "kind")
# Memory at the peak, by what it holds. The first seven are allocated bytes (C++:
# blink::MemoryCategory, summing to peak_allocated_bytes); allocator_cache is reserved but not
# allocated at the reserved peak; cuda_context is outside the allocator (nvidia-smi only).
MEMORY_CATEGORIES = ("weights", "inputs", "optimizer_state", "gradients", "activations",
                     "workspace", "temporaries", "allocator_cache", "cuda_context")
_MAX_KEY = 60


class BreakdownRow(NamedTuple):
    key: str
    wall_ms: float
    gpu_ms: float
    units: int
    flops: float


def _fit(text: str, width: int) -> str:
    """`text` in `width` characters: long names keep their start and end."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep - keep // 3] + "…" + text[len(text) - keep // 3:]


def _fmt_flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP"


def _fmt_count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def _peak_flops(spec: GPUSpec, dtype: str, tf32: bool) -> tuple[float, str]:
    """The dense tensor-core (or FP32) peak the dtype's GEMMs run at, for MFU."""
    key = {"bf16": "bf16", "amp-bf16": "bf16", "fp16": "fp16", "amp-fp16": "fp16"}.get(
        dtype, "tf32" if tf32 else "fp32")
    value = spec.peak_flops.get(key) or 0.0
    if not value and key == "tf32":
        key, value = "fp32", spec.peak_flops.get("fp32") or 0.0
    return float(value), key


def _resident_roles(t: Trace) -> list[tuple[int, int]]:
    """(resident storage id, blink::MemoryCategory code) from the trace's run-length roles."""
    out: list[tuple[int, int]] = []
    sid = -1
    for entry in t.meta.get("resident_roles") or []:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2
                and entry[0] in RESIDENT_ROLES and isinstance(entry[1], int)
                and 0 <= entry[1] <= 10**7):
            raise BlinkError(f"the trace's meta.resident_roles entry {entry!r} is damaged")
        code = RESIDENT_ROLES.index(entry[0])
        for _ in range(entry[1]):
            out.append((sid, code))
            sid -= 1
    return out


def _memory_curve(curve: list[tuple[int, int, int, int]],
                  timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Curve points with a time: allocations happen when the host issues the op."""
    ids = [e["op_id"] for e in timeline]
    out: list[dict[str, Any]] = []
    t_ms = 0.0
    for op, phase, allocated, reserved in curve:
        if op >= 0 and ids:
            k = bisect.bisect_right(ids, op) - 1
            if k >= 0:  # events are in program order; an op's parent may own a later one
                t_ms = max(t_ms, timeline[k]["host_start_s"] * 1e3)
        out.append({"t_ms": t_ms, "op_id": op, "phase": PHASES[phase] if phase >= 0 else None,
                    "allocated_bytes": allocated, "reserved_bytes": reserved})
    return out


CURVE_POINTS = 512


class _CostSummary:
    """The fields of an analytic Prediction that learned.model_summary reads, straight from a
    cost() result (no Prediction is built for the blend's analytic timeline)."""

    def __init__(self, cost: dict[str, Any]) -> None:
        self.time_ms = cost["end_to_end_s"] * 1e3
        self.host_ms = cost["host_s"] * 1e3
        self.gpu_busy_ms = cost["gpu_busy_s"] * 1e3
        self.units = [_UnitSum(u[1], u[2] * 1e3, u[3] * 1e3, u[4], u[5] + u[6])
                      for u in cost["units"]]


def _model_correction(native: Any, spec: Any, t: Trace, models: Any, allow_tf32_matmul: bool,
                      allow_tf32_cudnn: bool, cudnn_benchmark: bool, mode: str) -> float:
    """The model-level correction's time (ms) of the trace: the analytic timeline's summary
    with table host time (how the timm caches were built), through models' `mode` forest."""
    ana = native.cost(core_gpu_spec(spec), allow_tf32_matmul, allow_tf32_cudnn, "table",
                      cudnn_benchmark=cudnn_benchmark)
    summary = {**model_summary(_CostSummary(ana)), "params": t.meta.get("params") or 0,
               "batch": t.meta.get("batch_size") or nan,
               "img_size": image_side(t.meta.get("input_shapes"))}
    return model_correction_ms(models, summary, mode)


class _UnitSum(NamedTuple):
    kind: str
    time_ms: float
    roofline_ms: float
    flops: float
    bytes: float


def predict_trace(t: Trace, gpu: str = "H200", *, expandable_segments: bool | None = None,
                  allow_tf32_matmul: bool | None = None,
                  allow_tf32_cudnn: bool | None = None,
                  cudnn_benchmark: bool | None = None,
                  host_time: str = "table",
                  memory_budget: int | None = None, compiled: bool = False,
                  predictor: str = "auto") -> Prediction:
    """Cost an existing trace on `gpu`. TF32 and cuDNN-benchmark flags default to torch's
    current settings (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
    torch.backends.cudnn.benchmark). memory_budget: bytes the run may use on the device, CUDA
    context included (default: the GPU's memory). compiled=True costs the graph torch.compile's
    Inductor would run (blink.compile.compiled_units).

    host_time="table" (default): fixed constants per op and module call, deterministic and
    CPU-independent (the same request gets the same answer on any machine).
    host_time="measured": each op's host time is the caller's work the dry run
    measured on this CPU before it (Python, module calls, autograd engine, optimizer loop; less
    the tracer's own calibrated overhead, blink.hosttime) plus the op's CUDA-side dispatch,
    on the thread's CPU-time clock so that a loaded machine's preemptions do not count.
    It follows the user's real Python, but varies a little from trace to trace and describes
    this CPU. host_time="wall": the same on the steady clock (sleeps and waits in the model
    count, and so does preemption). A trace without timestamps (format 2) always uses the
    table. A trace recorded cold (a model's first call in the process) carries
    one-off Python costs in its gaps; trace_model(warmup=True), as blink.predict does,
    records a warm one.

    predictor="auto" uses the trained artifacts of blink.learned.models_dir() where they cover a
    unit's kind (analytic elsewhere, and everywhere when there are none) and the end-to-end
    models where they apply; "trees" the per-unit forests only; "analytic" ignores them.
    """
    if predictor not in PREDICTORS:
        raise ConfigError(f"predictor {predictor!r} is not one of {', '.join(PREDICTORS)}")
    if host_time not in HOST_TIME_MODES:
        raise ConfigError(f"host_time must be one of {', '.join(HOST_TIME_MODES)}, "
                          f"not {host_time!r}")
    spec = get_gpu(gpu)
    if allow_tf32_matmul is None:
        allow_tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32)
    if allow_tf32_cudnn is None:
        allow_tf32_cudnn = bool(torch.backends.cudnn.allow_tf32)
    if cudnn_benchmark is None:
        cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    if expandable_segments is None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        expandable_segments = "expandable_segments:true" in conf.replace(" ", "").lower()
    traced_for = t.meta.get("gpu")
    notes: list[str] = []
    if traced_for and traced_for != spec.name:
        notes.append(f"traced for {traced_for}; SDPA kernel choice is that GPU's")
    answered = t.meta.get("items_answered")
    if answered:
        notes.append(f"{answered} .item() call(s) in the model's code answered from tensors whose "
                     "values Blink follows (all-ones masks, its own token ids, tensors copied "
                     "from host memory; blink/known_values.py)")
    if t.meta.get("nonzero") == "assume_all":
        notes.append("nonzero='assume_all': data-dependent shapes Blink could not size "
                     "(nonzero, boolean-mask indexing of values it does not know) were taken "
                     "with every element non-zero, an upper bound on their time and memory")
    sized = t.meta.get("shapes_sized")
    if sized:
        notes.append(f"{sized} data-dependent shape(s) (nonzero, boolean-mask indexing, ...) sized "
                     "from values the host made (a numpy mask copied to the device; "
                     "blink/known_values.py); the masks drawn at random are this dry run's draw")
    models = None
    if predictor in ("auto", "trees"):
        models = load_models()  # ArtifactError for a corrupt or incompatible models/
        if models is None:
            notes.append(f"no trained models ({models_dir()}/card.json not found): every unit "
                         "time is analytic")
        elif not models.forests:
            notes.append(f"{models_dir()}/card.json has no forests: every unit time is analytic")
    native = t.native()
    unit_models = models.unit_models if models is not None and models.forests else None
    gnn = models.gnn if models is not None and predictor == "auto" else None
    if gnn is not None:
        why = ("compiled mode re-times the fused kernels analytically" if compiled
               else gnn_skip_reason(models, spec.name, str(t.meta.get("mode", "")),
                                    str(t.meta.get("dtype", ""))))
        if why is not None:
            gnn = None
            notes.append(f"end-to-end GNN ({models.gnn_path}) not applied: {why}")
    # A GNN trained on this GPU read the forests' times as they come out of the forests, on a
    # generation they never saw included: it gets them so. Without it, such units keep the
    # analytic time (blink/learned.h, UnitModel::cc_major_lo).
    extrapolate = gnn is not None
    used = host_time if t.has_timestamps else "table"
    if used != host_time:
        notes.append("the trace has no timestamps (format 2): host time from the table")
    if used != "table":
        cal = tracer_overhead()
        dtype = str(t.meta.get("dtype", ""))
        amp_s = autocast_overhead_s(dtype) if dtype in ("amp-bf16", "amp-fp16") else 0.0
        cost = native.cost(core_gpu_spec(spec), allow_tf32_matmul, allow_tf32_cudnn, used,
                           cal.tracer_gap_overhead_s, cal.module_hook_s, amp_s,
                           cudnn_benchmark=cudnn_benchmark, models=unit_models, gnn=gnn,
                           extrapolate_forests=extrapolate)
        clock = "CPU time" if used == "measured" else "wall clock"
        notes.append(f"host time measured on this CPU during the dry run ({clock}; less "
                     f"{cal.tracer_gap_overhead_s * 1e6:.1f} us tracer overhead per op, "
                     f"{cal.module_hook_s * 1e6:.1f} us per module hook"
                     + (f", {amp_s * 1e6:.1f} us per forward op for blink.autocast's Python "
                        "mode)" if amp_s else ")"))
    else:
        cost = native.cost(core_gpu_spec(spec), allow_tf32_matmul, allow_tf32_cudnn, "table",
                           cudnn_benchmark=cudnn_benchmark, models=unit_models, gnn=gnn,
                           extrapolate_forests=extrapolate)
    workspace = cublas_workspace_bytes(spec)

    units = []
    failed = 0
    by_trees: dict[str, int] = {}
    outside: dict[str, dict[str, int]] = {}  # kind -> op -> units its forest was not fitted on
    gated: dict[str, int] = {}  # kind -> units left analytic: a GPU generation its forest never saw
    for (op_id, kind, time_s, roof_s, flops, br, bw, kernels, _matched, math, err,
         (name, module, phase), source, analytic_s, _log_ratio, fallback) in cost["units"]:
        if err:
            failed += 1
        lo = hi = None
        if source == "trees":
            by_trees[kind] = by_trees.get(kind, 0) + 1
            q = unit_quantile(models, kind) if models is not None else None
            if q is not None:
                lo, hi = time_s * 1e3 * exp(-q), time_s * 1e3 * exp(q)
        elif fallback == "op_not_fitted":
            ops = outside.setdefault(kind, {})
            ops[name] = ops.get(name, 0) + 1
        elif fallback == "other_generation":
            gated[kind] = gated.get(kind, 0) + 1
        units.append(UnitRow(op_id, name, module, PHASES[phase], kind, time_s * 1e3,
                             roof_s * 1e3, flops, br + bw, int(kernels), math, source, err,
                             analytic_s * 1e3, lo, hi, fallback if source == "analytic" else ""))
    if by_trees and models is not None:
        covered = ", ".join(f"{k} {n}" for k, n in sorted(by_trees.items()))
        notes.append(f"unit times from {models.describe()}: {covered} units; the rest analytic")
        unseen = sorted(k for k in by_trees if models.forests[k].gpus
                        and spec.name not in models.forests[k].gpus)
        if unseen:
            notes.append(f"{spec.name} is not among the GPUs the {', '.join(unseen)} trees were "
                         "trained on (they extrapolate through the GPU's specs)")
    cc = "sm_{}{}".format(*spec.compute_capability)
    for kind, n in sorted(gated.items()):
        lo, hi = models.forests[kind].cc_major_range or (0, 99)
        seen = f"sm_{lo}x" if lo == hi else f"sm_{lo}x to sm_{hi}x"
        notes.append(f"{kind} units keep the analytic time ({n}): the {kind} trees were fitted on "
                     f"{seen} GPUs only, and {spec.name} is {cc}, a generation whose kernels "
                     "they never saw")
    for kind, ops in sorted(outside.items()):
        seen = ", ".join(models.forests[kind].ops)
        notes.append(f"{kind} units the {kind} trees were not fitted on keep the analytic time: "
                     + ", ".join(f"{o} {n}" for o, n in sorted(ops.items()))
                     + f" (the trees saw {seen})")
    gnn_c = cost["gnn_log_correction"]
    if gnn_c == gnn_c and models is not None:  # not NaN: a GNN corrected end_to_end_s
        k = models.gnn.members  # gnn_c is set only where models.gnn ran
        notes.append(f"end-to-end time x{exp(gnn_c):.4f} from the GNN ({models.gnn_path}"
                     + (f", the mean of its {k} seed members" if k > 1 else "") + "); the "
                     "timeline shows the per-unit schedule before that correction")
    if failed:
        notes.append(f"{failed} units could not be costed (see units[].error); counted as 0")
    gn_note = _group_norm_note(t, units)
    if gn_note:
        notes.append(gn_note)
    timeline = []
    syncs, waited_s = 0, 0.0
    for (op_id, h, _g, hs, he, gs, ge, (name, module, phase), caller_s,
         dispatch_s, sync) in cost["issues"]:
        timeline.append({"op": name, "op_id": op_id, "module": module,
                         "phase": PHASES[phase], "host_start_s": hs, "host_end_s": he,
                         "gpu_start_s": gs, "gpu_end_s": ge, "caller_s": caller_s,
                         "dispatch_s": dispatch_s, "syncs": bool(sync)})
        if sync:
            syncs += 1
            waited_s += max(0.0, he - hs - h)
    if syncs:
        notes.append(f"{syncs} op(s) copy a GPU value to the host (.item(), nonzero, unique, "
                     f"boolean-mask indexing, _grouped_mm's per-group loop) or copy host memory "
                     f"without non_blocking, and hold the CPU until the GPU has run everything "
                     f"before them: {waited_s * 1e3:.3f} ms of waiting")
    time_ms = cost["end_to_end_s"] * 1e3
    host_s, gpu_busy_s, lower_s = cost["host_s"], cost["gpu_busy_s"], cost["lower_bound_s"]
    blended = False
    train_corrected = False
    mode = str(t.meta.get("mode", ""))
    train_applies = False
    if (models is not None and models.train_forest is not None and mode == "train"
            and predictor == "auto"):
        why = ("compiled mode re-times the fused kernels analytically" if compiled
               else train_correction_skip_reason(models, spec.name,
                                                 str(t.meta.get("dtype", ""))))
        train_applies = why is None
        if why is not None:
            notes.append(f"training-step correction ({models.train_forest_path}) not applied: "
                         f"{why}")
    if gnn_c == gnn_c and models is not None and models.model_forest is not None:
        # Where the GNN applies, its time is blended with the model-level correction's (card
        # gnn.blend: held-out-family errors of the two are partly independent). The correction
        # reads the analytic timeline's summary with table host time, as it was trained.
        corr_ms = _model_correction(native, spec, t, models, allow_tf32_matmul,
                                    allow_tf32_cudnn, cudnn_benchmark, "inference")
        w = models.blend_weight
        gnn_ms = time_ms
        time_ms = float(blend_ms(gnn_ms, corr_ms, w))
        blended = True
        notes.append(f"end-to-end time {gnn_ms:.3f} ms (GNN) ^ {w:g} x {corr_ms:.3f} ms "
                     f"(model-level correction, {models.model_forest_path}) ^ {1.0 - w:g}")
    elif train_applies and models is not None:
        # A training step on the GPU and precision the training-step correction learned: its
        # end-to-end time is the analytic timeline's, corrected (card model_level_train); the
        # unit times stay the forests' / analytic ones.
        steps_ms = time_ms
        time_ms = _model_correction(native, spec, t, models, allow_tf32_matmul,
                                    allow_tf32_cudnn, cudnn_benchmark, "train")
        train_corrected = True
        notes.append(f"end-to-end time {time_ms:.3f} ms from the training-step correction "
                     f"({models.train_forest_path}) of the analytic timeline; the timeline and "
                     f"units show the per-unit schedule ({steps_ms:.3f} ms)")
        learned_opt, opt = models.train_applies.get("optimizer"), t.meta.get("optimizer")
        if learned_opt and opt != learned_opt:
            # Applied all the same: the optimizer is a few percent of a step, and the
            # correction's inputs include its analytic time.
            notes.append(f"the training-step correction learned {learned_opt} steps; this "
                         f"step's optimizer ({opt}) is an extrapolation for it")
    skip: list[int] = []
    if compiled:
        from .compile import compiled_units

        units, timeline, c = compiled_units(native, core_gpu_spec(spec), units,
                                            allow_tf32_matmul, allow_tf32_cudnn)
        time_ms, host_s, gpu_busy_s = c["end_to_end_s"] * 1e3, c["host_s"], c["gpu_busy_s"]
        lower_s = min(lower_s, c["end_to_end_s"])
        skip = c["internal_storages"]
        notes.append("compiled mode: fused chains are costed as one memory-bound kernel each; "
                     "their intermediates are not allocated (AOTAutograd's recomputation and "
                     "Inductor's buffer reuse are not modelled yet)")
    budget = _memory_budget(spec, memory_budget)
    mem, oom = replay_memory(native, capacity_bytes=budget - CUDA_CONTEXT_BYTES,
                             expandable_segments=bool(expandable_segments),
                             workspace_bytes=workspace, external_roles=_resident_roles(t),
                             max_curve_points=CURVE_POINTS, skip_storages=skip)
    lower_ms = min(lower_s * 1e3, time_ms)
    upper_ms = time_ms * _UPPER_FACTOR
    interval_method = INTERVAL_METHOD
    used_predictor = ("model" if train_corrected else
                      "+".join((["trees"] if by_trees else [])
                               + (["gnn"] if gnn_c == gnn_c else [])
                               + (["model"] if blended else [])) or "analytic")
    # Compiled mode re-times the fused kernels analytically, so its interval is analytic's.
    conf = (conformal_interval(models, time_ms, "analytic" if compiled else used_predictor,
                               mode, spec.name) if models is not None else None)
    if conf is not None:
        lower_ms, upper_ms, interval_method = conf
    smi = mem["peak_reserved_bytes"] + CUDA_CONTEXT_BYTES
    by_cat = {k: int(v) for k, v in mem["peak_by_category"].items()}
    by_cat["allocator_cache"] = int(mem["peak_reserved_bytes"] - mem["peak_allocated_bytes"])
    by_cat["cuda_context"] = CUDA_CONTEXT_BYTES
    # fp32 GEMMs / convolutions run on TF32 tensor cores when either flag allows it (cuDNN's
    # is on by default), so MFU is then against the TF32 peak.
    peak, peak_kind = _peak_flops(spec, str(t.meta.get("dtype", "fp32")),
                                  allow_tf32_matmul or allow_tf32_cudnn)
    params = t.meta.get("params")
    return Prediction(
        model=str(t.meta.get("model", "?")), gpu=spec.name, mode=str(t.meta.get("mode", "?")),
        dtype=str(t.meta.get("dtype", "?")), batch_size=t.meta.get("batch_size"),
        seq_len=t.meta.get("seq_len"), time_ms=time_ms,
        lower_ms=lower_ms, upper_ms=upper_ms, interval_method=interval_method,
        host_ms=host_s * 1e3, gpu_busy_ms=gpu_busy_s * 1e3,
        peak_allocated_bytes=int(mem["peak_allocated_bytes"]),
        peak_reserved_bytes=int(mem["peak_reserved_bytes"]), nvidia_smi_bytes=int(smi),
        context_bytes=CUDA_CONTEXT_BYTES, resident_bytes=int(mem["resident_bytes"]),
        workspace_bytes=workspace, units=units, timeline=timeline,
        expandable_segments=bool(expandable_segments), host_time=used,
        gpu_memory_bytes=spec.memory_bytes,
        fits=oom is None, notes=notes, memory_budget_bytes=budget,
        alloc_retries=int(mem["num_alloc_retries"]), oom=oom,
        params=int(params) if isinstance(params, int) else 0,
        flops=float(sum(u.flops for u in units)), peak_flops=peak, peak_flops_kind=peak_kind,
        memory_by_category={k: by_cat.get(k, 0) for k in MEMORY_CATEGORIES},
        memory_curve=_memory_curve(mem["curve"], timeline), compiled=compiled,
        channels_last=bool(t.meta.get("channels_last", False)), predictor=used_predictor,
        grad_checkpointing=bool(t.meta.get("grad_checkpointing", False)),
        kv_cache=t.meta.get("kv_cache"),
    )


def predict(
    model: torch.nn.Module | str,
    inputs: object = None,
    *,
    input_shape: object = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    gpu: str = "H200",
    dtype: str | torch.dtype | None = None,
    mode: str = "inference",
    optimizer: str = "adamw",
    loss_fn: Callable[[object], torch.Tensor] | None = None,
    nonzero: str = "error",
    expandable_segments: bool | None = None,
    first_step: bool = False,
    host_time: str = "table",
    memory_budget: int | None = None,
    compiled: bool = False,
    predictor: str = "auto",
    channels_last: bool = False,
    grad_checkpointing: bool = False,
    kv_cache: int | None = None,
) -> Prediction:
    """Predict time and memory of `model` on `gpu` without running it there.

    Same inputs as blink.trace_model (a module or zoo name; `inputs`, `input_shape` or, for zoo
    models, `batch_size` / `seq_len`); mode="train" is forward, loss, backward and
    `optimizer.step()`, in steady state (optimizer state already resident) unless first_step.
    host_time: "table" (deterministic, the default), "measured" (this CPU's Python, as the dry
    run ran it) or "wall"; see predict_trace.
    memory_budget: bytes the run may use on the GPU, CUDA context included (default: all of
    it); `fits` says whether the allocator replay stays within it without an out-of-memory.
    compiled=True predicts the model under torch.compile (Inductor's fused kernels).
    predictor="auto" uses the trained artifacts in models/ where they cover a unit;
    "analytic" forces the analytic model (see predict_trace).
    channels_last=True predicts the model run channels-last (NHWC: model and 4-D inputs
    converted with memory_format=torch.channels_last).
    grad_checkpointing=True predicts a training step with the model's own activation
    checkpointing switched on (transformers' gradient_checkpointing_enable, timm's
    set_grad_checkpointing; on Blink's copy, never on `model`).
    kv_cache=N predicts a generation step: `seq_len` new tokens (1: a decode step) per sequence
    after N tokens in the model's own KV cache (transformers causal LMs; see trace_model).
    """
    if predictor not in PREDICTORS:
        raise ConfigError(f"predictor {predictor!r} is not one of {', '.join(PREDICTORS)}")
    if host_time not in HOST_TIME_MODES:
        raise ConfigError(f"host_time must be one of {', '.join(HOST_TIME_MODES)}, "
                          f"not {host_time!r}")
    spec = get_gpu(gpu)  # fail on an unknown GPU (or a bad budget) before tracing
    _memory_budget(spec, memory_budget)
    t = trace_model(model, inputs, input_shape=input_shape, batch_size=batch_size,
                    seq_len=seq_len, dtype=dtype, mode=mode, optimizer=optimizer,
                    gpu=spec.name, loss_fn=loss_fn, nonzero=nonzero, first_step=first_step,
                    warmup=host_time != "table", channels_last=channels_last,
                    grad_checkpointing=grad_checkpointing, kv_cache=kv_cache)
    return predict_trace(t, spec.name, expandable_segments=expandable_segments,
                         host_time=host_time, memory_budget=memory_budget, compiled=compiled,
                         predictor=predictor)
