"""torch.compile cost queries: a Dynamo backend, an FX-graph estimator, an Inductor per-node
estimator and the compiled-mode prediction.

    import blink.compile                                # registers the "blink" backend
    cm = torch.compile(model, backend="blink")          # records each graph's predicted cost,
    cm(x)                                               # then runs the graph unchanged
    print(blink.compile_report())

    p = blink.estimate_graph(gm, example_inputs, gpu="H100-SXM")   # an fx.GraphModule

    torch._inductor.config.estimate_op_runtime = blink.compile.inductor_estimator("H100-SXM")

    blink.predict(model, ..., compiled=True)            # blink predict --compiled

Graphs are costed by running them on meta tensors under blink.trace, so they get the same
cut, features, timeline and allocator replay as blink.predict. The compiled-mode prediction is a
first model of Inductor's output: chains of pointwise / reduction units joined by dataflow
become one memory-bound kernel each (csrc/core/cost_model.cpp, compile_trace).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import BlinkError, ConfigError

# -- compiled mode: Inductor's fused kernels from an eager trace --------------------------------


def _short(op: str) -> str:
    return op.removeprefix("aten::").split(".")[0]


def compiled_units(native: Any, gspec: Any, eager_units: list[Any], allow_tf32_matmul: bool,
                   allow_tf32_cudnn: bool) -> tuple[list[Any], list[dict[str, Any]],
                                                    dict[str, Any]]:
    """The kernels of the compiled graph as units (a fused kernel is one unit named after the
    ops it fuses), their timeline, and the totals (with the storages fused kernels keep in
    registers, which the memory replay then skips). `eager_units` are predict's UnitRows, in the
    C++ unit order."""
    from .predict import UnitRow

    raw = native.compiled(gspec, allow_tf32_matmul, allow_tf32_cudnn)
    units: list[UnitRow] = []
    timeline: list[dict[str, Any]] = []
    for (members, fused, flops, nbytes, time_s, _host_s, hs, he, gs, ge) in raw["kernels"]:
        first = eager_units[members[0]]
        if fused:
            names: list[str] = []
            for i in members:
                n = _short(eager_units[i].op)
                if not names or names[-1] != n:
                    names.append(n)
            label = f"fused[{len(members)}]: " + "+".join(names)
            row = UnitRow(first.op_id, label, first.module, first.phase, "fused", time_s * 1e3,
                          time_s * 1e3, flops, nbytes, 1, first.math_mode, "analytic",
                          fallback="no_forest")
        else:
            row = first
        units.append(row)
        timeline.append({"op": row.op, "op_id": row.op_id, "module": row.module,
                         "phase": row.phase, "host_start_s": hs, "host_end_s": he,
                         "gpu_start_s": gs, "gpu_end_s": ge})
    totals = {"end_to_end_s": raw["compiled_end_to_end_s"], "host_s": raw["compiled_host_s"],
              "gpu_busy_s": raw["compiled_gpu_busy_s"],
              "internal_storages": list(raw["internal_storages"])}
    return units, timeline, totals


# -- an FX graph ---------------------------------------------------------------------------------


def _hint(v: object) -> object:
    """A concrete value for a SymInt / SymFloat (its hint), else v."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node = v.node
        hint = getattr(node, "hint", None)
        if hint is None:
            raise ConfigError(f"the graph has a symbolic size {v} with no example value; give "
                              "example inputs with concrete shapes")
        return hint
    return v


def _meta_input(x: object, i: int) -> object:
    if isinstance(x, torch.Tensor):
        shape = [int(_hint(s)) for s in x.shape]  # type: ignore[call-overload]
        stride = [int(_hint(s)) for s in x.stride()]  # type: ignore[call-overload]
        t = torch.empty_strided(shape, stride, dtype=x.dtype, device="meta")
        if isinstance(x, torch.nn.Parameter):
            return torch.nn.Parameter(t, requires_grad=x.requires_grad)
        return t
    if isinstance(x, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)) or x is None:
        return _hint(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_input(v, i) for v in x)
    raise ConfigError(f"example_inputs[{i}] is a {type(x).__name__}; give tensors, ints or floats")


def _to_meta_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` with meta parameters and buffers and every device= argument on meta
    (graphs capture the device of the run they were made from)."""
    from .dryrun import _meta_copy

    net = _meta_copy(gm)
    if not isinstance(net, torch.fx.GraphModule):
        raise ConfigError(f"expected a torch.fx.GraphModule, got {type(gm).__name__}")
    changed = False
    for node in net.graph.nodes:
        if "device" in node.kwargs:
            node.kwargs = {**node.kwargs, "device": torch.device("meta")}
            changed = True
    if changed:
        net.recompile()
    return net


def estimate_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[object], *,
                   gpu: str = "H200", name: str | None = None) -> Any:
    """Predict one inference run of an FX GraphModule (a Dynamo graph, symbolic_trace's
    output, your own pass's graph) on `gpu`. example_inputs may be real, fake or meta tensors:
    only shapes, strides and dtypes are read, and the graph runs on meta copies. Returns a
    blink.Prediction."""
    from .hardware import get_gpu
    from .predict import predict_trace
    from .trace import trace

    if not isinstance(gm, torch.fx.GraphModule):
        raise ConfigError(f"estimate_graph needs a torch.fx.GraphModule, not {type(gm).__name__}"
                          "; for an nn.Module use blink.predict")
    if not isinstance(example_inputs, (list, tuple)):
        raise ConfigError("example_inputs must be a list or tuple (the graph's positional inputs)")
    spec = get_gpu(gpu)
    args = [_meta_input(x, i) for i, x in enumerate(example_inputs)]
    net = _to_meta_graph(gm)
    params = sum(q.numel() for q in net.parameters())
    weights = [a for a in args if isinstance(a, torch.nn.Parameter)]
    params += sum(w.numel() for w in weights)
    tensors = [a for a in args if isinstance(a, torch.Tensor) and not isinstance(
        a, torch.nn.Parameter)]
    first = next((a for a in tensors if a.dim() > 0), None)
    meta = {"model": name or f"graph ({sum(1 for _ in gm.graph.nodes)} nodes)",
            "family": "fx", "mode": "inference",
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else "?",
            "batch_size": int(first.shape[0]) if first is not None else None,
            "seq_len": None, "params": int(params)}
    dtype_name = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    meta["dtype"] = dtype_name.get(meta["dtype"], meta["dtype"])
    with torch.no_grad():
        with trace(net, gpu=spec.name, meta=meta,
                   resident={"weights": weights, "inputs": tensors}) as t:
            net(*args)
    # Host time from the table: a graph's ops are issued by a compiled runner, not by the
    # Python that happened to run during this one cold pass.
    return predict_trace(t, spec.name, host_time="table")


# -- the Dynamo backend -------------------------------------------------------------------------


@dataclass
class GraphCost:
    """One graph Dynamo handed the backend, and its predicted cost (None when it failed)."""

    index: int
    nodes: int
    ops: int  # call_function / call_method / call_module nodes
    gpu: str
    prediction: Any = None
    error: str = ""

    @property
    def time_ms(self) -> float:
        return self.prediction.time_ms if self.prediction is not None else 0.0

    @property
    def peak_reserved_bytes(self) -> int:
        return self.prediction.peak_reserved_bytes if self.prediction is not None else 0


@dataclass
class CompileReport:
    graphs: list[GraphCost] = field(default_factory=list)

    @property
    def time_ms(self) -> float:
        """Sum over the graphs (each graph's run, as captured; eager code between graph breaks
        is not included)."""
        return sum(g.time_ms for g in self.graphs)

    def __len__(self) -> int:
        return len(self.graphs)

    def __str__(self) -> str:
        from .trace import _fmt_bytes

        lines = [f"blink compile report: {len(self.graphs)} graph(s), "
                 f"{self.time_ms:.3f} ms predicted in total",
                 f"  {'graph':>5} {'nodes':>6} {'ops':>5} {'gpu':<10} {'ms':>10} "
                 f"{'peak reserved':>14}"]
        for g in self.graphs:
            if g.prediction is None:
                lines.append(f"  {g.index:>5} {g.nodes:>6} {g.ops:>5} {g.gpu:<10} "
                             f"  not costed: {g.error}")
            else:
                lines.append(f"  {g.index:>5} {g.nodes:>6} {g.ops:>5} {g.gpu:<10} "
                             f"{g.time_ms:>10.3f} {_fmt_bytes(g.peak_reserved_bytes):>14}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<blink.CompileReport {len(self.graphs)} graphs, {self.time_ms:.3f} ms>"


_report = CompileReport()
_lock = threading.Lock()


def compile_report(clear: bool = False) -> CompileReport:
    """The graphs the "blink" backend has seen in this process (clear=True empties it after)."""
    global _report
    with _lock:
        out = _report
        if clear:
            _report = CompileReport()
    return out


def compile_backend(gpu: str = "H200") -> Callable[..., Callable[..., Any]]:
    """A Dynamo backend that costs each captured graph on `gpu` (recorded in compile_report())
    and then runs it unchanged: torch.compile(model, backend=blink.compile_backend("A100"))."""
    from .hardware import get_gpu

    name = get_gpu(gpu).name

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                **_options: Any) -> Callable[..., Any]:
        nodes = list(gm.graph.nodes)
        ops = sum(1 for n in nodes if n.op in ("call_function", "call_method", "call_module"))
        with _lock:
            index = len(_report.graphs)
        entry = GraphCost(index, len(nodes), ops, name)
        try:
            entry.prediction = estimate_graph(gm, example_inputs, gpu=name,
                                              name=f"graph {index}")
        except BlinkError as exc:  # a graph Blink cannot cost still runs
            entry.error = str(exc)
        with _lock:
            _report.graphs.append(entry)
        return gm.forward

    return backend


def blink_backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                  **options: Any) -> Callable[..., Any]:
    """The registered "blink" backend (target GPU from options={"gpu": ...}, default H200)."""
    gpu = options.pop("gpu", "H200")
    return compile_backend(gpu)(gm, example_inputs, **options)


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    # Also reached from the "torch_dynamo_backends" entry point (setup.py), which torch then
    # registers itself: only register when neither has.
    if "blink" not in _BACKENDS and "blink" not in _COMPILER_FNS:
        register_backend(name="blink")(blink_backend)


_register()


# -- an estimator for Inductor's scheduler ------------------------------------------------------


def _size_hint(v: object) -> int:
    from torch._inductor.virtualized import V

    try:
        return int(V.graph.sizevars.size_hint(v, fallback=1))
    except Exception:  # noqa: BLE001 - outside a graph, or a plain int
        return int(v)  # type: ignore[call-overload]


def _ir_tensor_arg(node: Any) -> tuple[int, tuple] | None:
    from ._ext import load
    from .cost import tensor_arg

    try:
        size = [_size_hint(s) for s in node.get_size()]
        stride = [_size_hint(s) for s in node.get_stride()]
        dtype = node.get_dtype()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    code = load().scalar_type_of(torch.empty(0, dtype=dtype, device="meta"))
    return tensor_arg(tuple(size), code, tuple(stride))


_EXTERN_OPS = {"mm": "aten::mm", "addmm": "aten::addmm", "bmm": "aten::bmm",
               "baddbmm": "aten::baddbmm"}


class InductorEstimator:
    """A callable for torch._inductor.config.estimate_op_runtime: Inductor calls it with a
    scheduler node (torch/_inductor/comms.py, estimate_op_runtime) and reads milliseconds.
    GEMM extern kernels get Blink's GEMM rule; generated (Triton) kernels, fused or not, the
    fused memory-bound kernel rule over the bytes Inductor says the node reads and writes
    (BaseSchedulerNode.get_read_write_buffers_sizes). A plain object, so Inductor can pickle
    its config into the FX-graph cache key."""

    def __init__(self, gpu: str = "H200") -> None:
        from .hardware import get_gpu

        self.gpu = get_gpu(gpu).name

    def __call__(self, snode: Any) -> float:
        from torch._inductor import scheduler

        from ._ext import load
        from .cost import core_gpu_spec, unit_features

        if isinstance(snode, scheduler.NopKernelSchedulerNode):
            return 0.0
        node = getattr(snode, "node", None)
        if isinstance(snode, scheduler.ExternKernelSchedulerNode) and node is not None:
            kernel = str(getattr(node, "python_kernel_name", "") or "").rsplit(".", 1)[-1]
            op = _EXTERN_OPS.get(kernel)
            if op is not None:
                ins = [_ir_tensor_arg(x) for x in getattr(node, "inputs", [])]
                out = _ir_tensor_arg(node)
                if out is not None and all(a is not None for a in ins):
                    try:
                        f = unit_features(op, ins, [out], self.gpu)
                        return float(f["analytic_time_s"]) * 1e3
                    except BlinkError:
                        pass
        try:
            nbytes = float(snode.get_read_write_buffers_sizes())
        except Exception:  # noqa: BLE001 - an unusual node: count nothing moved
            nbytes = 0.0
        spec = core_gpu_spec(self.gpu)
        return float(load().fused_kernel_time_s(max(nbytes, 0.0), 0.0, spec)) * 1e3

    def __repr__(self) -> str:
        return f"blink.compile.InductorEstimator({self.gpu!r})"


def inductor_estimator(gpu: str = "H200") -> InductorEstimator:
    """Blink's per-node estimator for Inductor on `gpu` (see InductorEstimator):
    torch._inductor.config.estimate_op_runtime = blink.compile.inductor_estimator("H100-SXM")."""
    return InductorEstimator(gpu)
