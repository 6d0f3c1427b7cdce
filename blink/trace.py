"""The dry-run trace: every ATen op and every meta storage event of a model run, seen from C++.

Why the meta device and not FakeTensorMode with fake CUDA tensors (measured on torch 2.14,
CPU-only machine): both pick SDPA's *math* decomposition, because with no GPU present
`_fused_sdp_choice` cannot ask CUDA; FakeTensorMode also records every op twice (the fake op
and the meta op it runs underneath, plus PythonDispatchMode frames) and costs tens of µs of
Python per op. So Blink traces on plain meta tensors and, while tracing only, reroutes
`aten::scaled_dot_product_attention` to the fused kernel CUDA would pick for the target GPU
(blink.sdpa), so the trace holds `_scaled_dot_product_flash_attention` (and its backward, and
its logsumexp allocation) exactly as a CUDA run would. The meta device's own decompositions
(addmm -> mm, mul, add in Python refs) stay in the tree as children; the cut stage decides which
op in a subtree is the CUDA kernel.
"""
from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _ext, cuda_paths
from .errors import BlinkError, DataDependentError, MissingMetaKernelError, TraceError

# 2: op rows carry the has-a-CUDA-kernel flag; 3: and the observer's entry / exit timestamps
# (steady-clock ns since the trace started, then the thread's CPU-time clock). Version 2 files
# still load (no timestamps: host time then comes from the table).
FORMAT_VERSION = 3
_READABLE_VERSIONS = (2, 3)
PHASES = ("forward", "backward", "optimizer")
# Roles of resident storages, in the order of blink::MemoryCategory's first codes.
RESIDENT_ROLES = ("weights", "inputs", "optimizer_state")
_PHASE_CODE = {name: i for i, name in enumerate(PHASES)}

# Argument kinds, in the order of blink::ArgKind (csrc/include/blink/trace_types.h).
_TENSOR, _TENSOR_LIST = 1, 2

_C = _ext.load()

_dtype_names: dict[int, str] | None = None
_device_names: dict[int, str] = {}


def _dtype_table() -> dict[int, str]:
    global _dtype_names
    if _dtype_names is None:
        table: dict[int, str] = {}
        with warnings.catch_warnings():  # experimental / deprecated dtypes warn on creation
            warnings.simplefilter("ignore")
            _fill_dtype_table(table)
        _dtype_names = table
    return _dtype_names


def _fill_dtype_table(table: dict[int, str]) -> None:
    for name in dir(torch):
        dt = getattr(torch, name)
        if isinstance(dt, torch.dtype):
            try:
                code = _C.scalar_type_of(torch.empty(0, dtype=dt, device="meta"))
            except (RuntimeError, TypeError):
                continue
            # Aliases (torch.float, torch.float32) share a code and str() gives the canonical.
            table[code] = str(dt).removeprefix("torch.")


def _device_name(code: int) -> str:
    name = _device_names.get(code)
    if name is None:
        name = _device_names[code] = _C.device_type_name(code) if code >= 0 else "none"
    return name


_ITEMSIZE: dict[str, int] = {}


def dtype_itemsize(dtype: str) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        dt = getattr(torch, dtype, None)
        size = _ITEMSIZE[dtype] = dt.itemsize if isinstance(dt, torch.dtype) else 0
    return size


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """A tensor argument as the op saw it. storage > 0: allocated during the trace;
    storage < 0: existed before it (weights, inputs); 0: no storage (e.g. symbolic)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage: int
    storage_nbytes: int
    dtype: str
    device: str
    requires_grad: bool

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_itemsize(self.dtype)


Value = Any  # TensorMeta | list[TensorMeta | None] | int | float | bool | str | list | None


@dataclass(slots=True)
class Op:
    """One dispatcher call. `parent` is the enclosing op's id (-1 at the top): the call tree."""

    id: int
    name: str
    overload: str
    parent: int
    module: str | None
    phase: str
    seq_nr: int
    thread: int
    depth: int
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    kernel: bool = False  # the op has its own CUDA kernel
    # Steady-clock ns since the trace started when the observer saw the op begin / end; -1 when
    # not recorded (format 2 traces). End of one op to start of the next = the caller's work.
    t_start_ns: int = -1
    t_end_ns: int = -1
    # The same moments on the thread's CPU-time clock (ns): without sleeps and preemption.
    cpu_start_ns: int = -1
    cpu_end_ns: int = -1
    children: list[int] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    def tensors(self, which: str = "inputs") -> list[TensorMeta]:
        out: list[TensorMeta] = []
        for v in getattr(self, which):
            if isinstance(v, TensorMeta):
                out.append(v)
            elif isinstance(v, list):
                out.extend(t for t in v if isinstance(t, TensorMeta))
        return out


@dataclass(frozen=True, slots=True)
class StorageEvent:
    """An allocation (is_free False) or free of a meta storage, in program order."""

    storage: int
    nbytes: int
    op: int
    is_free: bool
    thread: int


def _tensor(raw: list | tuple) -> TensorMeta:
    sizes, strides, offset, storage, nbytes, dtype, device, rg = raw
    return TensorMeta(
        tuple(sizes), tuple(strides), offset, storage, nbytes,
        _dtype_table().get(dtype, f"scalar_type_{dtype}"), _device_name(device), bool(rg),
    )


def _value(raw: list | tuple) -> Value:
    kind, v = raw
    if kind == _TENSOR:
        return _tensor(v)
    if kind == _TENSOR_LIST:
        return [None if t is None else _tensor(t) for t in v]
    return v


class Trace:
    """The record of one dry run. Ops and events are built from the raw C++ record on first use."""

    def __init__(self, raw: dict[str, Any] | None = None, meta: dict[str, Any] | None = None):
        self.meta: dict[str, Any] = dict(meta or {})
        self._raw_dict: dict[str, Any] | None = raw or {
            "ops": [], "allocs": [], "externals": [], "names": [], "modules": [],
        }
        self._native: Any = None  # blink._C.RawTrace until first read
        self._ops: list[Op] | None = None
        self._allocs: list[StorageEvent] | None = None
        self.has_timestamps = bool(self._raw_dict["ops"]) and all(
            len(r) >= 17 and r[13] >= 0 and r[15] >= 0 for r in self._raw_dict["ops"])

    # -- building ------------------------------------------------------------------------
    def _set_native(self, native: Any) -> None:
        self._native = native
        self.has_timestamps = True  # every op of a fresh trace is stamped
        self._raw_dict = None
        self._ops = None
        self._allocs = None

    @property
    def _raw(self) -> dict[str, Any]:
        if self._raw_dict is None:
            self._raw_dict = self._native.to_python()
        return self._raw_dict

    def native(self) -> Any:
        """The C++ record (blink._C.RawTrace) the cost engine reads."""
        if self._native is None:
            try:
                self._native = _C.trace_from_python(self._raw)
            except (TypeError, ValueError, IndexError, RuntimeError) as exc:
                raise BlinkError(f"the trace's records are malformed: {exc}") from exc
        return self._native

    @property
    def ops(self) -> list[Op]:
        if self._ops is None:
            names = self._raw["names"]
            modules = self._raw["modules"]
            ops: list[Op] = []
            for r in self._raw["ops"]:
                (oid, parent, name, overload, module, seq, phase, _scope, thread, depth,
                 inputs, outputs, kernel) = r[:13]
                t0, t1, c0, c1 = r[13:17] if len(r) >= 17 else (-1, -1, -1, -1)
                ops.append(Op(
                    oid, names[name], names[overload], parent,
                    modules[module] if module >= 0 else None, PHASES[phase], seq, thread, depth,
                    tuple(_value(a) for a in inputs), tuple(_value(a) for a in outputs),
                    bool(kernel), int(t0), int(t1), int(c0), int(c1),
                ))
            for op in ops:
                if op.parent >= 0:
                    ops[op.parent].children.append(op.id)
            self._ops = ops
        return self._ops

    @property
    def allocations(self) -> list[StorageEvent]:
        if self._allocs is None:
            self._allocs = [StorageEvent(s, n, o, bool(f), t)
                            for s, n, o, f, t in self._raw["allocs"]]
        return self._allocs

    @property
    def external_storages(self) -> dict[int, int]:
        """Storages that existed before the trace (weights, inputs): id -> bytes."""
        return {e[0]: e[1] for e in self._raw["externals"]}

    @property
    def modules(self) -> list[str]:
        return list(self._raw["modules"])

    def __len__(self) -> int:
        if self._raw_dict is None and self._native is not None:
            return int(self._native.num_ops())
        return len(self._raw_dict["ops"])

    # -- queries ---------------------------------------------------------------------------
    def roots(self) -> list[Op]:
        return [op for op in self.ops if op.parent < 0]

    def children(self, op: Op | int) -> list[Op]:
        ops = self.ops
        idx = op if isinstance(op, int) else op.id
        return [ops[c] for c in ops[idx].children]

    def walk(self, op: Op | int) -> Iterator[Op]:
        """The op and all its descendants, depth first."""
        ops = self.ops
        stack = [op if isinstance(op, int) else op.id]
        while stack:
            cur = ops[stack.pop()]
            yield cur
            stack.extend(reversed(cur.children))

    def user_ops(self) -> list[Op]:
        """The ops user code (or an autograd node) called directly: roots, and the first aten
        ops under the autograd engine's wrappers. What the summary table counts."""
        ops = self.ops
        out = []
        for op in ops:
            if op.name.startswith("autograd::") or not op.name.startswith(("aten::", "prims::")):
                continue
            p = op.parent
            if p < 0:
                out.append(op)
                continue
            parent = ops[p]
            if parent.name.startswith("autograd::") or not parent.name.startswith(("aten::",
                                                                                  "prims::")):
                out.append(op)
        return out

    def op_counts(self) -> Counter[str]:
        return Counter(op.name for op in self.ops)

    def live_bytes_peak(self) -> int:
        """Peak of the bytes held by storages the trace allocated (no caching, no rounding)."""
        live = peak = 0
        for ev in self.allocations:
            if ev.storage < 0:  # a resident storage released (a KV cache layer): not counted
                continue
            live += -ev.nbytes if ev.is_free else ev.nbytes
            peak = max(peak, live)
        return peak

    def summary(self, max_rows: int = 30) -> str:
        user = self.user_ops()
        ops = self.ops
        # Each op's nearest user-op ancestor, so storage events can be charged to it.
        owner: dict[int, int] = {op.id: op.id for op in user}
        for op in ops:
            if op.id not in owner and op.parent >= 0 and op.parent in owner:
                owner[op.id] = owner[op.parent]
        new_bytes: Counter[str] = Counter()
        for ev in self.allocations:
            if not ev.is_free and ev.op in owner:
                new_bytes[ops[owner[ev.op]].name] += ev.nbytes
        per: dict[str, list[int]] = {}
        for op in user:
            per.setdefault(op.name, [0, 0, 0])[_PHASE_CODE[op.phase]] += 1
        rows = sorted(per.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
        head = ", ".join(f"{k}={v}" for k, v in self.meta.items()
                         if k in _SUMMARY_META and v is not None)
        resident = sum(self.external_storages.values())
        lines = [
            f"blink trace{(' (' + head + ')') if head else ''}",
            f"{len(self)} ops recorded, {len(user)} called by user code or autograd; "
            f"{sum(1 for e in self.allocations if not e.is_free)} storages allocated; "
            f"peak live {_fmt_bytes(self.live_bytes_peak())} + resident {_fmt_bytes(resident)}",
            "",
            f"{'op':<44} {'calls':>7} {'fwd':>7} {'bwd':>7} {'opt':>7} {'allocated':>11}",
            "-" * 87,
        ]
        for name, (f, b, o) in rows[:max_rows]:
            lines.append(
                f"{name:<44} {f + b + o:>7} {f:>7} {b:>7} {o:>7} {_fmt_bytes(new_bytes[name]):>11}"
            )
        if len(rows) > max_rows:
            lines.append(f"... {len(rows) - max_rows} more op kinds")
        lines.append("allocated = bytes of new storages made by each op kind (views make none)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        n = (self._native.num_allocs() if self._raw_dict is None and self._native is not None
             else len(self._raw_dict["allocs"]))
        return f"<blink.Trace {len(self)} ops, {n} storage events>"

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "blink.trace",
            "format_version": FORMAT_VERSION,
            "meta": self.meta,
            "dtypes": {str(k): v for k, v in _dtype_table().items()},
            **{k: self._raw[k] for k in ("names", "modules", "allocs", "externals")},
            # Rows read from a format-2 file get "not recorded" timestamps.
            "ops": [list(r) + [-1] * 4 if len(r) == 13 else r for r in self._raw["ops"]],
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, source: str | os.PathLike[str]) -> Trace:
        """Load from a JSON string or a file path."""
        doc, where = read_json_document(source, "trace")
        version = doc.get("format_version")
        if version not in _READABLE_VERSIONS:
            raise BlinkError(
                f"{where} has trace format_version {version!r}; this blink reads versions "
                f"{', '.join(map(str, _READABLE_VERSIONS))}. Re-create the trace with this "
                "blink version."
            )
        missing = [k for k in ("names", "modules", "ops", "allocs", "externals") if k not in doc]
        if missing:
            raise BlinkError(f"{where} is a truncated blink trace: missing {', '.join(missing)}")
        saved = {int(k): v for k, v in doc.get("dtypes", {}).items()}
        if saved and saved != {k: v for k, v in _dtype_table().items() if k in saved}:
            raise BlinkError(
                f"{where} was written by a torch whose dtype codes differ from this one's; "
                "re-create the trace here"
            )
        raw = {k: doc[k] for k in ("names", "modules", "ops", "allocs", "externals")}
        for key, value in raw.items():
            if not isinstance(value, list):
                raise BlinkError(f"{where} is a damaged blink trace: \"{key}\" must be a list, "
                                 f"not {type(value).__name__}")
        width = 13 if version == 2 else 17
        bad = next((i for i, r in enumerate(raw["ops"])
                    if not isinstance(r, list) or len(r) != width), None)
        if bad is not None:
            raise BlinkError(f"{where}: op record {bad} is not a list of {width} fields, as "
                             f"trace format_version {version} has")
        meta = doc.get("meta", {})
        if not isinstance(meta, dict):
            raise BlinkError(f"{where} is a damaged blink trace: \"meta\" is not an object")
        t = cls(raw, meta)
        # Check every record now (in C++, before anything indexes with them), so a damaged file
        # fails here with the record it is in.
        try:
            t.native()
        except BlinkError as exc:
            raise BlinkError(f"{where} is a damaged blink trace: {exc}") from exc
        return t


def read_json_document(source: str | os.PathLike[str], kind: str) -> tuple[dict, str]:
    """A blink JSON document ("format": "blink.<kind>") from a JSON string or a file path, and
    how to name it in errors. Raises BlinkError for an unreadable file, invalid JSON or another
    format."""
    text = str(source)
    where = "the JSON text"
    if not text.lstrip().startswith("{"):
        where = text
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise BlinkError(f"cannot read {kind} file {where}: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BlinkError(f"{where} is not a blink {kind}: invalid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != f"blink.{kind}":
        raise BlinkError(f"{where} is not a blink {kind} (no \"format\": \"blink.{kind}\")")
    return doc, where


_SUMMARY_META = ("model", "mode", "dtype", "batch_size", "seq_len", "gpu", "sdpa")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# -- the context manager ------------------------------------------------------------------------

_DATA_DEPENDENT_OPS = ("aten::nonzero", "aten::_local_scalar_dense", "aten::item",
                       "aten::masked_select", "aten::_unique2", "aten::unique_dim",
                       "aten::unique_consecutive", "aten::nonzero_static")


class trace:  # noqa: N801 - used as `with blink.trace(model) as t:`
    """Record every ATen op and meta storage event of the code inside the block.

    ``with blink.trace(model, gpu="H200") as t:`` — run the model on meta tensors inside; on
    exit ``t`` holds the ops (with call tree, module paths and phases) and storage events.
    ``model`` is only used to name module paths; it is not modified. ``nonzero="assume_all"``
    lets data-dependent ops (nonzero, boolean masks) run by assuming every element is non-zero
    (an upper bound on size and memory); the default raises a DataDependentError.

    Ops below an op that has its own CUDA kernel (e.g. the mm/mul/add that meta's addmm runs in
    Python) are meta-only decompositions and are not recorded unless ``record_all=True``; the
    storage events inside them are recorded and attributed to the kernel op.

    Every op carries the steady-clock time the observer saw it begin and end (Op.t_start_ns,
    Op.t_end_ns) and the same on the thread's CPU-time clock (Op.cpu_start_ns, cpu_end_ns):
    the time between ops is the caller's own work on this CPU, which blink.predict uses as host
    time (host_time="measured": CPU time; "wall": steady clock). ``timing_only=True`` records
    the call tree and the times but no arguments (for calibrating the tracer's overhead; it
    cannot be costed).
    """

    def __init__(self, model: torch.nn.Module | None = None, *, gpu: str = "H200",
                 sdpa: str = "auto", nonzero: str = "error", record_all: bool = False,
                 meta: dict[str, Any] | None = None, timing_only: bool = False,
                 resident: dict[str, list[torch.Tensor]] | None = None) -> None:
        from . import sdpa as _sdpa
        from .hardware import get_gpu

        if nonzero not in ("error", "assume_all"):
            raise BlinkError(f"nonzero must be 'error' or 'assume_all', not {nonzero!r}")
        if sdpa != "auto" and sdpa not in _sdpa.SDPA_BACKENDS:
            raise BlinkError(
                f"unknown sdpa backend {sdpa!r}; choose 'auto' or one of {_sdpa.SDPA_BACKENDS}"
            )
        self._gpu = get_gpu(gpu)
        self._model = model
        self._sdpa = sdpa
        self._nonzero = nonzero
        self._record_all = record_all
        self._timing_only = bool(timing_only)
        self.result = Trace(meta={"gpu": self._gpu.name, "sdpa": sdpa, **(meta or {})})
        self._undo: list[Any] = []
        self._stack: list[str] = []
        # Tensors that exist before the run, by role ("inputs", "optimizer_state"); the model's
        # parameters and buffers are "weights". Registered first, so the memory breakdown
        # knows which resident storage is which (RESIDENT_ROLES). "kv_cache": inputs the run
        # may release (a KV cache's layers), not held by the trace.
        roles = (*RESIDENT_ROLES, "kv_cache")
        for role in resident or {}:
            if role not in roles:
                raise BlinkError(f"unknown resident role {role!r}; use one of {roles}")
        self._resident = dict(resident or {})

    def __enter__(self) -> Trace:
        if _C.tracer_active():
            raise BlinkError("a blink trace is already running; traces cannot be nested")
        try:
            self._install()
            _C.tracer_start(record_all=self._record_all, timing_only=self._timing_only)
        except BaseException:
            self._uninstall()
            raise
        try:
            self._register_resident()
        except BaseException:
            _C.tracer_stop()
            self._uninstall()
            raise
        return self.result

    def _register_resident(self) -> None:
        groups: list[tuple[str, list[torch.Tensor]]] = []
        if self._model is not None:
            groups.append(("weights", [*self._model.parameters(), *self._model.buffers()]))
        groups += list(self._resident.items())
        # A KV cache's layers are inputs the model replaces with longer ones as it runs: watched
        # (their release is recorded) and not held here, so that they can be released.
        self._resident.pop("kv_cache", None)
        runs: list[list[Any]] = []
        count = 0
        for group, tensors in groups:
            role = "inputs" if group == "kv_cache" else group
            for t in tensors:
                if not isinstance(t, torch.Tensor) or t.device.type != "meta":
                    continue
                sid = _C.tracer_register_external(t, watch=group == "kv_cache")
                if sid == -(count + 1):  # a new resident storage (tied weights share one)
                    count += 1
                    if runs and runs[-1][0] == role:
                        runs[-1][1] += 1
                    else:
                        runs.append([role, 1])
        # Run-length roles of resident ids -1, -2, ...: [[role, count], ...]
        self.result.meta["resident_roles"] = runs

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: object) -> bool:
        failure = _C.tracer_last_failure()
        try:
            raw = _C.tracer_stop()
        finally:
            self._uninstall()
        self.result._set_native(raw)
        if ev is not None and isinstance(ev, Exception) and not isinstance(ev, BlinkError):
            raise _translate(ev, failure, self._stack) from ev
        return False

    # -- hooks -------------------------------------------------------------------------------
    def _install(self) -> None:
        from torch.nn.modules import module as nn_module

        names: dict[int, str] = {}
        if self._model is not None:
            names = {id(m): n for n, m in self._model.named_modules()}
        stack = self._stack

        def pre(mod: torch.nn.Module, args: object) -> None:
            path = names.get(id(mod))
            if path is None:
                cls = type(mod).__name__
                path = f"{stack[-1]}.{cls}" if stack and stack[-1] else cls
            stack.append(path)
            _C.tracer_push_module(path)

        def post(mod: torch.nn.Module, args: object, out: object) -> None:
            if stack:
                stack.pop()
            _C.tracer_pop_module()

        h1 = nn_module.register_module_forward_pre_hook(pre)
        self._undo.append(h1.remove)
        h2 = nn_module.register_module_forward_hook(post, always_call=True)
        self._undo.append(h2.remove)

        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        h3 = register_optimizer_step_pre_hook(lambda *a, **k: _C.tracer_set_phase(2))
        self._undo.append(h3.remove)
        h4 = register_optimizer_step_post_hook(lambda *a, **k: _C.tracer_set_phase(0))
        self._undo.append(h4.remove)

        self._install_sdpa()
        # cuDNN RNN, fused dropout, cuDNN batch norm, autocast, the MHA fast path
        cc = tuple(self._gpu.compute_capability)
        cuda_paths.install(self._undo, (cc[0], cc[1]))

        if self._nonzero == "assume_all":
            import torch.fx.experimental._config as fx_config

            old = fx_config.meta_nonzero_assume_all_nonzero
            fx_config.meta_nonzero_assume_all_nonzero = True
            self._undo.append(lambda: setattr(fx_config, "meta_nonzero_assume_all_nonzero", old))

    def _install_sdpa(self) -> None:
        lib = _sdpa_library(tuple(self._gpu.compute_capability), self._sdpa)
        self._undo.append(lib._destroy)
        conv = _conv_layout_library()
        self._undo.append(conv._destroy)

    def _uninstall(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # noqa: BLE001 - restoring the rest matters more
                pass


def _sdpa_library(cc: tuple[int, ...], forced: str) -> torch.library.Library:
    """Reroute aten::scaled_dot_product_attention on meta tensors to the fused kernel CUDA
    would pick on a GPU of compute capability `cc` (or to `forced`)."""
    from . import sdpa as _sdpa

    def fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> torch.Tensor:
        if query.device.type != "meta":
            return torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
                enable_gqa=enable_gqa)[0]
        if forced == "auto":
            # All of at::native::scaled_dot_product_attention: the attn_mask's shape, strides
            # and requires_grad (cuDNN takes no mask that needs a gradient), unbatched and
            # empty inputs, as select_sdp_backend sees them.
            return _sdpa.target_scaled_dot_product_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                compute_capability=(cc[0], cc[1]))
        return _sdpa.call_fused_sdpa(forced, query, key, value, attn_mask, dropout_p,
                                     is_causal, scale, enable_gqa)

    lib = cuda_paths.override_library()
    # CompositeImplicitAutograd so it also applies under inference_mode (no autograd key).
    lib.impl("scaled_dot_product_attention", fused, "CompositeImplicitAutograd")
    return lib


def _conv_layout_library() -> torch.library.Library:
    """Give meta convolutions the output memory format CUDA gives them.

    On CUDA, _convolution's cuDNN backends allocate the output in
    cudnn_conv_suggest_memory_format(input, weight) (aten/src/ATen/native/ConvUtils.h):
    channels-last when the input's or the weight's suggest_memory_format() is, for 4-D and 5-D
    convolutions. That reads the stride order, not contiguity (c10's
    is_channels_last_strides_2d): a channel slice of a channels-last tensor (FocalNet's
    torch.split of its 1x1 projection, CSP splits in a channels-last network) or a permuted
    NHWC view counts as channels-last, and Convolution.cpp then runs cuDNN on it, depthwise
    included (use_cudnn_depthwise). The meta kernel (torch/_meta_registrations.py meta_conv)
    leaves the output contiguous, so a channels-last network would be traced as NCHW after its
    first convolution (its backward already follows the format). Registered for meta tensors
    during a trace only.
    """
    from torch._meta_registrations import meta_conv
    from torch._prims_common import suggest_memory_format

    def conv(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
             output_padding: list[int], groups: int) -> torch.Tensor:
        out = meta_conv(input, weight, bias, stride, padding, dilation, transposed,
                        output_padding, groups)
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(input.dim())
        def channels_last(t: torch.Tensor) -> bool:
            return suggest_memory_format(t) == fmt

        if fmt is not None and out.numel() > 0 and (channels_last(input)
                                                    or channels_last(weight)):
            out = torch.empty(out.shape, dtype=out.dtype, device=out.device, memory_format=fmt)
        return out

    lib = cuda_paths.override_library()
    lib.impl("convolution", conv, "Meta")
    return lib


class cuda_sdpa:  # noqa: N801 - a context manager, like torch.no_grad
    """Outside a trace: make meta-tensor SDPA run the kernel CUDA would pick on `gpu`."""

    def __init__(self, gpu: str = "H200", backend: str = "auto") -> None:
        from .hardware import get_gpu

        self._cc = tuple(get_gpu(gpu).compute_capability)
        self._backend = backend
        self._lib: torch.library.Library | None = None

    def __enter__(self) -> cuda_sdpa:
        self._lib = _sdpa_library(self._cc, self._backend)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None


def needs_values(text: str) -> bool:
    """Whether torch's error text says an op on the meta device needed tensor values (.item(),
    a data-dependent output shape)."""
    return ("cannot be called on meta tensors" in text or "nonzero" in text
            or "Cannot copy out of meta tensor" in text
            or "meta tensor without output_size" in text)


def _translate(exc: Exception, failure: tuple[str, str | None] | None,
               stack: list[str]) -> TraceError:
    """Turn a dry-run failure into an error that names the op and the module path."""
    op = failure[0] if failure else None
    module = failure[1] if failure and failure[1] is not None else None
    if module is None and stack:
        module = stack[-1]
    text = str(exc).split("\n")[0]
    where = f" in module '{module}'" if module else ""
    if module == "":
        where = " in the model's own forward"
    if op in _DATA_DEPENDENT_OPS or needs_values(text):
        op = op or "aten::_local_scalar_dense"
        return DataDependentError(
            f"{op}{where} needs tensor values, which a dry run on the meta device does not have "
            f"({text[:200]}). Data-dependent shapes (nonzero, boolean-mask indexing) can be "
            "traced with nonzero='assume_all' (CLI: --nonzero assume_all; every element "
            "counted as non-zero: an upper bound); .item()/.tolist()/if-on-a-tensor must be "
            "removed from the traced code or replaced by a value known ahead (e.g. a Python "
            "int). Blink answers .item() and sizes such shapes only from tensors whose values "
            "it follows: constants (ones/zeros/full, its own token ids) and tensors copied "
            "from host memory (a numpy mask, cpu_tensor.to(device)); blink/known_values.py.",
            op=op, module=module)
    if "NVIDIA driver" in text or "not compiled with CUDA" in text or "CUDA driver" in text:
        return TraceError(
            f"the traced code{where} called the CUDA runtime ({text[:160]}), which a dry run "
            "cannot do. Tensors made with device='cuda', .cuda() and .to('cuda') are traced on "
            "the meta device already; remove or guard the remaining torch.cuda.* calls "
            "(synchronize, streams, events, memory queries) while tracing, and create models on "
            "the meta device (`with torch.device('meta'): ...`).", op=op, module=module)
    if "no fake impl or Meta kernel" in text or "Meta' backend" in text:
        return MissingMetaKernelError(
            f"{op or 'an op'}{where} has no meta kernel, so it cannot run in a dry run. Register "
            "one with torch.library.register_fake (it only computes output shapes) and trace "
            f"again. ({text[:200]})", op=op, module=module)
    return TraceError(f"the dry run failed at {op or 'an op'}{where}: "
                      f"{type(exc).__name__}: {text[:300]}", op=op, module=module)
