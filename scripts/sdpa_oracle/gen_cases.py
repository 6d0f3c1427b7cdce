"""SDPA test cases for oracle.py: a fixed grid plus random cases that hit every check."""

from __future__ import annotations

import random
from typing import Any

Case = dict[str, Any]


def _contiguous(shape: list[int]) -> list[int]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(size, 1)
    return list(reversed(stride))


def _case(dtype: str, q: list[int], k: list[int], v: list[int], **extra: Any) -> Case:
    return {"dtype": dtype, "q": q, "k": k, "v": v, **extra}


def _blhe(shape: list[int]) -> list[int]:
    """Strides of a (B, H, L, E) view of a contiguous (B, L, H, E) tensor."""
    _, heads, seq, dim = shape
    return [seq * heads * dim, dim, heads * dim, 1]


def grid_cases() -> list[Case]:
    """Head dims, dtypes, dropout and training around every head-dim limit, plus decode."""
    cases: list[Case] = []
    for dtype in ("fp16", "bf16", "fp32"):
        for dim in (64, 72, 128, 160, 192, 200, 224, 232, 256, 264, 512):
            for grad in (False, True):
                for dropout in (0.0, 0.1, 0.125):
                    shape = [2, 8, 256, dim]
                    cases.append(
                        _case(dtype, shape, shape, shape, requires_grad=grad, dropout=dropout)
                    )
        for d_qk, d_v in ((192, 128), (256, 256), (128, 64), (192, 192), (256, 128)):
            for grad in (False, True):
                qk, v = [2, 8, 256, d_qk], [2, 8, 256, d_v]
                cases.append(_case(dtype, qk, qk, v, requires_grad=grad))
        for seq_q in (1, 2):
            for dropout in (0.0, 0.125):
                q, gqa_kv, kv = [4, 32, seq_q, 128], [4, 8, 4096, 128], [4, 32, 4096, 128]
                cases.append(_case(dtype, q, gqa_kv, gqa_kv, enable_gqa=True, dropout=dropout))
                cases.append(_case(dtype, q, kv, kv, dropout=dropout))
    return cases


def random_case(rng: random.Random) -> Case:
    """One random case; the probabilities are chosen so that every check fails sometimes."""
    dtype = rng.choice(["fp16", "bf16", "bf16", "fp32", "fp16", "fp64"])
    batch = rng.choice([1, 2, 4, 70000]) if rng.random() < 0.05 else rng.choice([1, 2, 4])
    heads = rng.choice([1, 8, 16, 70000]) if rng.random() < 0.03 else rng.choice([1, 2, 8, 16])
    seq_q = rng.choice([1, 2, 7, 64, 128, 129, 1000])
    seq_k = seq_q if rng.random() < 0.6 else rng.choice([0, 1, 2, 7, 64, 128, 257, 1000])
    if rng.random() < 0.03:
        seq_q = 0
    dims = [
        1,
        4,
        8,
        16,
        32,
        40,
        60,
        64,
        72,
        80,
        96,
        100,
        128,
        160,
        192,
        200,
        224,
        232,
        256,
        264,
        320,
        512,
    ]
    d_qk = d_v = rng.choice(dims)
    draw = rng.random()
    if draw < 0.08:
        d_qk, d_v = 192, 128
    elif draw < 0.12:
        d_v = rng.choice([32, 64, 128, 256, 60, 512])
    heads_k = heads_v = heads
    gqa = False
    draw = rng.random()
    if draw < 0.15:
        heads_k = heads_v = rng.choice([1, 2, 4, 3])
        gqa = rng.random() < 0.7
    elif draw < 0.2:
        heads_k, heads_v = rng.choice([(2, 4), (1, 2), (4, 2), (1, 8)])
        gqa = rng.random() < 0.7
    elif draw < 0.23:
        gqa = True
    batch_kv = 1 if rng.random() < 0.03 else batch
    q = [batch, heads, seq_q, d_qk]
    k = [batch_kv, heads_k, seq_k, d_qk]
    v = [batch_kv, heads_v, seq_k, d_v]
    case = _case(dtype, q, k, v, enable_gqa=gqa)
    if rng.random() < 0.03:  # unbatched (3-D) inputs
        case["q"], case["k"], case["v"] = q[1:], k[1:], v[1:]
    else:
        layout = rng.random()
        if layout < 0.3:
            case["q_stride"], case["k_stride"], case["v_stride"] = _blhe(q), _blhe(k), _blhe(v)
        elif layout < 0.34:
            case["q_stride"] = [2 * s for s in _contiguous(q)]  # last stride 2
        if rng.random() < 0.08:
            case["q_offset"] = rng.choice([1, 2, 4, 8, 16, 64])
            case["k_offset"] = rng.choice([0, 3, 8])
    case["requires_grad"] = rng.random() < 0.4
    if rng.random() < 0.3:
        case["dropout"] = rng.choice([0.1, 0.125, 0.5, 0.0625, 0.2])
    if rng.random() < 0.3:
        case["is_causal"] = True
    if rng.random() < 0.3 and not case.get("is_causal") and len(case["q"]) == 4:
        kind = rng.random()
        shapes = [
            (0.3, [seq_q, seq_k]),
            (0.55, [batch, 1, seq_q, seq_k]),
            (0.65, [1, heads, seq_q, seq_k]),
            (0.75, [batch, seq_q, seq_k]),
            (0.8, [batch, heads, seq_q, seq_k]),
            (0.85, [seq_q, 1]),
            (0.9, [3, 1, seq_q, seq_k]),
            (1.0, [1, 1, seq_q, seq_k]),
        ]
        mask = next(shape for bound, shape in shapes if kind < bound)
        case["mask"] = mask
        case["mask_dtype"] = rng.choice(["bool", "bool", dtype, "fp32"])
        if rng.random() < 0.1:  # a broadcast (expanded) mask: last stride 0
            stride = _contiguous(mask)
            stride[-1] = 0
            stride[-2] = 1
            case["mask_stride"] = stride
        if rng.random() < 0.05:
            case["mask_requires_grad"] = True
            case["mask_dtype"] = dtype if dtype != "fp64" else "fp32"
    if rng.random() < 0.05:
        case["enabled"] = {name: rng.random() < 0.5 for name in ("flash", "efficient", "cudnn")}
        case["enabled"]["math"] = True
    if rng.random() < 0.03:
        case["deterministic"] = True
        case["warn_only"] = rng.random() < 0.5
    return case


def make_cases(count: int, seed: int) -> list[Case]:
    """The grid plus ``count`` random cases drawn with ``seed``."""
    rng = random.Random(seed)
    return grid_cases() + [random_case(rng) for _ in range(count)]
