"""Per-unit cost from the C++ core: features, analytic time and host dispatch time."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from ._ext import load
from .hardware import GPUSpec, get_gpu

_C = load()


@lru_cache(maxsize=64)
def _core_spec_cached(name: str) -> Any:
    return core_gpu_spec(get_gpu(name))


def core_gpu_fields(gpu: GPUSpec | str) -> dict[str, Any]:
    """The fields of the blink._C.GpuSpec for a hardware-table entry (its constructor's kwargs;
    blink.train reads the GPU features of its rows from here)."""
    if isinstance(gpu, str):
        gpu = get_gpu(gpu)
    pf = gpu.peak_flops
    return dict(
        name=gpu.name, sm_count=gpu.sm_count, clock_hz=gpu.boost_clock_mhz * 1e6,
        mem_bw=gpu.memory_bandwidth_bytes_per_s, l2_bytes=float(gpu.l2_bytes),
        peak_fp32=pf["fp32"], peak_tf32=pf.get("tf32") or 0.0,
        peak_bf16=pf.get("bf16") or 0.0, peak_fp16=pf.get("fp16") or 0.0,
        peak_fp8=pf.get("fp8") or 0.0, cc_major=gpu.compute_capability[0],
        cc_minor=gpu.compute_capability[1],
    )


def core_gpu_spec(gpu: GPUSpec | str) -> Any:
    """The blink._C.GpuSpec for a hardware-table entry (or its name)."""
    if isinstance(gpu, str):
        return _core_spec_cached(gpu)
    return _C.GpuSpec(**core_gpu_fields(gpu))


def tensor_arg(shape: tuple[int, ...], dtype_code: int, stride: tuple[int, ...] | None = None,
               storage: int = 0) -> tuple[int, tuple]:
    """A contiguous (or strided) tensor argument in the trace's raw format, for features_for."""
    if stride is None:
        acc, out = 1, []
        for s in reversed(shape):
            out.append(acc)
            acc *= max(s, 1)
        stride = tuple(reversed(out))
    return (1, (tuple(shape), tuple(stride), 0, storage, 0, dtype_code, 14, False))


def unit_features(op_name: str, inputs: list, outputs: list, gpu: GPUSpec | str, *,
                  allow_tf32_matmul: bool = False, allow_tf32_cudnn: bool = True) -> dict:
    """Features, `analytic_time_s` and `host_dispatch_time_s` of one op (raw-format args)."""
    return _C.features_for(op_name, inputs, outputs, core_gpu_spec(gpu),
                           allow_tf32_matmul, allow_tf32_cudnn)


def trace_features(t: Any, gpu: GPUSpec | str, *, allow_tf32_matmul: bool = False,
                   allow_tf32_cudnn: bool = True) -> list[dict]:
    """The feature row of every cost unit of a trace (the rows training reads), in unit order,
    each with its op id and name; computed by the same C++ code blink.predict uses."""
    spec = core_gpu_spec(gpu)
    raw = t._raw
    names = raw["names"]
    rows = []
    for op_id in t.native().units():
        r = raw["ops"][op_id]
        name = names[r[2]] + (f".{names[r[3]]}" if names[r[3]] else "")
        feats = _C.features_for(name, r[10], r[11], spec, allow_tf32_matmul, allow_tf32_cudnn)
        feats["op_id"] = op_id
        feats["op"] = name
        rows.append(feats)
    return rows
