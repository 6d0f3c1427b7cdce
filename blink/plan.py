"""Batch planning and comparison on top of `blink.predict`.

    r = blink.max_batch_size("torchvision:resnet50", gpu="A100-40GB", mode="train")
    r.batch_size, r.peak_reserved_bytes          # largest batch that fits, and its peak
    s = blink.optimize_batch("hf:gpt2", gpu="H200", seq_len=1024, mode="train")
    s.best.batch_size, s.best.throughput         # best samples/s within the budget
    c = blink.compare(["torchvision:resnet50", "timm:convnext_tiny"], ["H200", "A100-80GB"],
                      dtypes=["fp32", "bf16"], batch_size=64)

"Fits" is the prediction's: the trace's allocations replayed through the caching-allocator
simulator against the budget less the safety margin and the CUDA context, where a failed
device allocation first releases the cached segments and retries, as PyTorch's allocator does
(blink.predict.replay_memory), and only then is out of memory. The search probes real traces at
each batch size (exponential growth, then bisection); it never extrapolates from one batch to
another, because activations, allocator rounding and kernel choice are not linear in the batch.

This module imports nothing heavy at import time, so `blink --help` stays fast.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import BlinkError, ConfigError

if TYPE_CHECKING:
    import torch

    from .predict import Prediction

DEFAULT_SAFETY_MARGIN = 0.05  # of the budget, kept free for what the replay does not see
DEFAULT_MAX_BATCH = 1 << 16   # the search's upper end
DEFAULT_MAX_PROBES = 40       # enough for the exponential and binary phases up to 2**16
MAX_SWEEP_POINTS = 64         # optimize_batch(batch_sizes=[...]) and compare() grids
MAX_COMPARE_CELLS = 64



class TimeLimitError(BlinkError):
    """A plan ran past its time_limit_s (checked before each prediction it starts)."""


class _Clock:
    def __init__(self, limit_s: float | None, what: str) -> None:
        import time

        if limit_s is not None and (isinstance(limit_s, bool) or not isinstance(
                limit_s, (int, float)) or not limit_s > 0):
            raise ConfigError(f"time_limit_s must be a positive number of seconds, got "
                              f"{limit_s!r}")
        self._now = time.monotonic
        self._end = None if limit_s is None else self._now() + float(limit_s)
        self._limit, self._what = limit_s, what

    def check(self, done: int) -> None:
        if self._end is not None and self._now() > self._end:
            raise TimeLimitError(f"{self._what} passed its time limit of {self._limit:g} s "
                                 f"after {done} predictions; narrow the request (fewer "
                                 "models/GPUs, a smaller max_batch) or raise the limit")


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """"40GiB", "40 GB", "40G" (= GiB), "1.5e10" or an int -> bytes."""
    if isinstance(text, bool):
        raise ConfigError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise ConfigError(f"a memory size must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if m is None or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read {text!r} as a memory size; write e.g. 40GiB, 40GB, "
                          "40G (= GiB) or a number of bytes")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value < 1 or value > 2**60:
        raise ConfigError(f"memory size {text!r} is out of range (1 B .. 1 EiB)")
    return int(value)


def _fmt_bytes(n: float) -> str:
    from .trace import _fmt_bytes as fmt

    return fmt(n)


def _check_margin(safety_margin: object) -> float:
    if isinstance(safety_margin, bool) or not isinstance(safety_margin, (int, float)) or not (
            0.0 <= float(safety_margin) < 1.0):
        raise ConfigError(f"safety_margin must be a fraction in [0, 1), got {safety_margin!r}")
    return float(safety_margin)


def _positive(name: str, value: object, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if upper is not None and value > upper:
        raise ConfigError(f"{name} must be at most {upper}, got {value}")
    return value


def _budget(gpu: str, memory_budget: int | str | None) -> tuple[str, int]:
    from .hardware import get_gpu

    spec = get_gpu(gpu)
    budget = spec.memory_bytes if memory_budget is None else parse_bytes(memory_budget)
    return spec.name, budget


def _no_fixed_inputs(kwargs: dict[str, Any]) -> None:
    if kwargs.get("inputs") is not None:
        raise ConfigError("batch planning varies the batch size, which fixed `inputs=` tensors "
                          "cannot do: pass input_shape=(batch, ...) instead (its first "
                          "dimension is replaced by each batch size)")
    if "batch_size" in kwargs:
        raise ConfigError("batch planning chooses batch_size itself; do not pass it")


# -- max_batch_size ---------------------------------------------------------------------------

class _Report:
    """A planner result: printed as its table, serialised with its format name."""

    FORMAT: ClassVar[str]

    def table(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses
        d["format"] = self.FORMAT
        return d


@dataclass(frozen=True)
class Probe:
    """One predicted batch size."""

    batch_size: int
    fits: bool
    time_ms: float
    peak_reserved_bytes: int  # what the run reserves (needs, when it does not fit)
    peak_allocated_bytes: int
    nvidia_smi_bytes: int     # peak reserved + CUDA context
    alloc_retries: int
    oom: dict[str, Any] | None
    throughput: float          # samples per second


def _probe(p: Prediction) -> Probe:
    b = int(p.batch_size or 0)
    return Probe(b, bool(p.fits), float(p.time_ms), int(p.peak_reserved_bytes),
                 int(p.peak_allocated_bytes), int(p.nvidia_smi_bytes), int(p.alloc_retries),
                 p.oom, b * 1e3 / p.time_ms if p.time_ms > 0 else 0.0)


@dataclass
class BatchSearch(_Report):
    """What max_batch_size found, with every prediction it made on the way."""

    FORMAT: ClassVar[str] = "blink.max_batch_size"

    model: str
    gpu: str
    mode: str
    dtype: str
    seq_len: int | None
    batch_size: int              # largest batch that fits; 0 when batch 1 does not
    peak_reserved_bytes: int     # at batch_size (0 when none fits)
    context_bytes: int
    budget_bytes: int
    safety_margin: float
    usable_bytes: int            # budget * (1 - safety_margin): what the replay may use
    max_batch: int
    probes: list[Probe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.batch_size > 0

    def probe(self, batch_size: int) -> Probe | None:
        return next((p for p in self.probes if p.batch_size == batch_size), None)

    def table(self) -> str:
        seq = "" if self.seq_len is None else f", seq {self.seq_len}"
        lines = [
            f"blink max-batch: {self.model} on {self.gpu} ({self.mode}, {self.dtype}{seq})",
            f"  budget {_fmt_bytes(self.budget_bytes)} less {100 * self.safety_margin:.0f}% "
            f"margin = {_fmt_bytes(self.usable_bytes)}, of which CUDA context "
            f"~{_fmt_bytes(self.context_bytes)}",
        ]
        if self.batch_size:
            lines.append(f"  largest batch {self.batch_size}: peak reserved "
                         f"{_fmt_bytes(self.peak_reserved_bytes)} + context = "
                         f"{_fmt_bytes(self.peak_reserved_bytes + self.context_bytes)}")
        else:
            lines.append("  no batch fits (batch 1 runs out of memory)")
        lines.append(f"  {len(self.probes)} predictions: " + ", ".join(
            f"{p.batch_size}{'' if p.fits else 'x'}" for p in self.probes) + "  (x: OOM)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)



def _search(fits: Callable[[int], bool], max_batch: int, max_probes: int) -> tuple[int, bool]:
    """Largest b in [1, max_batch] with fits(b), assuming fits is monotone: doubling from 1 to
    the first failure, then bisection between the last success and it. Returns (b, exact):
    exact is False when the probe budget ran out before the bracket closed."""
    count = 0

    def probe(b: int) -> bool:
        nonlocal count
        count += 1
        return fits(b)

    if not probe(1):
        return 0, True
    lo, hi = 1, 0
    b = 2
    while b <= max_batch:
        if count >= max_probes:
            return lo, False
        if probe(b):
            lo, b = b, b * 2
        else:
            hi = b
            break
    if hi == 0:  # every power of two up to max_batch fits
        if lo == max_batch:
            return lo, True
        if count >= max_probes:
            return lo, False
        if probe(max_batch):
            return max_batch, True
        hi = max_batch
    while hi - lo > 1:
        if count >= max_probes:
            return lo, False
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, True


def max_batch_size(
    model: torch.nn.Module | str,
    *,
    gpu: str = "H200",
    memory_budget: int | str | None = None,
    mode: str = "inference",
    dtype: str | torch.dtype | None = None,
    seq_len: int | None = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_probes: int = DEFAULT_MAX_PROBES,
    time_limit_s: float | None = None,
    **trace_kwargs: Any,
) -> BatchSearch:
    """The largest batch whose predicted peak reserved memory plus the CUDA context fits
    `memory_budget` (bytes or "40GiB"; default: the GPU's memory) less `safety_margin`.

    Each probe is a full blink.predict at that batch size (trace_kwargs go to it: input_shape
    for your own module, optimizer, expandable_segments, ...). The search assumes that a batch
    that does not fit has no larger batch that does (allocator rounding can make memory dip
    by a segment between neighbouring batches, never by a trend); the result keeps every
    probe, so its batch is known to fit and (unless it is max_batch) its successor known not
    to.
    time_limit_s: raise TimeLimitError instead of starting a prediction after that long.
    """
    from .predict import CUDA_CONTEXT_BYTES, predict

    _no_fixed_inputs(trace_kwargs)
    margin = _check_margin(safety_margin)
    max_batch = _positive("max_batch", max_batch, 1 << 24)
    max_probes = _positive("max_probes", max_probes, 1000)
    gpu_name, budget = _budget(gpu, memory_budget)
    usable = int(budget * (1.0 - margin))
    if usable <= CUDA_CONTEXT_BYTES:
        raise ConfigError(f"the budget {_fmt_bytes(budget)} less the {100 * margin:.0f}% margin "
                          f"leaves nothing beside the CUDA context (~"
                          f"{_fmt_bytes(CUDA_CONTEXT_BYTES)}); raise memory_budget")
    probes: dict[int, Probe] = {}
    first: list[Prediction] = []
    clock = _Clock(time_limit_s, "max_batch_size")

    def fits(b: int) -> bool:
        clock.check(len(probes))
        p = predict(model, batch_size=b, gpu=gpu_name, dtype=dtype, mode=mode, seq_len=seq_len,
                    memory_budget=usable, **trace_kwargs)
        if not first:
            first.append(p)
        probes[b] = _probe(p)
        return probes[b].fits

    best, exact = _search(fits, max_batch, max_probes)
    p0 = first[0]
    notes = []
    if not exact:
        notes.append(f"stopped after {max_probes} predictions: {best} fits, but larger batches "
                     "below the first failure were not all tried (raise max_probes)")
    if best == max_batch:
        notes.append(f"reached max_batch={max_batch}; larger batches may fit too")
    if best == 0 and probes[1].oom:
        from .predict import _oom_text

        notes.append(f"batch 1: {_oom_text(probes[1].oom)}")
    return BatchSearch(
        model=p0.model, gpu=gpu_name, mode=p0.mode, dtype=p0.dtype, seq_len=p0.seq_len,
        batch_size=best, peak_reserved_bytes=probes[best].peak_reserved_bytes if best else 0,
        context_bytes=p0.context_bytes, budget_bytes=budget, safety_margin=margin,
        usable_bytes=usable, max_batch=max_batch,
        probes=[probes[b] for b in probes], notes=notes)


# -- optimize_batch ---------------------------------------------------------------------------

@dataclass
class BatchSweep(_Report):
    """Time, throughput and memory against batch size, and the best batch within the budget."""

    FORMAT: ClassVar[str] = "blink.optimize_batch"

    model: str
    gpu: str
    mode: str
    dtype: str
    seq_len: int | None
    budget_bytes: int
    usable_bytes: int
    safety_margin: float
    context_bytes: int
    rows: list[Probe]            # sorted by batch size
    best: Probe | None           # highest throughput among the rows that fit
    max_batch_size: int | None   # from the search (None when batch_sizes were given)
    notes: list[str] = field(default_factory=list)
    kv_cache: int | None = None  # generation steps after this many cached tokens

    def table(self) -> str:
        seq = "" if self.seq_len is None else f", seq {self.seq_len}"
        seq += f", {self.kv_cache} cached tokens" if self.kv_cache else ""
        lines = [
            f"blink optimize-batch: {self.model} on {self.gpu} ({self.mode}, {self.dtype}{seq})",
            f"  budget {_fmt_bytes(self.budget_bytes)} less {100 * self.safety_margin:.0f}% "
            f"margin = {_fmt_bytes(self.usable_bytes)} (CUDA context included)",
            "",
            f"  {'batch':>7} {'time ms':>11} {'samples/s':>11} {'peak reserved':>14} "
            f"{'+context':>11}  fits",
        ]
        for r in self.rows:
            mark = "  <- best" if self.best is not None and r is self.best else ""
            lines.append(f"  {r.batch_size:>7} {r.time_ms:>11.3f} {r.throughput:>11.1f} "
                         f"{_fmt_bytes(r.peak_reserved_bytes):>14} "
                         f"{_fmt_bytes(r.nvidia_smi_bytes):>11}  {'yes' if r.fits else 'no'}"
                         f"{mark}")
        if self.max_batch_size is not None:
            lines.append(f"  largest batch that fits: {self.max_batch_size}")
        if any(r.alloc_retries for r in self.rows if r.fits) and any(
                not r.fits for r in self.rows):
            lines.append("  (rows that fit near the budget did so after the allocator freed its "
                         "cache and retried; rows that do not fit show the peak reserved with "
                         "no limit, cache kept)")
        if self.best is None:
            lines.append("  no batch fits the budget")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


    def plot(self, path: str) -> str:
        return plot_sweep(self, path)


def _best(rows: Sequence[Probe]) -> Probe | None:
    ok = [r for r in rows if r.fits and r.time_ms > 0]
    return max(ok, key=lambda r: (r.throughput, -r.batch_size)) if ok else None


def optimize_batch(
    model: torch.nn.Module | str,
    *,
    gpu: str = "H200",
    batch_sizes: Sequence[int] | None = None,
    memory_budget: int | str | None = None,
    mode: str = "inference",
    dtype: str | torch.dtype | None = None,
    seq_len: int | None = None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_probes: int = DEFAULT_MAX_PROBES,
    time_limit_s: float | None = None,
    **trace_kwargs: Any,
) -> BatchSweep:
    """Predicted time, throughput and peak memory against batch size; the best batch within the
    budget. Without `batch_sizes` the grid is what max_batch_size probes (powers of two up to
    the first that fails, the largest batch that fits and its successor), so the sweep costs
    no prediction beyond the search."""
    from .predict import CUDA_CONTEXT_BYTES, predict

    _no_fixed_inputs(trace_kwargs)
    margin = _check_margin(safety_margin)
    if batch_sizes is None:
        s = max_batch_size(model, gpu=gpu, memory_budget=memory_budget, mode=mode, dtype=dtype,
                           seq_len=seq_len, safety_margin=margin, max_batch=max_batch,
                           max_probes=max_probes, time_limit_s=time_limit_s, **trace_kwargs)
        keep = {b for b in (s.batch_size, s.batch_size + 1) if b > 0}
        rows = sorted((p for p in s.probes
                       if p.batch_size & (p.batch_size - 1) == 0 or p.batch_size in keep),
                      key=lambda p: p.batch_size)
        return BatchSweep(s.model, s.gpu, s.mode, s.dtype, s.seq_len, s.budget_bytes,
                          s.usable_bytes, margin, s.context_bytes, rows, _best(rows),
                          s.batch_size, list(s.notes), trace_kwargs.get("kv_cache"))
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence) or not (
            batch_sizes):
        raise ConfigError(f"batch_sizes must be a non-empty list of positive integers, got "
                          f"{batch_sizes!r}")
    if len(batch_sizes) > MAX_SWEEP_POINTS:
        raise ConfigError(f"at most {MAX_SWEEP_POINTS} batch sizes, got {len(batch_sizes)}")
    sizes = sorted({_positive("batch size", b, max_batch) for b in batch_sizes})
    gpu_name, budget = _budget(gpu, memory_budget)
    usable = int(budget * (1.0 - margin))
    clock = _Clock(time_limit_s, "optimize_batch")
    preds: list[Prediction] = []
    for b in sizes:
        clock.check(len(preds))
        preds.append(predict(model, batch_size=b, gpu=gpu_name, dtype=dtype, mode=mode,
                             seq_len=seq_len, memory_budget=usable, **trace_kwargs))
    rows = [_probe(p) for p in preds]
    p0 = preds[0]
    return BatchSweep(p0.model, gpu_name, p0.mode, p0.dtype, p0.seq_len, budget, usable, margin,
                      CUDA_CONTEXT_BYTES, rows, _best(rows), None,
                      kv_cache=trace_kwargs.get("kv_cache"))


def plot_sweep(sweep: BatchSweep, path: str) -> str:
    """Time, throughput and memory against batch size, with the budget line; .png or .svg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not str(path).lower().endswith((".png", ".svg")):
        raise ConfigError(f"plot path must end in .png or .svg, got {path!r}")
    rows = sweep.rows
    xs = [r.batch_size for r in rows]
    gib = 2**30
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    seq = "" if sweep.seq_len is None else f", seq {sweep.seq_len}"
    title = f"{sweep.model} on {sweep.gpu} ({sweep.mode}, {sweep.dtype}{seq})"
    fig.suptitle(title)
    ok = [r.fits for r in rows]
    for ax, ys, label in [
        (axes[0], [r.time_ms for r in rows], "time per step (ms)"),
        (axes[1], [r.throughput for r in rows], "throughput (samples/s)"),
        (axes[2], [r.nvidia_smi_bytes / gib for r in rows], "peak reserved + context (GiB)"),
    ]:
        ax.plot(xs, ys, "-", color="tab:blue")
        ax.scatter([x for x, f in zip(xs, ok, strict=True) if f],
                   [y for y, f in zip(ys, ok, strict=True) if f], color="tab:blue", zorder=3,
                   label="fits")
        ax.scatter([x for x, f in zip(xs, ok, strict=True) if not f],
                   [y for y, f in zip(ys, ok, strict=True) if not f], color="tab:red", marker="x",
                   zorder=3, label="out of memory")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[2].axhline(sweep.budget_bytes / gib, color="tab:red", linestyle="-",
                    label=f"budget {sweep.budget_bytes / gib:.1f} GiB")
    axes[2].axhline(sweep.usable_bytes / gib, color="tab:orange", linestyle="--",
                    label=f"budget less {100 * sweep.safety_margin:.0f}% margin")
    if sweep.best is not None:
        for ax in axes:
            ax.axvline(sweep.best.batch_size, color="tab:green", linestyle=":", alpha=0.8)
        axes[1].annotate(f"best: {sweep.best.batch_size}",
                         (sweep.best.batch_size, sweep.best.throughput),
                         textcoords="offset points", xytext=(-60, -15))
    axes[2].legend(loc="upper left", fontsize=8)
    if len(xs) > 1 and max(xs) / min(xs) >= 8:
        axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("batch size")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


# -- compare ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompareRow:
    model: str
    gpu: str
    dtype: str
    batch_size: int
    seq_len: int | None
    time_ms: float
    throughput: float       # samples/s
    peak_reserved_bytes: int
    nvidia_smi_bytes: int
    fits: bool
    relative: float         # time / the fastest row's time (1.0 = fastest)


@dataclass
class Comparison(_Report):
    FORMAT: ClassVar[str] = "blink.compare"
    mode: str
    batch_size: int
    seq_len: int | None
    rows: list[CompareRow]
    kv_cache: int | None = None  # generation steps after this many cached tokens

    def table(self) -> str:
        seq = "" if self.seq_len is None else f", seq {self.seq_len}"
        seq += f", {self.kv_cache} cached tokens" if self.kv_cache else ""
        w = max([len(r.model) for r in self.rows] + [5])
        lines = [f"blink compare ({self.mode}, batch {self.batch_size}{seq})", "",
                 f"  {'model':<{w}} {'gpu':<12} {'dtype':<9} {'time ms':>10} {'samples/s':>11} "
                 f"{'+context':>11} {'fits':>4} {'relative':>8}"]
        for r in self.rows:
            lines.append(f"  {r.model:<{w}} {r.gpu:<12} {r.dtype:<9} {r.time_ms:>10.3f} "
                         f"{r.throughput:>11.1f} {_fmt_bytes(r.nvidia_smi_bytes):>11} "
                         f"{'yes' if r.fits else 'no':>4} {r.relative:>7.2f}x")
        return "\n".join(lines)



def _as_list(name: str, value: object) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        value = [value]
    out = list(value)
    if not out:
        raise ConfigError(f"{name}: give at least one")
    return out


def _seq_len_for(model: object, seq_len: int | None) -> int | None:
    """seq_len for a text model; None for a zoo vision model, so that one comparison can hold
    both (an unknown name keeps it and lets the resolver decide)."""
    from . import zoo
    from .models import is_file_spec

    if not isinstance(model, str) or is_file_spec(model):
        return seq_len  # a module, or a user's file, which only the dry run imports
    try:
        kind = zoo.get_entry(model).kind
    except BlinkError:
        return seq_len
    return None if kind in (zoo.VISION, zoo.VIDEO) else seq_len


def compare(
    models: Sequence[torch.nn.Module | str] | torch.nn.Module | str,
    gpus: Sequence[str] | str = ("H200",),
    dtypes: Sequence[str] | str | None = None,
    *,
    batch_size: int = 1,
    mode: str = "inference",
    seq_len: int | None = None,
    memory_budget: int | str | None = None,
    time_limit_s: float | None = None,
    **trace_kwargs: Any,
) -> Comparison:
    """Predict every (model, GPU, dtype) at one batch size; rows sorted by time, with each
    row's time relative to the fastest. Each cell is traced for its own GPU (the fused
    attention kernel CUDA picks depends on it). seq_len applies to the text models (zoo
    vision models ignore it)."""
    from .predict import predict

    model_list = _as_list("models", models)
    gpu_list = _as_list("gpus", gpus)
    dtype_list = _as_list("dtypes", "fp32" if dtypes is None else dtypes)
    cells = len(model_list) * len(gpu_list) * len(dtype_list)
    if cells > MAX_COMPARE_CELLS:
        raise ConfigError(f"{cells} (model, gpu, dtype) combinations; at most "
                          f"{MAX_COMPARE_CELLS}")
    _positive("batch_size", batch_size)
    budgets = {g: _budget(g, memory_budget) for g in gpu_list}  # unknown GPUs fail first
    clock = _Clock(time_limit_s, "compare")
    preds: list[Prediction] = []
    for m in model_list:
        seq = _seq_len_for(m, seq_len)
        for g in gpu_list:
            name, budget = budgets[g]
            for dt in dtype_list:
                clock.check(len(preds))
                preds.append(predict(m, batch_size=batch_size, gpu=name, dtype=dt, mode=mode,
                                     seq_len=seq, memory_budget=budget, **trace_kwargs))
    fastest = min(p.time_ms for p in preds) or 1.0
    rows = [CompareRow(p.model, p.gpu, p.dtype, batch_size, p.seq_len, p.time_ms,
                       batch_size * 1e3 / p.time_ms if p.time_ms > 0 else 0.0,
                       p.peak_reserved_bytes, p.nvidia_smi_bytes, p.fits, p.time_ms / fastest)
            for p in preds]
    rows.sort(key=lambda r: r.time_ms)
    return Comparison(mode, batch_size, seq_len, rows, trace_kwargs.get("kv_cache"))


# -- the command line -------------------------------------------------------------------------

def add_plan_parsers(subparsers: Any) -> None:
    """Register `optimize-batch` and `compare` on the `blink` command line."""
    p = subparsers.add_parser(
        "optimize-batch", help="largest batch that fits and the best throughput within a budget",
        description="Predict time, throughput and peak memory against batch size (exponential "
                    "then binary search for the largest batch that fits), and the best batch "
                    "within the memory budget.")
    p.add_argument("model", help="a model name (`blink models`)")
    p.add_argument("--gpu", default="H200", help="target GPU (`blink gpus`)")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="memory the run may use, CUDA context included: 40GiB, 40GB, 40G (= GiB)"
                        " (default: the GPU's memory)")
    p.add_argument("--margin", type=float, default=DEFAULT_SAFETY_MARGIN,
                   help=f"safety margin, a fraction of the budget (default "
                        f"{DEFAULT_SAFETY_MARGIN})")
    p.add_argument("--batch-sizes", default=None, metavar="LIST",
                   help="predict these batch sizes (e.g. 1,8,32) instead of searching")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help=f"upper end of the search (default {DEFAULT_MAX_BATCH})")
    _common_args(p)
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="also plot time, throughput and memory against batch size (.png/.svg)")
    p.set_defaults(func=_cmd_optimize_batch)

    p = subparsers.add_parser(
        "compare", help="compare models, GPUs and dtypes at one batch size",
        description="Predict every (model, GPU, dtype) combination; rows sorted by time.")
    p.add_argument("models", nargs="+", metavar="MODEL", help="model names (`blink models`)")
    p.add_argument("--gpu", action="extend", nargs="+", default=None,
                   help="target GPUs: --gpu H200 A100-80GB, H200,A100-80GB or the flag "
                        "repeated (default H200)")
    p.add_argument("--batch-size", "-b", type=int, default=1)
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="memory budget for the fits column (default: each GPU's memory)")
    _common_args(p, dtype_repeat=True)
    p.set_defaults(func=_cmd_compare)


def _common_args(p: Any, dtype_repeat: bool = False) -> None:
    if dtype_repeat:
        p.add_argument("--dtype", action="extend", nargs="+", default=None,
                       help="fp32, bf16, fp16, amp-bf16, amp-fp16; several as for --gpu "
                            "(default fp32)")
    else:
        p.add_argument("--dtype", default="fp32",
                       help="fp32, bf16, fp16, amp-bf16 or amp-fp16 (default fp32)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (text models)")
    p.add_argument("--mode", choices=["inference", "train"], default="inference")
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="train with the model's own activation checkpointing on")
    p.add_argument("--kv-cache", type=int, default=None, metavar="TOKENS",
                   help="a generation step: --seq-len new tokens after TOKENS in the KV cache "
                        "(transformers causal LMs, inference)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write JSON instead of the table (to PATH, or stdout without one)")


def _write(a: Any, result: BatchSweep | Comparison) -> None:
    import json
    import sys

    if a.json is None:
        print(result.table())
        return
    text = json.dumps(result.to_dict())
    if a.json == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(a.json, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {a.json}")


def _cmd_optimize_batch(a: Any) -> int:
    sizes = None
    if a.batch_sizes:
        try:
            sizes = [int(x) for x in a.batch_sizes.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--batch-sizes takes integers separated by commas, like 1,8,32; "
                              f"got {a.batch_sizes!r}") from None
    if a.plot and not a.plot.lower().endswith((".png", ".svg")):
        raise ConfigError(f"--plot must name a .png or .svg file, got {a.plot!r}")
    s = optimize_batch(a.model, gpu=a.gpu, batch_sizes=sizes, memory_budget=a.budget,
                       mode=a.mode, dtype=a.dtype, seq_len=a.seq_len, safety_margin=a.margin,
                       max_batch=a.max_batch, grad_checkpointing=a.grad_checkpointing,
                       kv_cache=a.kv_cache)
    _write(a, s)
    if a.plot:
        s.plot(a.plot)
        import sys

        print(f"plot written to {a.plot}", file=sys.stderr)
    return 0


def _names(values: list[str] | None, default: str) -> list[str]:
    """Flag values given as separate words and/or comma-separated, blanks dropped."""
    out = [x.strip() for v in values or [default] for x in v.split(",")]
    return [x for x in out if x]


def _cmd_compare(a: Any) -> int:
    c = compare(a.models, _names(a.gpu, "H200"), _names(a.dtype, "fp32"), batch_size=a.batch_size,
                mode=a.mode, seq_len=a.seq_len, memory_budget=a.budget,
                grad_checkpointing=a.grad_checkpointing, kv_cache=a.kv_cache)
    _write(a, c)
    return 0
