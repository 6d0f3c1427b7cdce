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

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from math import exp
from typing import Any

import torch

from .cost import core_gpu_spec
from .dryrun import trace_model
from .errors import ConfigError
from .hardware import GPUSpec, get_gpu
from .learned import conformal_interval, load_models, models_dir, unit_quantile
from .trace import PHASES, Trace, _fmt_bytes

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
    gpu_memory_bytes: int = 0
    fits: bool = True
    notes: list[str] = field(default_factory=list)
    # "trees" where forests covered units, "+gnn" / "gnn" where the GNN corrected time_ms,
    # else "analytic"
    predictor: str = "analytic"

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

    def table(self, max_rows: int = 15) -> str:
        bound = "launch-bound (CPU)" if self.host_ms >= self.gpu_busy_ms else "GPU-bound"
        head = [
            f"blink predict: {self.model} on {self.gpu} ({self.mode}, {self.dtype}, "
            f"batch {self.batch_size}{'' if self.seq_len is None else f', seq {self.seq_len}'})",
            f"  time       {self.time_ms:10.3f} ms   [{self.lower_ms:.3f} .. {self.upper_ms:.3f}]"
            f"  {bound}: host {self.host_ms:.3f} ms, GPU busy {self.gpu_busy_ms:.3f} ms",
            f"  memory     peak allocated {_fmt_bytes(self.peak_allocated_bytes)}, "
            f"peak reserved {_fmt_bytes(self.peak_reserved_bytes)}, nvidia-smi ~"
            f"{_fmt_bytes(self.nvidia_smi_bytes)} of {_fmt_bytes(self.gpu_memory_bytes)}"
            f"{'' if self.fits else '  (DOES NOT FIT)'}",
            f"  resident   weights+inputs {_fmt_bytes(self.resident_bytes)}, cuBLAS workspace "
            f"{_fmt_bytes(self.workspace_bytes)}, CUDA context ~{_fmt_bytes(self.context_bytes)}",
            f"  interval   {self.interval_method}",
            "",
            f"  {'op':<46} {'units':>6} {'ms':>10} {'share':>7}",
        ]
        total = sum(u.time_ms for u in self.units) or 1.0
        for name, n, ms in self.by_op()[:max_rows]:
            head.append(f"  {name:<46} {n:>6} {ms:>10.3f} {100 * ms / total:>6.1f}%")
        for note in self.notes:
            head.append(f"  note: {note}")
        return "\n".join(head)

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
                           "args": {"module": ev["module"], "phase": ev["phase"]}})
            if ev["gpu_end_s"] > ev["gpu_start_s"]:
                events.append({"ph": "X", "pid": 1, "tid": 2, "name": ev["op"],
                               "ts": ev["gpu_start_s"] * us,
                               "dur": (ev["gpu_end_s"] - ev["gpu_start_s"]) * us,
                               "args": {"module": ev["module"], "phase": ev["phase"]}})
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"model": self.model, "gpu": self.gpu, "blink": "prediction"}}
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
        return doc


PREDICTORS = ("auto", "analytic")


def predict_trace(t: Trace, gpu: str = "H200", *, expandable_segments: bool | None = None,
                  allow_tf32_matmul: bool | None = None,
                  allow_tf32_cudnn: bool | None = None, predictor: str = "auto") -> Prediction:
    """Cost an existing trace on `gpu`. TF32 flags default to torch's current settings
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32).

    predictor="auto" uses the trained artifacts of blink.learned.models_dir() where they cover a
    unit's kind (analytic elsewhere, and everywhere when there are none); "analytic" ignores them.
    """
    if predictor not in PREDICTORS:
        raise ConfigError(f"predictor {predictor!r} is not one of {', '.join(PREDICTORS)}")
    spec = get_gpu(gpu)
    if allow_tf32_matmul is None:
        allow_tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32)
    if allow_tf32_cudnn is None:
        allow_tf32_cudnn = bool(torch.backends.cudnn.allow_tf32)
    if expandable_segments is None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        expandable_segments = "expandable_segments:true" in conf.replace(" ", "").lower()
    traced_for = t.meta.get("gpu")
    notes: list[str] = []
    if traced_for and traced_for != spec.name:
        notes.append(f"traced for {traced_for}; SDPA kernel choice is that GPU's")
    models = None
    if predictor == "auto":
        models = load_models()  # ArtifactError for a corrupt or incompatible models/
        if models is None:
            notes.append(f"no trained models ({models_dir()}/card.json not found): every unit "
                         "time is analytic")
        elif not models.forests:
            notes.append(f"{models_dir()}/card.json has no forests: every unit time is analytic")
    native = t.native()
    cost = native.cost(core_gpu_spec(spec), allow_tf32_matmul, allow_tf32_cudnn,
                       models.unit_models if models is not None and models.forests else None,
                       models.gnn if models is not None else None)
    workspace = cublas_workspace_bytes(spec)
    mem = native.memory(expandable_segments=expandable_segments, workspace_bytes=workspace)

    units = []
    failed = 0
    by_trees: dict[str, int] = {}
    for (op_id, kind, time_s, roof_s, flops, br, bw, kernels, _matched, math, err,
         (name, module, phase), source, analytic_s, _log_ratio) in cost["units"]:
        if err:
            failed += 1
        lo = hi = None
        if source == "trees":
            by_trees[kind] = by_trees.get(kind, 0) + 1
            q = unit_quantile(models, kind) if models is not None else None
            if q is not None:
                lo, hi = time_s * 1e3 * exp(-q), time_s * 1e3 * exp(q)
        units.append(UnitRow(op_id, name, module, PHASES[phase], kind, time_s * 1e3,
                             roof_s * 1e3, flops, br + bw, int(kernels), math, source, err,
                             analytic_s * 1e3, lo, hi))
    if by_trees and models is not None:
        covered = ", ".join(f"{k} {n}" for k, n in sorted(by_trees.items()))
        notes.append(f"unit times from {models.describe()}: {covered} units; the rest analytic")
        unseen = sorted(k for k in by_trees if models.forests[k].gpus
                        and spec.name not in models.forests[k].gpus)
        if unseen:
            notes.append(f"{spec.name} is not among the GPUs the {', '.join(unseen)} trees were "
                         "trained on (they extrapolate through the GPU's specs)")
    gnn_c = cost["gnn_log_correction"]
    if gnn_c == gnn_c and models is not None:  # not NaN: a GNN corrected end_to_end_s
        notes.append(f"end-to-end time x{exp(gnn_c):.4f} from the GNN ({models.gnn_path}); the "
                     "timeline shows the per-unit schedule before that correction")
    if failed:
        notes.append(f"{failed} units could not be costed (see units[].error); counted as 0")
    timeline = []
    for (op_id, _h, _g, hs, he, gs, ge, (name, module, phase)) in cost["issues"]:
        timeline.append({"op": name, "op_id": op_id, "module": module,
                         "phase": PHASES[phase], "host_start_s": hs, "host_end_s": he,
                         "gpu_start_s": gs, "gpu_end_s": ge})
    time_ms = cost["end_to_end_s"] * 1e3
    lower_ms = min(cost["lower_bound_s"] * 1e3, time_ms)
    upper_ms = time_ms * _UPPER_FACTOR
    interval_method = INTERVAL_METHOD
    conf = conformal_interval(models, time_ms) if models is not None else None
    if conf is not None:
        lower_ms, upper_ms, interval_method = conf
    smi = mem["peak_reserved_bytes"] + CUDA_CONTEXT_BYTES
    return Prediction(
        model=str(t.meta.get("model", "?")), gpu=spec.name, mode=str(t.meta.get("mode", "?")),
        dtype=str(t.meta.get("dtype", "?")), batch_size=t.meta.get("batch_size"),
        seq_len=t.meta.get("seq_len"), time_ms=time_ms,
        lower_ms=lower_ms, upper_ms=upper_ms, interval_method=interval_method,
        host_ms=cost["host_s"] * 1e3, gpu_busy_ms=cost["gpu_busy_s"] * 1e3,
        peak_allocated_bytes=int(mem["peak_allocated_bytes"]),
        peak_reserved_bytes=int(mem["peak_reserved_bytes"]), nvidia_smi_bytes=int(smi),
        context_bytes=CUDA_CONTEXT_BYTES, resident_bytes=int(mem["resident_bytes"]),
        workspace_bytes=workspace, units=units, timeline=timeline,
        expandable_segments=bool(expandable_segments), gpu_memory_bytes=spec.memory_bytes,
        fits=smi <= spec.memory_bytes, notes=notes,
        predictor="+".join((["trees"] if by_trees else [])
                           + (["gnn"] if gnn_c == gnn_c else [])) or "analytic",
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
    predictor: str = "auto",
) -> Prediction:
    """Predict time and memory of `model` on `gpu` without running it there.

    Same inputs as blink.trace_model (a module or zoo name; `inputs`, `input_shape` or, for zoo
    models, `batch_size` / `seq_len`); mode="train" is forward, loss, backward and
    `optimizer.step()`, in steady state (optimizer state already resident) unless first_step.
    predictor="auto" uses the trained artifacts in models/ where they cover a unit;
    "analytic" forces the analytic model (see predict_trace).
    """
    if predictor not in PREDICTORS:
        raise ConfigError(f"predictor {predictor!r} is not one of {', '.join(PREDICTORS)}")
    spec = get_gpu(gpu)  # fail on an unknown GPU before tracing
    t = trace_model(model, inputs, input_shape=input_shape, batch_size=batch_size,
                    seq_len=seq_len, dtype=dtype, mode=mode, optimizer=optimizer,
                    gpu=spec.name, loss_fn=loss_fn, nonzero=nonzero, first_step=first_step)
    return predict_trace(t, spec.name, expandable_segments=expandable_segments,
                         predictor=predictor)
