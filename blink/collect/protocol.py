"""The collection protocol for one configuration.

1. Dry run on meta (no device): the same step, cut into cost units, with the predictor's
   features for each unit (blink.cost.unit_features) computed for the target GPU. A training
   step is dry-run in steady state: one untraced step first creates the optimizer state.
2. Build the model on the device (random init, fixed seed) with random inputs of the same shapes.
3. Warm up, then time samples of the call (CUDA events on a GPU, perf_counter on the CPU):
   median, quartiles, min, max, standard deviation.
4. GPU: empty the allocator cache, reset the peak counters, run one call: resident, peak
   allocated and peak reserved bytes (optionally the allocator's event history).
5. Trace one more call (ops: several) — CUPTI on a GPU, torch.profiler's CPU ops on the CPU —
   for per-unit device time, host time and launch times; align the measured units with the
   dry-run units (blink.collect.match) and emit one row per unit.
"""
from __future__ import annotations

import gc
import json
import os
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .. import cuda_paths
from ..dryrun import (
    DTYPES,
    Prepared,
    asks_for_values,
    cache_keyword,
    enable_grad_checkpointing,
    execute,
    fill_kv_cache,
    fixed_host_rng,
    kv_cache_resident,
    make_optimizer,
    prepare,
)
from ..errors import BlinkError
from ..trace import PHASES, Trace, trace
from . import models as builtin
from .cupti import UNIT_BY_RULE, OpTiming, TraceSummary
from .env import math_flags
from .match import Key, align, shapes_key_raw
from .measure import cpu_trace, cuda_kernel_ops, gpu_trace, measure_memory, per_unit, time_calls
from .ops import OP_DTYPES, build_op
from .presets import ModelRun, OpRun, Protocol, RunConfig

# Math settings of model runs: PyTorch's defaults (TF32 off for matmul, on for cuDNN).
MODEL_TF32 = (False, True)


@dataclass
class DryUnit:
    op_id: int
    name: str
    overload: str
    phase: str
    module: str | None
    shapes: str
    dtypes: str
    features: dict[str, Any] | None
    error: str


def _full_name(name: str, overload: str) -> str:
    return f"{name}.{overload}" if overload else name


def dry_units(t: Trace, gpu: str, tf32_matmul: bool, tf32_cudnn: bool) -> list[DryUnit]:
    """The trace's cost units, in call order, with the predictor's features for `gpu`."""
    from ..cost import unit_features

    raw = t.to_dict()
    names, modules, ops = raw["names"], raw["modules"], raw["ops"]
    out = []
    for uid in t.native().units():
        r = ops[uid]
        name, overload = names[r[2]], names[r[3]]
        dtypes = ",".join(str(a[1][5]) for a in r[10] if a[0] == 1)
        features, error = None, ""
        try:
            features = unit_features(_full_name(name, overload), r[10], r[11], gpu,
                                     allow_tf32_matmul=tf32_matmul, allow_tf32_cudnn=tf32_cudnn)
        except BlinkError as exc:
            error = str(exc)[:300]
        out.append(DryUnit(uid, name, overload, PHASES[r[6]], modules[r[4]] if r[4] >= 0 else None,
                           shapes_key_raw(r[10]), dtypes, features, error))
    return out


def feature_columns(gpu: str = "H200") -> list[str]:
    """The numeric feature names the predictor computes, in its order (kind and math_mode are
    columns of their own)."""
    from ..cost import tensor_arg, unit_features

    f = unit_features("aten::mm", [tensor_arg((8, 8), 6), tensor_arg((8, 8), 6)],
                      [tensor_arg((8, 8), 6)], gpu)
    return [k for k in f if k not in ("kind", "math_mode")]


# -- workloads --------------------------------------------------------------------------------

class Workload:
    """A configuration made runnable: its dry run, and the real call on a device."""

    tf32: tuple[bool, bool] = MODEL_TF32
    trace_reps = 1

    def dry_run(self, gpu: str) -> Trace:
        raise NotImplementedError

    def materialize(self, device: torch.device, seed: int) -> Callable[..., None]:
        raise NotImplementedError

    def release(self) -> None:
        pass

    def row_fields(self) -> dict[str, Any]:
        raise NotImplementedError


def _random_like(t: torch.Tensor, device: torch.device, gen: torch.Generator,
                 high: int) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return torch.randn(t.shape, dtype=t.dtype, device=device, generator=gen)
    if t.dtype == torch.bool:
        return torch.ones(t.shape, dtype=t.dtype, device=device)
    return torch.randint(0, max(high, 1), t.shape, dtype=t.dtype, device=device, generator=gen)


class ModelWorkload(Workload):
    def __init__(self, cfg: ModelRun, protocol: Protocol) -> None:
        self.cfg = cfg
        self.trace_reps = protocol.model_trace_reps
        self.meta = self._prepare_meta()
        self._real: Prepared | None = None
        self._opt: Any = None

    def _prepare_meta(self) -> Prepared:
        c = self.cfg
        if builtin.is_builtin(c.model):
            b = builtin.get_builtin(c.model)
            dt = DTYPES[c.dtype][0]
            with torch.device("meta"):
                net = b.builder()
            specs = builtin.input_specs(c.model, c.batch_size, c.seq_len, dt,
                                        with_labels=c.mode == "train")
            inputs = {k: torch.empty(s, dtype=d, device="meta") for k, (s, d, _) in specs.items()}
            p = prepare(net, inputs, dtype=c.dtype, mode=c.mode, optimizer=c.optimizer,
                        grad_checkpointing=c.grad_checkpointing)
            p.meta.update({"model": c.model, "family": b.family, "batch_size": c.batch_size,
                           "seq_len": c.seq_len})
            return p
        return prepare(c.model, batch_size=c.batch_size, seq_len=c.seq_len, dtype=c.dtype,
                       mode=c.mode, optimizer=c.optimizer,
                       grad_checkpointing=c.grad_checkpointing, kv_cache=c.kv_cache)

    def dry_run(self, gpu: str) -> Trace:
        try:
            return self._dry_run(gpu)
        except RuntimeError as exc:  # (blink's DataDependentError too)
            if not asks_for_values(exc):
                raise
        # As blink.trace_model: retry following known values (blink.known_values) to answer
        # the model's .item() calls on tensors made from constants.
        self.meta = self._prepare_meta()
        self.meta.known_values = True
        return self._dry_run(gpu)

    def _dry_run(self, gpu: str) -> Trace:
        p = self.meta
        opt = make_optimizer(p)
        if opt is not None:
            execute(p, optimizer=opt)  # steady state: the optimizer state exists
        # the host's random draws from blink's fixed seed, as in blink.trace_model
        with fixed_host_rng(), trace(p.net, gpu=gpu, meta=p.meta,
                                     resident=kv_cache_resident(p)) as t:
            execute(p, optimizer=opt)
        return t

    def _int_high(self, key: str) -> int:
        c = self.cfg
        if builtin.is_builtin(c.model):
            specs = builtin.input_specs(c.model, 1, c.seq_len, torch.float32, with_labels=True)
            return specs.get(key, ((), None, 2))[2]
        from .. import zoo

        e = zoo.get_entry(c.model)
        if key == "labels" and e.kind == zoo.VISION:
            return e.num_classes
        return e.vocab_size or e.num_classes

    def materialize(self, device: torch.device, seed: int) -> Callable[..., None]:
        c = self.cfg
        torch.manual_seed(seed)
        if builtin.is_builtin(c.model):
            builder = builtin.get_builtin(c.model).builder
        else:
            from .. import zoo

            builder = zoo.get_entry(c.model).builder
        with torch.device(device):
            net = builder()
        param_dtype = DTYPES[c.dtype][0]
        if param_dtype != torch.float32:
            net = net.to(param_dtype)
        if c.grad_checkpointing:
            enable_grad_checkpointing(net, c.model)
        net.train(c.mode == "train")
        if c.mode == "inference":
            for q in net.parameters():
                q.requires_grad_(False)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        m = self.meta
        kwargs = {k: _random_like(v, device, gen, self._int_high(k)) if isinstance(
            v, torch.Tensor) else v for k, v in m.kwargs.items()}
        args = tuple(_random_like(a, device, gen, 2) if isinstance(a, torch.Tensor) else a
                     for a in m.args)
        labels = None if m.labels is None else _random_like(m.labels, device, gen,
                                                            self._int_high("labels"))
        key = cache_keyword(m)
        if key is not None:
            # a real prompt of kv_cache random tokens fills the model's own cache on the device
            ids = kwargs["input_ids"]
            prompt = torch.randint(0, max(self._int_high("input_ids"), 1),
                                   (ids.shape[0], int(c.kv_cache or 0)), device=device,
                                   generator=gen)
            kwargs[key] = fill_kv_cache(net, prompt, c.model)
        self._real = Prepared(net, args, kwargs, labels, m.meta, m.amp_dtype)
        self._opt = make_optimizer(self._real)
        real, opt = self._real, self._opt

        def call(on_phase: Callable[[int], None] | None = None) -> None:
            execute(real, optimizer=opt, on_phase=on_phase)
            if key is not None:
                # every step starts from kv_cache tokens (crop(-n) drops the last n, in
                # transformers 4.x and 5.x alike)
                cache = real.kwargs[key]
                grown = int(cache.get_seq_length()) - int(c.kv_cache or 0)
                if grown > 0:
                    cache.crop(-grown)

        return call

    def release(self) -> None:
        self._real = None
        self._opt = None

    def row_fields(self) -> dict[str, Any]:
        c = self.cfg
        return {"model": c.model, "family": self.meta.meta.get("family"),
                "batch_size": c.batch_size, "seq_len": c.seq_len, "dtype": c.dtype,
                "mode": c.mode, "optimizer": c.optimizer if c.mode == "train" else None,
                "grad_checkpointing": c.grad_checkpointing, "kv_cache": c.kv_cache}


class OpWorkload(Workload):
    def __init__(self, cfg: OpRun, protocol: Protocol) -> None:
        self.cfg = cfg
        self.tf32 = OP_DTYPES[cfg.dtype][1:]
        self.trace_reps = protocol.op_trace_reps
        self._args: tuple[torch.Tensor, ...] = ()

    def dry_run(self, gpu: str) -> Trace:
        fn, args = build_op(self.cfg.family, self.cfg.param_dict, self.cfg.dtype, "meta")
        with torch.no_grad(), trace(None, gpu=gpu, meta={"op": self.cfg.family}) as t:
            fn(*args)
        return t

    def materialize(self, device: torch.device, seed: int) -> Callable[..., None]:
        fn, args = build_op(self.cfg.family, self.cfg.param_dict, self.cfg.dtype, device, seed)
        self._args = args

        def call(on_phase: Callable[[int], None] | None = None) -> None:
            with torch.no_grad():
                fn(*args)

        return call

    def release(self) -> None:
        self._args = ()

    def row_fields(self) -> dict[str, Any]:
        c = self.cfg
        return {"op": c.family, "params": json.dumps(c.param_dict, sort_keys=True),
                "dtype": c.dtype}


def make_workload(cfg: RunConfig, protocol: Protocol) -> Workload:
    if isinstance(cfg, ModelRun):
        return ModelWorkload(cfg, protocol)
    return OpWorkload(cfg, protocol)


# -- one configuration ------------------------------------------------------------------------

@dataclass
class RunResult:
    run: dict[str, Any]
    units: list[dict[str, Any]]
    history: dict[str, Any] | None


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return text[:400]


def run_config(cfg: RunConfig, *, run_id: str, device: torch.device, feature_gpu: str,
               protocol: Protocol, seed: int, env_row: dict[str, Any]) -> RunResult:
    """Measure one configuration; failures become a row with status oom / error."""
    t0 = time.perf_counter()
    run: dict[str, Any] = {"run_id": run_id, "kind": cfg.kind, "status": "ok",
                           "device": device.type, "seed": seed, "feature_gpu": feature_gpu,
                           **env_row}
    units: list[dict[str, Any]] = []
    history = None
    wl: Workload | None = None
    call: Callable[..., None] | None = None
    try:
        wl = make_workload(cfg, protocol)
        run.update(wl.row_fields())
        run["tf32_matmul"], run["tf32_cudnn"] = wl.tf32
        # Off CUDA the real run takes the meta-like paths (native batch norm, dropout, RNN
        # cells), so the dry run must not be steered onto CUDA's (blink.cuda_paths).
        with nullcontext() if device.type == "cuda" else cuda_paths.disabled():
            t = wl.dry_run(feature_gpu)
        run["dry_ops"] = len(t)
        dry = dry_units(t, feature_gpu, *wl.tf32)
        del t
        with math_flags(*wl.tf32):
            call = wl.materialize(device, seed)
            run.update(time_calls(call, device, protocol, op=cfg.kind == "op").stats())
            mem, history = measure_memory(call, device, protocol.memory_history)
            run.update(mem)
            t1 = time.perf_counter()
            if device.type == "cuda":
                summary = gpu_trace(call, wl.trace_reps, UNIT_BY_RULE)
            else:
                names = {u.name for u in dry} | set(UNIT_BY_RULE) | cuda_kernel_ops()
                summary = cpu_trace(call, wl.trace_reps, names)
            run["traced_wall_s"] = (time.perf_counter() - t1) / wl.trace_reps
        units = _unit_rows(run, dry, summary, wl.trace_reps)
    except torch.cuda.OutOfMemoryError as exc:
        run.update(status="oom", error=_error_text(exc))
        units, history = [], None
    except Exception as exc:  # noqa: BLE001 - a failed configuration is data, not a crash
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames \
            else ""
        run.update(status="error", error=_error_text(exc) + where)
        units, history = [], None
    finally:
        call = None  # drop the device tensors before emptying the cache
        if wl is not None:
            wl.release()
        _free(device)
    if history is not None:
        history = {"run_id": run_id, **history}
    run["elapsed_s"] = time.perf_counter() - t0
    run["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if isinstance(run.get("params"), dict):
        run["params"] = json.dumps(run["params"], sort_keys=True)
    return RunResult(run, units, history)


_MEASURED_FIELDS = ("time_s", "host_s", "n_kernels", "kernel_s", "memcpy_n", "memcpy_s",
                    "memcpy_bytes", "memset_n", "memset_s", "launch_n", "launch_s",
                    "launch_delay_s", "span_s", "main_kernel", "main_grid", "main_block",
                    "main_regs", "main_smem_static", "main_smem_dynamic")


def _unit_rows(run: dict[str, Any], dry: list[DryUnit], summary: TraceSummary,
               reps: int) -> list[dict[str, Any]]:
    measured, spread, note = per_unit(summary)
    pairs = align([Key(u.name, u.shapes) for u in dry],
                  [Key(o.name, o.shapes) for o in measured])
    rows: list[dict[str, Any]] = []
    counts = {"exact": 0, "name": 0}
    for pair in pairs:
        row: dict[str, Any] = {"run_id": run["run_id"], "match": pair.match,
                               "env_id": run.get("env_id"), "unit_seq": -1, "measured_seq": -1}
        if pair.match in counts:
            counts[pair.match] += 1
        if pair.dry is not None:
            u = dry[pair.dry]
            row.update(unit_seq=pair.dry, op=u.name, overload=u.overload, phase=u.phase,
                       module=u.module, shapes=u.shapes, dtypes=u.dtypes,
                       feature_error=u.error or None)
            if u.features is not None:
                f = u.features
                row["kind"], row["math_mode"] = f["kind"], f["math_mode"]
                for k, v in f.items():
                    if k not in ("kind", "math_mode"):
                        row[f"f_{k}"] = float(v)
        if pair.measured is not None:
            o: OpTiming = measured[pair.measured]
            row["measured_seq"] = pair.measured
            if pair.dry is None:
                row.update(op=o.name, overload=o.overload, shapes=o.shapes, dtypes=o.dtypes,
                           phase=PHASES[o.phase] if 0 <= o.phase < 3 else None)
            for k in _MEASURED_FIELDS:
                row[k] = getattr(o, k)
            row["rep_spread"] = spread[pair.measured]
        rows.append(row)
    run.update(trace_reps=reps, n_units_dry=len(dry), n_units_measured=len(measured),
               n_units_exact=counts["exact"], n_units_name=counts["name"],
               device_time_s=sum(o.time_s for o in measured) + summary.unattributed_s / reps,
               n_kernels=sum(o.n_kernels for o in measured),
               unattributed_n=round(summary.unattributed_n / reps),
               unattributed_s=summary.unattributed_s / reps,
               unattributed_top=summary.unattributed_top or None,
               dropped_records=summary.dropped)
    if note:
        run["error"] = note
    return rows
