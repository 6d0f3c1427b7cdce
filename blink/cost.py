"""Per-unit cost from the C++ core: features, analytic time and host dispatch time."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from ._ext import load
from .hardware import BOOST_WINDOW_S, GPUSpec, get_gpu

_C = load()


@lru_cache(maxsize=64)
def _core_spec_cached(name: str) -> Any:
    return core_gpu_spec(get_gpu(name))


def core_gpu_fields(gpu: GPUSpec | str, boost_window_s: float = BOOST_WINDOW_S) -> dict[str, Any]:
    """The fields of the blink._C.GpuSpec for a hardware-table entry (its constructor's kwargs;
    blink.train reads the GPU features of its rows from here). boost_window_s: how long an
    isolated burst of dense math holds boost on a power-capped board (blink.hardware)."""
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    pf = gpu.peak_flops
    return dict(
        name=gpu.name, sm_count=gpu.sm_count, clock_hz=gpu.boost_clock_mhz * 1e6,
        mem_bw=gpu.memory_bandwidth_bytes_per_s, l2_bytes=float(gpu.l2_bytes),
        peak_fp32=pf["fp32"], peak_tf32=pf.get("tf32") or 0.0,
        peak_bf16=pf.get("bf16") or 0.0, peak_fp16=pf.get("fp16") or 0.0,
        peak_fp8=pf.get("fp8") or 0.0, cc_major=gpu.compute_capability[0],
        cc_minor=gpu.compute_capability[1], peak_fp64=pf.get("fp64") or 0.0,
        sustained_fp32_ratio=gpu.sustained_fp32_ratio,
        sustained_tc_ratio=gpu.sustained_tc_ratio, boost_window_s=boost_window_s,
        max_clock_ratio=gpu.max_clock_ratio, dram_efficiency=gpu.dram_efficiency,
        simt_gemm_rate=gpu.simt_gemm_rate,
    )


def core_gpu_spec(gpu: GPUSpec | str, boost_window_s: float = BOOST_WINDOW_S) -> Any:
    """The blink._C.GpuSpec for a hardware-table entry (or its name)."""
    if isinstance(gpu, str) and boost_window_s == BOOST_WINDOW_S:
        return _core_spec_cached(gpu)
    return _C.GpuSpec(**core_gpu_fields(gpu, boost_window_s))


# blink::ConvAlgo codes (csrc/include/blink/kernel_plan.h), the "conv_algo" feature's values.
CONV_ALGOS = ("none", "implicit_gemm", "winograd", "depthwise_direct", "grouped_gemm")


def conv_algo_name(features: dict) -> str:
    """The convolution algorithm a unit's features say the cost used."""
    return CONV_ALGOS[int(features["conv_algo"])]


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
                  allow_tf32_matmul: bool = False, allow_tf32_cudnn: bool = True,
                  cudnn_benchmark: bool = False,
                  boost_window_s: float = BOOST_WINDOW_S) -> dict:
    """Features, `analytic_time_s` and `host_dispatch_time_s` of one op (raw-format args), as
    a lone unit (no trace-level context such as L2 residency), timed alone after an idle GPU
    (boost_window_s: blink.hardware.BOOST_WINDOW_S; 0 for the average of a long loop)."""
    return _C.features_for(op_name, inputs, outputs, core_gpu_spec(gpu, boost_window_s),
                           allow_tf32_matmul, allow_tf32_cudnn, cudnn_benchmark)


def trace_features(t: Any, gpu: GPUSpec | str, *, allow_tf32_matmul: bool = False,
                   allow_tf32_cudnn: bool = True, cudnn_benchmark: bool = False) -> list[dict]:
    """The feature row of every cost unit of a trace (the rows training reads), in unit order,
    each with its op id and name; computed by the same C++ pass blink.predict costs with, so
    trace-level features (inputs still in L2) match the unit times predict reports."""
    return t.native().unit_features(core_gpu_spec(gpu), allow_tf32_matmul, allow_tf32_cudnn,
                                    cudnn_benchmark)
