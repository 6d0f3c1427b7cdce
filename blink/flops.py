"""Multiply-add FLOPs of the GEMM, convolution and attention work in a trace.

2 FLOPs per multiply-accumulate, from the same C++ feature rules blink.predict uses (one rule
table in csrc/core/features.cpp): summed over the cost units of those kinds. The units are the
outermost ops with a CUDA kernel, so meta's addmm -> mm decomposition is not counted twice.
"""
from __future__ import annotations

from .cost import trace_features
from .trace import Trace

MATMUL_KINDS = ("gemm", "conv", "attention")


def trace_flops(t: Trace, gpu: str = "H200") -> int:
    """GEMM + convolution + attention FLOPs of the trace (the GPU only picks the math mode)."""
    return int(sum(r["flops"] for r in trace_features(t, gpu) if r["kind"] in MATMUL_KINDS))
