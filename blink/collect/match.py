"""Line up the dry run's cost units with the ops measured on the device.

Both sides are cut by the same rule (the outermost op with its own CUDA kernel, plus the
convolution rule), in call order, so the sequences are nearly identical; they differ where the
device runs something the meta device does not (or the reverse). Units are keyed by op name
and input shapes; the alignment walks both sequences and resynchronises within a window.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_TENSOR, _TENSOR_LIST = 1, 2  # argument kinds of the raw trace (blink::ArgKind)
WINDOW = 64


def _sizes(t: Sequence[object]) -> str:
    return "x".join(str(s) for s in t)


def shapes_key_raw(args: Sequence[Sequence[object]]) -> str:
    """The key of a dry-run op's inputs (raw trace format); the same text blink._cupti builds."""
    parts = []
    for kind, value in args:
        if kind == _TENSOR:
            parts.append(_sizes(value[0]))  # type: ignore[index]
        elif kind == _TENSOR_LIST:
            items = ["-" if t is None else _sizes(t[0]) for t in value]  # type: ignore[union-attr]
            parts.append("[" + ",".join(items) + "]")
        else:
            parts.append("")
    return ";".join(parts)


def shapes_key_profiler(input_shapes: Sequence[object]) -> str:
    """The key from a torch.profiler event's input_shapes (tensor lists are lists of lists)."""
    parts = []
    for s in input_shapes:
        if isinstance(s, (list, tuple)) and s and isinstance(s[0], (list, tuple)):
            parts.append("[" + ",".join(_sizes(t) for t in s) + "]")
        elif isinstance(s, (list, tuple)):
            parts.append(_sizes(s))
        else:
            parts.append("")
    return ";".join(parts)


@dataclass(frozen=True)
class Key:
    name: str
    shapes: str


@dataclass(frozen=True)
class Pair:
    dry: int | None       # index into the dry units
    measured: int | None  # index into the measured ops
    match: str            # exact | name | dry_only | measured_only


# Kernel ops CUDA picks where the meta device runs another op for the same unit: fp32 batch
# norm goes to cuDNN on CUDA (_batch_norm_impl_index) and to native_batch_norm on meta.
CUDA_ALIASES = {
    "aten::cudnn_batch_norm": "aten::native_batch_norm",
    "aten::cudnn_batch_norm_backward": "aten::native_batch_norm_backward",
}


def canonical(key: Key) -> Key:
    name = CUDA_ALIASES.get(key.name)
    return key if name is None else Key(name, key.shapes)


def align(dry: Sequence[Key], measured: Sequence[Key], window: int = WINDOW) -> list[Pair]:
    """Pairs in order. exact: same name and shapes; name: same name, other shapes, at the same
    place; dry_only / measured_only: no partner on the other side.

    Where the keys disagree, the walk skips the fewest units (on either side or both) after
    which the next RUN keys agree again, or, at a small extra cost, the next RUN op names
    (torch.profiler records no tensor-list shapes, so CPU keys can differ all through an
    optimizer step); within a stretch skipped on both sides, units at the same offset with the
    same name are paired by name.
    """
    measured = [canonical(k) for k in measured]
    out: list[Pair] = []
    i = j = 0
    n, m = len(dry), len(measured)
    while i < n and j < m:
        if dry[i] == measured[j]:
            out.append(Pair(i, j, "exact"))
            i, j = i + 1, j + 1
            continue
        step = _skip(dry, measured, i, j, window) or (1, 1)
        d1, d2 = step
        if d1 == 0 and d2 == 0:  # names agree from here on: a run of shape differences
            out.append(Pair(i, j, "name"))
            i, j = i + 1, j + 1
            continue
        for t in range(max(d1, d2)):
            a = i + t if t < d1 else None
            b = j + t if t < d2 else None
            if a is not None and b is not None and dry[a].name == measured[b].name:
                out.append(Pair(a, b, "name"))
                continue
            if a is not None:
                out.append(Pair(a, None, "dry_only"))
            if b is not None:
                out.append(Pair(None, b, "measured_only"))
        i, j = i + d1, j + d2
    out += [Pair(k, None, "dry_only") for k in range(i, n)]
    out += [Pair(None, k, "measured_only") for k in range(j, m)]
    return out


RUN = 3  # consecutive agreeing units that count as back in step
NAME_PENALTY = 2  # a resynchronisation on names alone counts as skipping this many more units


def _skip(dry: Sequence[Key], measured: Sequence[Key], i: int, j: int,
          window: int) -> tuple[int, int] | None:
    """The cheapest (dry skip, measured skip) after which RUN consecutive units agree: on keys
    at the cost of the units skipped, or on names alone at NAME_PENALTY more; one-sided skips
    first among equal costs."""
    n, m = len(dry), len(measured)

    def agree(x: int, y: int, exact: bool) -> bool:
        count = 0
        for t in range(RUN):
            if x + t >= n or y + t >= m:
                break
            a, b = dry[x + t], measured[y + t]
            if (a != b) if exact else (a.name != b.name):
                return False
            count += 1
        return count > 0

    def candidates(total: int) -> list[tuple[int, int]]:
        if total == 0:
            return [(0, 0)]
        return [(total, 0), (0, total)] + [(d, total - d) for d in range(1, total)]

    for cost in range(window + NAME_PENALTY + 1):
        if 1 <= cost <= window:
            for d1, d2 in candidates(cost):
                if agree(i + d1, j + d2, True):
                    return d1, d2
        if 0 <= cost - NAME_PENALTY <= window:
            for d1, d2 in candidates(cost - NAME_PENALTY):
                if agree(i + d1, j + d2, False):
                    return d1, d2
    return None
