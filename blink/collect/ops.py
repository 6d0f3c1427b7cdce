"""Single-op workloads for the op sweeps: GEMM / bmm / linear, convolution, fused attention,
norms, softmax, elementwise and reductions, each built from a few shape parameters.

``build_op(family, params, dtype, device)`` returns the call and its input tensors: random
values on a real device, empty tensors on ``meta`` (the dry run). ``grid(family, n, scale)``
draws shape points: powers of two, the odd sizes real models use (768, 3072, 50257, ...) and
log-uniform random sizes, from a fixed seed so every preset is reproducible.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError

OpCall = Callable[..., Any]
Params = dict[str, int]

# dtype name -> (tensor dtype, TF32 for matmul, TF32 for cuDNN)
OP_DTYPES: dict[str, tuple[torch.dtype, bool, bool]] = {
    "fp32": (torch.float32, False, False),
    "tf32": (torch.float32, True, True),
    "bf16": (torch.bfloat16, False, True),
}


def _t(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
       gen: torch.Generator | None) -> torch.Tensor:
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device, generator=gen)


def build_op(family: str, params: Params, dtype: str, device: torch.device | str,
             seed: int = 0) -> tuple[OpCall, tuple[torch.Tensor, ...]]:
    """The op call and its inputs for one sweep point."""
    if dtype not in OP_DTYPES:
        raise ConfigError(f"op dtype must be one of {', '.join(OP_DTYPES)}, not {dtype!r}")
    if family not in FAMILIES:
        raise ConfigError(f"unknown op family {family!r}; known: {', '.join(FAMILIES)}")
    dev = torch.device(device)
    gen = None
    if dev.type != "meta":
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
    dt = OP_DTYPES[dtype][0]
    p = params

    def t(*shape: int) -> torch.Tensor:
        return _t(tuple(shape), dt, dev, gen)

    if family == "mm":
        return torch.mm, (t(p["m"], p["k"]), t(p["k"], p["n"]))
    if family == "bmm":
        return torch.bmm, (t(p["b"], p["m"], p["k"]), t(p["b"], p["k"], p["n"]))
    if family == "linear":
        args = (t(p["tokens"], p["in"]), t(p["out"], p["in"]))
        if p.get("bias", 1):
            args += (t(p["out"]),)
        return F.linear, args
    if family == "conv2d":
        groups = p.get("groups", 1)
        x = t(p["n"], p["c"], p["h"], p["w"])
        w = t(p["k"], p["c"] // groups, p["r"], p["r"])
        stride, pad = p.get("stride", 1), p.get("pad", p["r"] // 2)
        return (lambda x, w: F.conv2d(x, w, None, stride, pad, 1, groups)), (x, w)
    if family == "sdpa":
        causal = bool(p.get("causal", 0))
        q = t(p["b"], p["h"], p["s"], p["d"])
        k = t(p["b"], p["h"], p["s"], p["d"])
        v = t(p["b"], p["h"], p["s"], p["d"])
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)), (
            q, k, v)
    if family == "layer_norm":
        cols = p["cols"]
        return (lambda x, w, b: F.layer_norm(x, (cols,), w, b)), (t(p["rows"], cols), t(cols),
                                                                   t(cols))
    if family == "rms_norm":
        cols = p["cols"]
        return (lambda x, w: F.rms_norm(x, (cols,), w)), (t(p["rows"], cols), t(cols))
    if family == "batch_norm":
        c = p["c"]
        # Half-precision inputs take fp32 statistics and affine parameters (the mixed kernel).
        pd = torch.float32 if dt == torch.bfloat16 else dt
        mean, weight, bias = (_t((c,), pd, dev, gen) for _ in range(3))
        var = mean.abs() if dev.type != "meta" else mean
        return (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False)), (
            t(p["n"], c, p["h"], p["w"]), mean, var, weight, bias)
    if family == "softmax":
        return (lambda x: torch.softmax(x, -1)), (t(p["rows"], p["cols"]),)
    if family in ("add", "mul"):
        fn = torch.add if family == "add" else torch.mul
        return fn, (t(p["numel"]), t(p["numel"]))
    if family == "gelu":
        return F.gelu, (t(p["numel"]),)
    if family == "relu":
        return F.relu, (t(p["numel"]),)
    if family in ("sum", "mean"):
        dim = p.get("dim", 1)
        red = torch.sum if family == "sum" else torch.mean
        return (lambda x: red(x, dim)), (t(p["rows"], p["cols"]),)
    if family == "grouped_mm":
        # MoE experts (transformers' grouped_mm_experts_forward): rows routed evenly over the
        # experts, the experts' weights (E, K, N), int32 cumulative group ends.
        e, rows = p["experts"], p["rows"]
        ends = [(rows * (g + 1)) // e for g in range(e)]
        offs = (torch.empty((e,), dtype=torch.int32, device=dev) if dev.type == "meta"
                else torch.tensor(ends, dtype=torch.int32, device=dev))
        return (lambda x, w, o: torch._grouped_mm(x, w, offs=o)), (
            t(rows, p["k"]), t(e, p["k"], p["n"]), offs)
    raise AssertionError(family)


# Sizes real models use, beyond powers of two.
_MODEL_DIMS = (768, 1024, 1280, 1536, 2048, 2560, 3072, 4096, 5120, 8192, 11008, 14336)
_VOCABS = (30522, 32000, 50257, 128256)


def _pick(rng: random.Random, lo: int, hi: int, align: int = 1) -> int:
    """Log-uniform in [lo, hi], rounded to a multiple of align half the time."""
    v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    if rng.random() < 0.5:
        v = max(align, (v // align) * align)
    return max(lo, min(hi, v))


def _pow2(rng: random.Random, lo: int, hi: int) -> int:
    return 2 ** rng.randint(int(math.log2(lo)), int(math.log2(hi)))


def _dim(rng: random.Random, lo: int, hi: int) -> int:
    r = rng.random()
    if r < 0.35:
        return _pow2(rng, lo, hi)
    if r < 0.6:
        choices = [d for d in _MODEL_DIMS if lo <= d <= hi]
        if choices:
            return rng.choice(choices)
    return _pick(rng, lo, hi, 8)


def _point(family: str, rng: random.Random, scale: float) -> Params:
    """One random shape point; scale < 1 shrinks every size (CPU smoke)."""

    def s(lo: int, hi: int) -> tuple[int, int]:
        return max(1, int(lo * scale) or 1), max(2, int(hi * scale))

    if family == "mm":
        m = _dim(rng, *s(16, 16384))
        if rng.random() < 0.1:
            return {"m": m, "n": rng.choice(_VOCABS) if scale >= 1 else _dim(rng, *s(64, 4096)),
                    "k": _dim(rng, *s(256, 8192))}
        return {"m": m, "n": _dim(rng, *s(16, 16384)), "k": _dim(rng, *s(16, 16384))}
    if family == "bmm":
        return {"b": _pow2(rng, 1, max(2, int(512 * scale))), "m": _dim(rng, *s(16, 4096)),
                "n": _dim(rng, *s(16, 4096)), "k": _dim(rng, *s(16, 1024))}
    if family == "linear":
        return {"tokens": _dim(rng, *s(1, 65536)), "in": _dim(rng, *s(64, 16384)),
                "out": _dim(rng, *s(64, 16384)), "bias": rng.randint(0, 1)}
    if family == "conv2d":
        r = rng.choice((1, 3, 3, 5, 7))
        c = _pow2(rng, 3 if r == 7 else 16, max(16, int(1024 * scale)))
        h = rng.choice((7, 14, 28, 56, 112, 224)) if scale >= 1 else rng.choice((8, 16, 32))
        groups = c if (r == 3 and rng.random() < 0.15) else 1
        k = c if groups > 1 else _pow2(rng, 16, max(16, int(1024 * scale)))
        return {"n": _pow2(rng, 1, max(2, int(256 * scale))), "c": c, "h": h, "w": h, "k": k,
                "r": r, "stride": rng.choice((1, 1, 2)), "groups": groups}
    if family == "sdpa":
        return {"b": _pow2(rng, 1, max(2, int(64 * scale))), "h": rng.choice((8, 12, 16, 32)),
                "s": _pow2(rng, 64, max(64, int(8192 * scale))),
                "d": rng.choice((64, 64, 128, 128, 80, 96)) if scale >= 1 else 32,
                "causal": rng.randint(0, 1)}
    if family in ("layer_norm", "rms_norm", "softmax", "sum", "mean"):
        p = {"rows": _dim(rng, *s(1, 65536)), "cols": _dim(rng, *s(32, 65536))}
        if family in ("sum", "mean"):
            p["dim"] = rng.randint(0, 1)
        return p
    if family == "batch_norm":
        h = rng.choice((7, 14, 28, 56, 112)) if scale >= 1 else rng.choice((8, 16))
        return {"n": _pow2(rng, 1, max(2, int(256 * scale))), "c": _pow2(rng, 16, 1024),
                "h": h, "w": h}
    if family in ("add", "mul", "gelu", "relu"):
        return {"numel": _pick(rng, *s(1024, 1 << 28), 1024)}
    if family == "grouped_mm":
        # K and N multiples of 8 (16-byte rows, as the kernels require); from decode-sized row
        # counts (a few experts reached) to prefill ones (every expert busy)
        return {"experts": rng.choice((8, 16, 32, 64, 128)), "rows": _dim(rng, *s(1, 65536)),
                "k": 8 * max(1, _dim(rng, *s(256, 8192)) // 8),
                "n": 8 * max(1, _dim(rng, *s(128, 8192)) // 8)}
    raise AssertionError(family)


FAMILIES = ("mm", "bmm", "linear", "conv2d", "sdpa", "layer_norm", "rms_norm", "batch_norm",
            "softmax", "add", "mul", "gelu", "relu", "sum", "mean", "grouped_mm")
# Families torch runs in bf16 only (torch._grouped_mm: bf16, or fp16 with cuBLASLt's grouped
# GEMM; its meta kernel refuses fp32).
BF16_ONLY = ("grouped_mm",)

# Bytes of one point's inputs + output, to keep sweep points inside a memory limit.
_MAX_ELEMENTS = 1 << 30


def _elements(family: str, p: Params) -> int:
    if family == "mm":
        return p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"]
    if family == "bmm":
        return p["b"] * (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"])
    if family == "linear":
        return p["tokens"] * (p["in"] + p["out"]) + p["in"] * p["out"]
    if family == "conv2d":
        return p["n"] * (p["c"] + p["k"]) * p["h"] * p["w"] + p["k"] * p["c"] * p["r"] ** 2
    if family == "sdpa":
        return 4 * p["b"] * p["h"] * p["s"] * p["d"]
    if family == "grouped_mm":
        return p["rows"] * (p["k"] + p["n"]) + p["experts"] * p["k"] * p["n"]
    if family == "batch_norm":
        return 2 * p["n"] * p["c"] * p["h"] * p["w"]
    if "numel" in p:
        return 3 * p["numel"]
    return 2 * p["rows"] * p["cols"]


def grid(family: str, n: int, *, seed: int = 0, scale: float = 1.0,
         max_elements: int = _MAX_ELEMENTS) -> list[Params]:
    """n distinct shape points for a family (reproducible for a given seed and scale)."""
    rng = random.Random(f"{family}:{seed}:{scale}")
    out: list[Params] = []
    seen: set[tuple] = set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        p = _point(family, rng, scale)
        key = tuple(sorted(p.items()))
        if key in seen or _elements(family, p) > max_elements:
            continue
        seen.add(key)
        out.append(p)
    return out
