"""Multiply-add FLOPs of the GEMM, convolution and attention ops in a trace.

Counted as 2 FLOPs per multiply-accumulate, from the op's own shapes. Only the outermost
such op in a call subtree counts: on the meta device `addmm` runs `mm` underneath, but on
CUDA it is one kernel.
"""
from __future__ import annotations

from math import prod

from .trace import Op, TensorMeta, Trace


def _shape(v: object) -> tuple[int, ...]:
    if not isinstance(v, TensorMeta):
        raise ValueError("expected a tensor argument")
    return v.shape


def _gemm(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    # (..., M, K) @ (..., K, N): 2 * batch * M * N * K
    batch = prod(a[:-2]) if len(a) > 2 else 1
    return 2 * batch * a[-2] * a[-1] * b[-1]


def _conv(x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...], transposed: bool) -> int:
    # Each output (or, transposed, each input) point takes C_in/groups * prod(kernel) MACs per
    # output channel; the weight's dims 0 and 1 already carry the group split.
    spatial = prod(x[2:]) if transposed else prod(out[2:])
    return 2 * x[0] * spatial * w[0] * w[1] * prod(w[2:])


def _attention(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    # scores = q @ k^T and out = p @ v, per (batch, query head); GQA shares k/v heads.
    batch_heads = prod(q[:-2])
    lq, d, lk, dv = q[-2], q[-1], k[-2], v[-1]
    return 2 * batch_heads * lq * lk * d + 2 * batch_heads * lq * lk * dv


def _attention_backward(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    # Fused backward recomputes the scores (1 GEMM), then dV, dP, dQ, dK (4 GEMMs).
    batch_heads = prod(q[:-2])
    lq, d, lk, dv = q[-2], q[-1], k[-2], v[-1]
    return 2 * batch_heads * lq * lk * (d + dv + dv + d + d)


def op_flops(op: Op) -> int | None:
    """FLOPs of one op, or None when it is not a GEMM / conv / attention op."""
    n, a = op.name, op.inputs
    if n == "aten::mm" or n == "aten::bmm":
        return _gemm(_shape(a[0]), _shape(a[1]))
    if n in ("aten::addmm", "aten::baddbmm"):
        return _gemm(_shape(a[1]), _shape(a[2]))
    if n in ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution"):
        out = op.tensors("outputs")[0].shape
        return _conv(_shape(a[0]), _shape(a[1]), out, bool(a[6]))
    if n == "aten::convolution_backward":
        # grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        # output_padding, groups, output_mask
        go, x, w, transposed, mask = _shape(a[0]), _shape(a[1]), _shape(a[2]), bool(a[7]), a[10]
        one = _conv(x, w, go, transposed)
        return one * (int(bool(mask[0])) + int(bool(mask[1])))
    if n in ("aten::_scaled_dot_product_flash_attention",
             "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_cudnn_attention"):
        return _attention(_shape(a[0]), _shape(a[1]), _shape(a[2]))
    if n in ("aten::_scaled_dot_product_flash_attention_backward",
             "aten::_scaled_dot_product_efficient_attention_backward",
             "aten::_scaled_dot_product_cudnn_attention_backward"):
        return _attention_backward(_shape(a[1]), _shape(a[2]), _shape(a[3]))
    return None


def trace_flops(t: Trace) -> int:
    """Sum over the outermost GEMM / conv / attention ops of the trace."""
    total = 0
    counted_under: set[int] = set()
    for op in t.ops:
        if op.parent in counted_under:
            counted_under.add(op.id)
            continue
        f = op_flops(op)
        if f is not None:
            total += f
            counted_under.add(op.id)
    return total
