"""Known values in a dry run: tensors whose every element has one value that is known.

A dry run has shapes, not values, so ``.item()`` / ``if tensor:`` on a meta tensor cannot be
answered. Many such calls read tensors the code made itself from constants: transformers' SDPA
mask helpers ask whether an all-ones attention mask (made with ``torch.ones`` when none is given)
has any padding, ``pad_token_id in input_ids`` asks about token ids. :class:`KnownValues` follows
*uniform* tensors (every element the same known value) from the factories that make them
(``ones``, ``zeros``, ``full``, ``fill_``) through views, copies, element-wise ops and
reductions, and answers ``aten::_local_scalar_dense`` (``.item()``, ``bool()``) for them, as the
GPU would. Anything else (values never known, an in-place write that is not a uniform fill)
is not followed, and ``.item()`` on it still raises DataDependentError.

It is a TorchDispatchMode, so every op of the run passes through Python: blink.dryrun enters it
only to retry a trace that failed on ``.item()``, never for traces that do not need it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
Value = bool | int | float


def cast(value: Value, dtype: torch.dtype) -> Value | None:
    """`value` as an element of `dtype` holds it (None: a dtype not followed)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return None
    if dtype.is_floating_point:
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[list[Value]], Value]:
    return lambda v: op(v[0], v[1])


# Element-wise ops whose result follows from their inputs' values in Python (args: the tensor
# and scalar arguments in schema order). Integer division and the like are left out: a wrong
# value would be worse than an unanswered .item().
_ELEMENTWISE: dict[Any, Callable[[list[Value]], Value]] = {
    aten.eq: _cmp(lambda a, b: a == b), aten.ne: _cmp(lambda a, b: a != b),
    aten.lt: _cmp(lambda a, b: a < b), aten.le: _cmp(lambda a, b: a <= b),
    aten.gt: _cmp(lambda a, b: a > b), aten.ge: _cmp(lambda a, b: a >= b),
    aten.logical_not: lambda v: not v[0],
    aten.logical_and: lambda v: bool(v[0]) and bool(v[1]),
    aten.logical_or: lambda v: bool(v[0]) or bool(v[1]),
    aten.logical_xor: lambda v: bool(v[0]) != bool(v[1]),
    aten.bitwise_not: lambda v: (not v[0]) if isinstance(v[0], bool) else ~int(v[0]),
    aten.bitwise_and: lambda v: v[0] & v[1], aten.bitwise_or: lambda v: v[0] | v[1],
    aten.neg: lambda v: -v[0], aten.abs: lambda v: abs(v[0]),
    aten.mul: lambda v: v[0] * v[1],
    aten.add: lambda v: v[0] + v[1], aten.sub: lambda v: v[0] - v[1],
}

# Ops whose outputs hold only elements of their first tensor argument (views, copies, gathers).
_SAME_VALUE = {
    aten.view, aten._unsafe_view, aten.reshape, aten._reshape_alias, aten.expand, aten.slice,
    aten.select, aten.unsqueeze, aten.squeeze, aten.permute, aten.transpose, aten.t,
    aten.alias, aten.clone, aten._to_copy, aten.detach, aten.lift_fresh, aten.index,
    aten.index_select, aten.gather, aten.repeat, aten.narrow, aten.split,
    aten.split_with_sizes, aten.chunk, aten.unbind, aten.as_strided, aten.expand_copy,
    aten.view_copy, aten.unfold, aten.diagonal, aten.flip, aten.roll, aten.contiguous,
}

_FACTORY_VALUE = {aten.ones: 1, aten.ones_like: 1, aten.new_ones: 1,
                  aten.zeros: 0, aten.zeros_like: 0, aten.new_zeros: 0}
_FILL_ARG = {aten.full: 1, aten.full_like: 1, aten.new_full: 2, aten.fill: 1,
             aten.fill_: 1, aten.scalar_tensor: 0}


def _reduce(packet: Any, value: Value, count: int) -> Value | None:
    """The value every element of a reduction over `count` equal elements takes."""
    if packet in (aten.all, aten.any):
        return bool(value) if count else packet is aten.all
    if packet is aten.sum:
        return value * count
    if packet is aten.mean:
        return float(value) if count else None
    if packet in (aten.amax, aten.amin, aten.max, aten.min):
        return value if count else None
    return None


def _storage_key(t: torch.Tensor) -> int | None:
    """The address of `t`'s StorageImpl (shared by its views); None for tensors without one."""
    if t.layout != torch.strided:
        return None
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


class KnownValues(TorchDispatchMode):
    """Follow uniform tensors and answer ``.item()`` on them (see the module docstring).

    `known`: tensors (made before the run) whose every element is known, with that value.
    `answered` counts the ``.item()`` calls answered.
    """

    def __init__(self, known: dict[int, tuple[torch.Tensor, Value]] | None = None) -> None:
        super().__init__()
        # id(tensor) -> (weak reference, value, storage key); an entry leaves with its tensor.
        self._marks: dict[int, tuple[weakref.ref[torch.Tensor], Value, int]] = {}
        self.answered = 0
        for t, value in (known or {}).values():
            self.mark(t, value)

    # -- marks ----------------------------------------------------------------------------
    def mark(self, t: torch.Tensor, value: Value) -> None:
        v = cast(value, t.dtype)
        storage = _storage_key(t)
        if v is None or storage is None:
            return
        key = id(t)
        marks = self._marks
        ref = weakref.ref(t, lambda _r, key=key: marks.pop(key, None))
        marks[key] = (ref, v, storage)

    def value(self, t: object) -> Value | None:
        if not isinstance(t, torch.Tensor):
            return None
        entry = self._marks.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def _forget_storage(self, t: torch.Tensor) -> None:
        """An in-place write: no view of this storage is known any more."""
        key = _storage_key(t)
        for k in [k for k, e in self._marks.items() if key is None or e[2] == key]:
            self._marks.pop(k, None)

    # -- the mode -------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense:
            v = self.value(args[0])
            if v is not None:
                self.answered += 1
                return v
        result = self._result_value(func, packet, args, kwargs)
        out = func(*args, **kwargs)
        written = [a for a, s in zip(args, func._schema.arguments, strict=False)
                   if s.alias_info is not None and s.alias_info.is_write
                   and isinstance(a, torch.Tensor)]
        written += [v for k, v in kwargs.items() if isinstance(v, torch.Tensor)
                    and any(s.name == k and s.alias_info is not None and s.alias_info.is_write
                            for s in func._schema.arguments)]
        for t in written:
            self._forget_storage(t)
        if result is None:
            return out
        targets = written if written else [t for t in tree_leaves(out)
                                           if isinstance(t, torch.Tensor)]
        if packet in (aten.max, aten.min) and isinstance(out, tuple):
            targets = targets[:1]  # (values, indices): the indices are not uniform
        for t in targets:
            self.mark(t, result)
        return out

    def _result_value(self, func: Any, packet: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Value | None:
        """The value every element of `func`'s output takes, where the inputs make it known."""
        if packet in _FACTORY_VALUE:
            return _FACTORY_VALUE[packet]
        if packet in _FILL_ARG:
            i = _FILL_ARG[packet]
            v = args[i] if len(args) > i else kwargs.get("fill_value", kwargs.get("value"))
            if isinstance(v, torch.Tensor):
                return self.value(v)
            return v if isinstance(v, (bool, int, float)) else None
        if packet in _SAME_VALUE:
            return self.value(args[0]) if args else None
        if packet in (aten.cat, aten.stack):
            tensors = args[0] if args else kwargs.get("tensors", [])
            values = {self.value(t) for t in tensors}
            return values.pop() if len(values) == 1 and tensors else None
        if packet in (aten.all, aten.any, aten.sum, aten.mean, aten.amax, aten.amin,
                      aten.max, aten.min):
            src = args[0] if args else None
            v = self.value(src)
            if v is None or not isinstance(src, torch.Tensor):
                return None
            return self._reduction(packet, src, v, args, kwargs)  # dtype= casts at mark()
        if packet is aten.where and func._overloadname == "self" and len(args) == 3:
            cond, a, b = (self.value(x) if isinstance(x, torch.Tensor) else x for x in args)
            if cond is not None:
                return a if cond else b
            return a if a is not None and a == b else None
        if packet is aten.masked_fill and len(args) == 3:
            base, mask = self.value(args[0]), self.value(args[1])
            fill = self.value(args[2]) if isinstance(args[2], torch.Tensor) else args[2]
            if mask is not None:
                return fill if mask else base
            return base if base is not None and base == fill else None
        rule = _ELEMENTWISE.get(packet)
        if rule is None or kwargs:
            return None
        values: list[Value] = []
        for a in args:
            v = self.value(a) if isinstance(a, torch.Tensor) else a
            if not isinstance(v, (bool, int, float)):
                return None
            values.append(v)
        try:
            return rule(values)
        except (TypeError, ValueError, ArithmeticError):
            return None

    @staticmethod
    def _reduction(packet: Any, src: torch.Tensor, v: Value, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Value | None:
        dims: Any = args[1] if len(args) > 1 else kwargs.get("dim")
        if isinstance(dims, (bool, torch.Tensor)):  # max(a, b) / min(a, b): element-wise
            return None
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0
                            and packet in (aten.sum, aten.mean)):
            count = src.numel()
        else:
            dims = [dims] if isinstance(dims, int) else list(dims)
            count = 1
            for d in dims:
                count *= src.shape[d] if src.dim() else 1
        return _reduce(packet, v, count)
