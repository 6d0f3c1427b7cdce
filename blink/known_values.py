"""Known values in a dry run: tensors whose elements all come from a small known set.

A dry run has shapes, not values, so ``.item()`` / ``if tensor:`` on a meta tensor cannot be
answered. Many such calls read tensors the code made itself from constants: transformers' SDPA
mask helpers ask whether an all-ones attention mask (made with ``torch.ones`` when none is given)
has any padding, ``pad_token_id in input_ids`` asks about token ids, a seq2seq model asserts
that its right-shifted decoder ids (zeros, then the ids written in) are not negative.
:class:`KnownValues` gives a tensor a *value set*: every element is one of these values (at most
MAX_VALUES of them). It starts sets at the factories (``ones``, ``zeros``, ``full``, ``fill_``,
Blink's own token ids), carries them through views, copies, casts, element-wise ops, ``where``,
``masked_fill`` and reductions, and through in-place writes (a write into part of a tensor adds
the written values to the set of every view of that storage), and answers
``aten::_local_scalar_dense`` (``.item()``, ``bool()``) where the set has one value, as the GPU
would. Integer ``arange`` results are followed as *progressions* (element = start + step x its
index along one dimension) through views, slices, ``cat`` and element-wise arithmetic with one
value or with another progression along the same dimension: transformers asks whether its
``arange`` position ids are one sequence or several packed ones (``torch.diff`` of them is all
ones). A progression of at most MAX_VALUES elements is also a value set. Anything else
(values never known, a write of unknown values, a sum over several possible values) is not
followed, and ``.item()`` on it still raises DataDependentError.

A tensor made on the device from host memory (``torch.tensor(numpy_mask, device=...)``,
``cpu_tensor.to(device)``) has values the host knows in full: its *host copy* (a CPU tensor of at
most MAX_HOST_ELEMENTS elements) is kept and carried through every op whose tensor inputs all
have one (the same op runs on the copies; an in-place write updates them or drops them). That
answers ``.item()`` on such tensors, sizes the outputs of ops whose shape depends on values
(``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave`` ...) from the copies, and
indexes with a known boolean mask (``x[mask]``, e.g. the SpecAugment masks speech models draw
with numpy) at the mask's true count, as CUDA's nonzero would.

It is a TorchDispatchMode, so every op of the run passes through Python: blink.dryrun enters it
only to retry a trace that failed on ``.item()`` or a data-dependent shape, never for traces that
do not need it.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import struct
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten
Value = bool | int | float
Values = frozenset  # of Value: every element of the tensor is one of them

# A set larger than this is dropped (treated as unknown): the sets stay small and cheap.
MAX_VALUES = 16


# The largest integer each float dtype holds exactly, with every integer below it.
_EXACT_INT = {torch.float64: 2 ** 53, torch.float32: 2 ** 24, torch.float16: 2 ** 11,
              torch.bfloat16: 2 ** 8}


def _exact_float(v: float, dtype: torch.dtype) -> bool:
    """Whether `v` is a value of `dtype` exactly (then torch and Python agree on it)."""
    if math.isnan(v):
        return False
    if math.isinf(v) or dtype == torch.float64:
        return True
    try:
        if dtype == torch.float32:
            return struct.unpack("<f", struct.pack("<f", v))[0] == v
        if dtype == torch.float16:
            return struct.unpack("<e", struct.pack("<e", v))[0] == v
        if dtype == torch.bfloat16:  # a float32 whose low 16 bits are zero
            bits = struct.unpack("<I", struct.pack("<f", v))[0]
            return struct.unpack("<f", struct.pack("<I", bits))[0] == v and bits & 0xFFFF == 0
    except OverflowError:
        return False
    return False  # float8 and other formats: not followed


def cast(value: Value, dtype: torch.dtype) -> Value | None:
    """`value` as an element of `dtype`, or None where torch would round, overflow or wrap it
    (a value is only followed while Python and torch agree on it exactly)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return None
    if dtype.is_floating_point:
        v = float(value)
        if not isinstance(value, float) and v != value:
            return None  # an integer beyond a double's exact range
        return v if _exact_float(v, dtype) else None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = int(value)  # C's float-to-int conversion truncates toward zero
    try:
        info = torch.iinfo(dtype)
    except TypeError:
        return None
    v = int(value)
    return v if info.min <= v <= info.max else None


def _exact_in(values: Values, dtypes: Iterable[torch.dtype]) -> bool:
    """Every value is the same number in each of `dtypes`."""
    return all(cast(v, d) == v for d in dtypes for v in values)


def _cast_all(values: Iterable[Value], dtype: torch.dtype) -> Values | None:
    out = set()
    for v in values:
        c = cast(v, dtype)
        if c is None:
            return None
        out.add(c)
    return frozenset(out) if 0 < len(out) <= MAX_VALUES else None


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
    aten.rsub: lambda v: v[1] - v[0],
    aten.div: lambda v: v[0] / v[1],  # true division (rounding_mode= comes as a kwarg: skipped)
}
_UNARY = {aten.logical_not, aten.bitwise_not, aten.neg, aten.abs}
# Their in-place forms (self is read, then written).
_ELEMENTWISE_INPLACE = {getattr(aten, p.__name__ + "_"): p for p in _ELEMENTWISE
                        if hasattr(aten, p.__name__ + "_")}

# Ops whose outputs hold only elements of their first tensor argument (views, copies, gathers;
# not as_strided, which can reach storage outside the view, nor view(dtype), which reinterprets
# the bits).
_SAME_VALUES = {
    aten.view, aten._unsafe_view, aten.reshape, aten._reshape_alias, aten.expand, aten.slice,
    aten.select, aten.unsqueeze, aten.squeeze, aten.permute, aten.transpose, aten.t,
    aten.alias, aten.clone, aten._to_copy, aten.detach, aten.lift_fresh, aten.index,
    aten.index_select, aten.gather, aten.repeat, aten.narrow, aten.split,
    aten.split_with_sizes, aten.chunk, aten.unbind, aten.expand_copy,
    aten.view_copy, aten.unfold, aten.diagonal, aten.flip, aten.roll, aten.contiguous,
}

_FACTORY_VALUE = {aten.ones: 1, aten.ones_like: 1, aten.new_ones: 1,
                  aten.zeros: 0, aten.zeros_like: 0, aten.new_zeros: 0}
_FILL_ARG = {aten.full: 1, aten.full_like: 1, aten.new_full: 2, aten.fill: 1,
             aten.fill_: 1, aten.scalar_tensor: 0}
_REDUCTIONS = (aten.all, aten.any, aten.sum, aten.mean, aten.amax, aten.amin, aten.max,
               aten.min)


def _reduce(packet: Any, values: Values, count: int,
            dtypes: tuple[torch.dtype, ...]) -> Values | None:
    """The values a reduction over `count` elements drawn from `values` can take (`dtypes`:
    the input's and the output's)."""
    if packet in (aten.all, aten.any):
        if count == 0:
            return frozenset({packet is aten.all})
        truth = {bool(v) for v in values}
        return frozenset(truth) if len(truth) == 1 else None
    if packet in (aten.amax, aten.amin, aten.max, aten.min):
        return values if count else None  # the extreme is one of the elements
    if len(values) != 1 or count == 0:
        return None  # a sum or mean of several possible values is not known
    (v,) = values
    floats = [d for d in dtypes if d.is_floating_point]
    if floats:
        # v = m / 2^k: every partial sum j * v is exact in a float dtype while j * |m| stays
        # within the integers it holds exactly; then any summation order gives j * v.
        m = float(v).as_integer_ratio()[0] if math.isfinite(float(v)) else None
        if m is None or abs(m) * count > min(_EXACT_INT.get(d, 0) for d in floats):
            return None
    if packet is aten.sum:
        return frozenset({v * count})
    if packet is aten.mean:
        return frozenset({float(v)})
    return None


def _select(cond: Values | None, if_true: Values | None,
            if_false: Values | None) -> Values | None:
    """The values of an element-wise choice (where, masked_fill) by a condition's values."""
    if if_true is None or if_false is None:
        return None
    if cond == {True}:
        return if_true
    if cond == {False}:
        return if_false
    return if_true | if_false  # either, element by element


def _storage_key(t: torch.Tensor) -> int | None:
    """The address of `t`'s StorageImpl (shared by its views); None for tensors without one."""
    if t.layout != torch.strided:
        return None
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensor arguments `func` writes into (self of an in-place op, out=)."""
    out = []
    for i, s in enumerate(func._schema.arguments):
        if s.alias_info is None or not s.alias_info.is_write:
            continue
        a = args[i] if i < len(args) and not s.kwarg_only else kwargs.get(s.name)
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):  # _foreach_*_ write every tensor of their list
            out += [x for x in a if isinstance(x, torch.Tensor)]
    return out


_CTYPES = {torch.float64: ctypes.c_double, torch.float32: ctypes.c_float,
           torch.int64: ctypes.c_int64, torch.int32: ctypes.c_int32, torch.bool: ctypes.c_bool}


def _cpu_scalar(t: torch.Tensor) -> Value | None:
    """The value of a one-element CPU tensor (a Python number wrapped by the op's caller: ``mask
    * 0.0`` passes 0.0 as one), read from its memory: calling .item() would dispatch an op into
    the trace."""
    kind = _CTYPES.get(t.dtype)
    if (kind is None or type(t) is not torch.Tensor or t.device.type != "cpu" or t.numel() != 1
            or t.layout != torch.strided or t.is_neg() or t.is_conj()):
        return None
    address = t.data_ptr()
    if not address:
        return None
    value = kind.from_address(address).value
    return bool(value) if t.dtype == torch.bool else value


class Prog(NamedTuple):
    """Integer elements start + step * i, i the element's index along dimension `dim` (the same
    along every other dimension)."""
    start: int
    step: int
    dim: int


_INT_DTYPES = (torch.int64, torch.int32)
_PROG_LIMIT = 2 ** 31  # a progression is followed while every element stays well within int32
_PROG_VIEWS = {aten.alias, aten.detach, aten.lift_fresh, aten.clone, aten.contiguous}


def _prog_ok(p: Prog, t: torch.Tensor) -> bool:
    n = t.shape[p.dim] if t.dim() else 1
    last = p.start + p.step * max(n - 1, 0)
    return (t.dtype in _INT_DTYPES and 0 <= p.dim < max(t.dim(), 1)
            and abs(p.start) < _PROG_LIMIT and abs(last) < _PROG_LIMIT)


def _norm_index(i: int | None, n: int, default: int) -> int:
    if i is None:
        return default
    if i < 0:
        i += n
    return min(max(i, 0), n)


def _remember(table: dict[int, Any], t: torch.Tensor, what: Any, storage: int) -> None:
    """table[id(t)] = what, for as long as `t` lives (a weakref callback drops the entry, so
    an id is never read for another tensor)."""
    key = id(t)
    ref = weakref.ref(t, lambda _r, key=key: table.pop(key, None))
    table[key] = (ref, what, storage)


def _recall(table: dict[int, Any], t: torch.Tensor) -> Any:
    """What _remember stored for `t`, while `t` still has the same storage (x.data = y swaps
    it without an op the mode sees)."""
    entry = table.get(id(t))
    if entry is None or entry[0]() is not t or _storage_key(t) != entry[2]:
        return None
    return entry[1]


# A host copy larger than this is not kept: the copies stay cheap to carry and compute on.
MAX_HOST_ELEMENTS = 1 << 20

# Factories whose elements are not set (a host copy of them would be invented values).
_UNSET = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
          aten.new_empty_strided, aten.empty_permuted, aten.resize_, aten.resize_as_,
          aten.set_}
# Ops that overwrite every element of their destination from their other inputs.
_OVERWRITES = {aten.copy_, aten.fill_, aten.zero_}
_MASK_DTYPES = (torch.bool, torch.uint8)
_INDEX_OPS = {aten.index, aten._unsafe_index}


def _whole_storage(t: torch.Tensor) -> bool:
    """`t` is its storage's one contiguous view (writing all of it leaves no other values)."""
    try:
        return (t.is_contiguous() and t.storage_offset() == 0
                and t.untyped_storage().nbytes() == t.numel() * t.element_size())
    except (RuntimeError, NotImplementedError):
        return False


def _small(t: torch.Tensor) -> bool:
    return t.numel() <= MAX_HOST_ELEMENTS


class _NoRecord:
    """Host-copy arithmetic runs on the CPU inside an op the trace records: RecordFunction off,
    so blink's tracer (and any profiler) never sees it."""

    def __enter__(self) -> None:
        torch.autograd._enable_record_function(False)

    def __exit__(self, *exc: object) -> None:
        torch.autograd._enable_record_function(True)


class KnownValues(TorchDispatchMode):
    """Follow value sets and answer ``.item()`` where one value is left (module docstring).

    `known`: (tensor, value) pairs of tensors made before the run whose every element is that
    value. `answered` counts the ``.item()`` calls answered.
    """

    def __init__(self, known: Iterable[tuple[torch.Tensor, Value]] = ()) -> None:
        super().__init__()
        # id(tensor) -> (weak reference, value set, storage key); an entry leaves with its
        # tensor (a weakref callback), so an id is never read for another tensor.
        self._marks: dict[int, tuple[weakref.ref[torch.Tensor], Values, int]] = {}
        self._progs: dict[int, tuple[weakref.ref[torch.Tensor], Prog, int]] = {}
        self._host: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor, int]] = {}
        self.answered = 0
        self.sized = 0  # data-dependent shapes sized from host copies
        for t, value in known:
            self.mark(t, frozenset({value}))

    # -- marks ----------------------------------------------------------------------------
    def mark(self, t: torch.Tensor, values: Iterable[Value]) -> None:
        vs = _cast_all(values, t.dtype)
        storage = _storage_key(t)
        if vs is None or storage is None:
            self._marks.pop(id(t), None)
            return
        _remember(self._marks, t, vs, storage)

    def values(self, t: object) -> Values | None:
        """The set every element of `t` is drawn from; a Python scalar is its own set."""
        if isinstance(t, (bool, int, float)):
            return frozenset({t})
        if not isinstance(t, torch.Tensor):
            return None
        if t.device.type == "cpu":
            v = _cpu_scalar(t)
            return frozenset({v}) if v is not None else None
        vs = _recall(self._marks, t)
        if vs is None:
            p = self.prog(t)
            if p is None:
                return None
            n = t.shape[p.dim] if t.dim() else 1
            if n == 0 or n > MAX_VALUES:
                return None
            return frozenset(p.start + p.step * i for i in range(n))
        return vs

    def mark_prog(self, t: torch.Tensor, p: Prog) -> None:
        storage = _storage_key(t)
        if storage is None or not _prog_ok(p, t):
            return
        if p.step == 0 or (t.dim() and t.shape[p.dim] == 1):
            self.mark(t, frozenset({p.start}))  # one value
            return
        _remember(self._progs, t, p, storage)

    def prog(self, t: object) -> Prog | None:
        """`t`'s progression (a tensor of one value has none: it is a value set)."""
        if not isinstance(t, torch.Tensor) or t.dtype not in _INT_DTYPES:
            return None
        return _recall(self._progs, t)

    def _written_into(self, t: torch.Tensor, after: Values | None) -> None:
        """`t` was written in place and now holds values from `after` (None: unknown). Other
        views of its storage keep their old values or took some of `after`."""
        key = _storage_key(t)
        for k, (_ref, _p, storage) in list(self._progs.items()):
            if key is None or storage == key:  # a written progression is not followed
                self._progs.pop(k, None)
        for k, (ref, vs, storage) in list(self._marks.items()):
            if key is not None and storage != key:
                continue
            other = ref()
            if other is None or other is t:
                continue
            if after is None or key is None:
                self._marks.pop(k, None)
            else:
                self.mark(other, vs | after)
        if after is None:
            self._marks.pop(id(t), None)
        else:
            self.mark(t, after)

    # -- host copies ------------------------------------------------------------------------
    def host(self, t: object) -> torch.Tensor | None:
        """The CPU tensor holding `t`'s values (a CPU tensor is its own), or None."""
        if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor:
            return None
        if t.device.type == "cpu":
            return t if _small(t) and t.layout == torch.strided else None
        return _recall(self._host, t)

    def _keep_host(self, t: object, h: object) -> None:
        if not (isinstance(t, torch.Tensor) and isinstance(h, torch.Tensor)):
            return
        storage = _storage_key(t)
        # the same layout too: a later as_strided or view reads the copy's storage as the
        # device tensor's
        if (t.device.type == "cpu" or storage is None or h.shape != t.shape
                or h.dtype != t.dtype or not _small(h) or h.stride() != t.stride()
                or h.storage_offset() != t.storage_offset()):
            self._host.pop(id(t), None)
            return
        _remember(self._host, t, h, storage)

    def _on_host(self, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
        """`args` / `kwargs` with every tensor replaced by its host copy and the device by the
        CPU, or None when a tensor has none."""
        missing = False

        def swap(x: Any) -> Any:
            nonlocal missing
            if isinstance(x, torch.Tensor):
                h = self.host(x)
                if h is None:
                    missing = True
                return h
            if isinstance(x, torch.device) and x.type != "cpu":
                return torch.device("cpu")
            if isinstance(x, (list, tuple)):
                return type(x)(swap(v) for v in x)
            return x

        cargs = swap(args)
        ckwargs = {k: (torch.device("cpu") if k == "device" and v is not None else swap(v))
                   for k, v in kwargs.items()}
        return None if missing else (cargs, ckwargs)

    def _follow_host(self, func: Any, packet: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any], out: Any, written: list[torch.Tensor]) -> None:
        """Carry host copies through `func` (already run on the device as `out`)."""
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        if all(x.device.type == "cpu" for x in (written or outs)):
            return  # CPU results hold their values already (and were written once)
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if not self._host and packet not in _OVERWRITES and any(
                x.device.type != "cpu" for x in tensors):
            return  # no host copy yet: only a copy from the host, a fill or a factory starts one
        if packet in _UNSET or torch.Tag.nondeterministic_seeded in func.tags:
            for t in written:
                self._drop_storage(t, None)
            return
        if any(not _small(x) for x in tensors + outs) or not (outs or written):
            for t in written:
                self._drop_storage(t, None)
            return
        if written and packet in _OVERWRITES and len(written) == 1 and self.host(
                written[0]) is None and _whole_storage(written[0]):
            dst = written[0]  # a new host copy, its every element about to be written
            self._keep_host(dst, torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype))
        swapped = self._on_host(args, kwargs)
        if swapped is None:
            for t in written:
                self._drop_storage(t, None)
            return
        try:
            with _NoRecord():
                cout = func(*swapped[0], **swapped[1])
            ran = True
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
            cout, ran = None, False
        for t in written:  # its host copy was written in place: its views' copies are current
            self._drop_storage(t, self.host(t) if ran else None)
        if not ran or written:
            return
        couts = [x for x in tree_leaves(cout) if isinstance(x, torch.Tensor)]
        if len(couts) == len(outs):
            for t, h in zip(outs, couts, strict=True):
                self._keep_host(t, h)

    def _drop_storage(self, t: torch.Tensor, kept: torch.Tensor | None) -> None:
        """`t` was written: host copies of views of its storage stay only where they view the
        host copy `kept` that was written the same way."""
        key = _storage_key(t)
        base = _storage_key(kept) if kept is not None else None
        for k, (_ref, h, storage) in list(self._host.items()):
            if key is None or storage == key:
                if base is None or _storage_key(h) != base:
                    self._host.pop(k, None)

    def _mask_count(self, t: torch.Tensor) -> torch.Tensor | None:
        """The host coordinates of a boolean mask's set elements (its nonzero), or None."""
        h = self.host(t)
        if h is not None:
            with _NoRecord():
                return h.nonzero()
        vs = self.values(t)
        if vs is not None and len(vs) == 1 and _small(t):
            with _NoRecord():  # every element the same: all set or none
                return torch.ones(t.shape, dtype=torch.bool).nonzero() if next(
                    iter(vs)) else torch.empty((0, t.dim()), dtype=torch.long)
        return None

    def _sized_by_host(self, func: Any, packet: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
        """The outputs of an op whose shape depends on values, sized from host copies (None:
        not known; the op runs as it would)."""
        device = next((x.device for x in tree_leaves((args, kwargs))
                       if isinstance(x, torch.Tensor) and x.device.type != "cpu"), None)
        if device is None:
            return None
        swapped = self._on_host(args, kwargs)
        if swapped is not None:
            try:
                with _NoRecord():
                    cout = func(*swapped[0], **swapped[1])
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
                return None

            def to_device(h: Any) -> Any:
                if not isinstance(h, torch.Tensor):
                    return h
                t = torch.empty_strided(h.shape, h.stride(), dtype=h.dtype, device=device)
                self._keep_host(t, h)
                return t

            return tree_map(to_device, cout)
        if packet in _INDEX_OPS and len(args) == 2:
            # x[mask] with a known mask, x not: the mask becomes its coordinates first, as in
            # CUDA's expandTensors (IndexingUtils.h), and the gather runs on them.
            indices: list[Any] = []
            if not any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in args[1]):
                return None
            for i in args[1]:
                if isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES:
                    coords = self._mask_count(i)
                    if coords is None:
                        return None
                    for j in range(i.dim()):
                        col = torch.empty((coords.shape[0],), dtype=torch.long, device=device)
                        self._keep_host(col, coords[:, j].contiguous())
                        indices.append(col)
                else:
                    indices.append(i)
            return func(args[0], indices)
        if packet is aten.masked_select and len(args) == 2:
            mask = args[1]
            shape = torch.broadcast_shapes(args[0].shape, mask.shape)
            coords = self._mask_count(mask)
            if coords is None:
                return None
            count = coords.shape[0] * math.prod(shape) // max(1, mask.numel())
            return torch.empty((count,), dtype=args[0].dtype, device=device)
        return None

    # -- the mode -------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense and args[0].device.type != "cpu":
            # (a CPU tensor, such as an optimizer's step count, has its value: torch reads it)
            h = self.host(args[0])
            if h is not None:
                self.answered += 1
                with _NoRecord():
                    return h.item()
            vs = self.values(args[0])
            if vs is not None and len(vs) == 1:
                self.answered += 1
                return next(iter(vs))
        if torch.Tag.dynamic_output_shape in func.tags:
            sized = self._sized_by_host(func, packet, args, kwargs)
            if sized is not None:
                self.sized += 1
                return sized
        written = _written(func, args, kwargs)
        try:
            result = self._result_values(func, packet, args, kwargs)
        except (TypeError, ValueError, ArithmeticError, IndexError):
            result = None  # a rule that does not fit this call: unknown, never an error
        out = func(*args, **kwargs)
        self._follow_host(func, packet, args, kwargs, out, written)
        if written:
            for i, t in enumerate(written):
                # max / min out=(values, indices): only the values are known
                indices = i > 0 and packet in (aten.max, aten.min)
                self._written_into(t, None if indices else result)
            return out
        # A progression keeps more than its value set; one comes only from arange or another.
        if isinstance(out, torch.Tensor) and (self._progs or packet is aten.arange):
            try:
                p = self._prog_result(packet, args, kwargs, out)
            except (TypeError, ValueError, ArithmeticError, IndexError):
                p = None
            if p is not None:
                self.mark_prog(out, p)
                return out
        if result is not None:
            targets = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if packet in (aten.max, aten.min) and isinstance(out, tuple):
                targets = targets[:1]  # (values, indices): only the values are known
            for t in targets:
                self.mark(t, result)
        return out

    def _result_values(self, func: Any, packet: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Values | None:
        """The set `func`'s output (or the tensor it writes) takes its elements from."""
        if packet in _FACTORY_VALUE:
            return frozenset({_FACTORY_VALUE[packet]})
        if packet in _FILL_ARG:
            i = _FILL_ARG[packet]
            v = args[i] if len(args) > i else kwargs.get("fill_value", kwargs.get("value"))
            return self.values(v)
        if packet is aten.copy_:
            return self.values(args[1])
        if packet is aten.constant_pad_nd:
            pad_value = args[2] if len(args) > 2 else kwargs.get("value", 0)
            src, pad = self.values(args[0]), self.values(pad_value)
            return src | pad if src is not None and pad is not None else None
        if packet in _SAME_VALUES:
            if func._overloadname == "dtype":  # view(dtype): the same bits, other values
                return None
            return self.values(args[0])
        if packet in (aten.cat, aten.stack):
            tensors = args[0] if args else kwargs.get("tensors", [])
            sets = [self.values(t) for t in tensors]
            if not sets or any(s is None for s in sets):
                return None
            return frozenset().union(*sets)
        if packet is aten.cumsum:  # running sums of zeros (or False) are zeros
            vs = self.values(args[0])
            return frozenset({0}) if vs is not None and all(v == 0 for v in vs) else None
        if packet in _REDUCTIONS:
            src = args[0] if args else None
            vs = self.values(src)
            if vs is None or not isinstance(src, torch.Tensor):
                return None
            return self._reduction(packet, src, vs, args, kwargs)
        if packet is aten.where and len(args) == 3:
            cond, a, b = (self.values(x) for x in args)
            return _select(cond, a, b)
        if packet in (aten.masked_fill, aten.masked_fill_) and len(args) == 3:
            base, mask, fill = (self.values(x) for x in args)
            return _select(mask, fill, base)
        if packet is aten.index_put_ and len(args) >= 3:
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            base, new = self.values(args[0]), self.values(args[2])
            index = args[1]
            if (base is not None and len(index) == 1 and isinstance(index[0], torch.Tensor)
                    and index[0].dtype == torch.bool and self.values(index[0]) == {False}):
                return base  # x[mask] = v with a mask known all-False writes nothing
            if accumulate or base is None or new is None:
                return None
            return base | new
        rule_packet = _ELEMENTWISE_INPLACE.get(packet, packet)
        rule = _ELEMENTWISE.get(rule_packet)
        if rule is None or kwargs or len(args) != (1 if rule_packet in _UNARY else 2):
            return None  # alpha= (add / sub / rsub .Scalar take it positionally) and the like
        sets = [self.values(a) for a in args]
        if any(s is None for s in sets):
            return None
        # The dtype the op computes in is one of these or wider: the operands must be the same
        # numbers in all of them (a Python float meets a float tensor as the default dtype).
        dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
        if any(isinstance(a, float) for a in args):
            dtypes.add(torch.get_default_dtype())
        if not all(_exact_in(s, dtypes) for s in sets):  # type: ignore[arg-type]
            return None
        combos = math.prod(len(s) for s in sets)  # type: ignore[arg-type]
        if combos > MAX_VALUES * MAX_VALUES:
            return None
        return frozenset(rule(list(c)) for c in itertools.product(*sets))  # type: ignore[arg-type]

    def _one(self, x: object) -> int | None:
        """The single integer every element of `x` is (a Python int or a one-value tensor)."""
        if isinstance(x, bool):
            return None
        vs = self.values(x)
        if vs is None or len(vs) != 1:
            return None
        (v,) = vs
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def _prog_result(self, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     out: torch.Tensor) -> Prog | None:
        """`out`'s progression, where `packet` maps progressions to one."""
        if out.dtype not in _INT_DTYPES:
            return None
        if packet is aten.arange:
            nums = [a for a in args if not isinstance(a, torch.Tensor)]
            if kwargs.get("out") is not None or not all(
                    isinstance(a, int) and not isinstance(a, bool) for a in nums):
                return None
            start = nums[0] if len(nums) >= 2 else 0
            step = nums[2] if len(nums) >= 3 else kwargs.get("step", 1)
            return Prog(start, step, 0) if isinstance(step, int) else None
        src = args[0] if args else None
        p = self.prog(src)
        if packet in _PROG_VIEWS or (packet is aten._to_copy and not kwargs.get("memory_format")):
            return p if p is not None and isinstance(src, torch.Tensor) else None
        if packet is aten.unsqueeze and p is not None:
            d = args[1] if args[1] >= 0 else args[1] + src.dim() + 1
            return p._replace(dim=p.dim + (1 if d <= p.dim else 0))
        if packet is aten.expand and p is not None:
            shift = out.dim() - src.dim()
            return p._replace(dim=p.dim + shift) if src.shape[p.dim] == out.shape[
                p.dim + shift] else None
        if packet in (aten.slice, aten.narrow) and p is not None:
            d = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            d = d + src.dim() if d < 0 else d
            n = src.shape[d]
            if packet is aten.narrow:
                begin, step = _norm_index(args[2], n, 0), 1
            else:
                begin = _norm_index(args[2] if len(args) > 2 else kwargs.get("start"), n, 0)
                step = args[4] if len(args) > 4 else kwargs.get("step", 1)
            if d != p.dim:
                return p
            return Prog(p.start + p.step * begin, p.step * step, p.dim)
        if packet is aten.select and p is not None:
            d = args[1] + src.dim() if args[1] < 0 else args[1]
            i = args[2] + src.shape[d] if args[2] < 0 else args[2]
            if d == p.dim:
                return Prog(p.start + p.step * i, 0, 0)
            return p._replace(dim=p.dim - (1 if d < p.dim else 0))
        if packet is aten.cat:
            return self._prog_cat(args, kwargs, out)
        if packet in (aten.amax, aten.amin, aten.max, aten.min) and p is not None and len(
                args) == 1 and not kwargs and src.numel() > 0:
            last = p.start + p.step * (src.shape[p.dim] - 1)
            high = packet in (aten.amax, aten.max)
            return Prog(max(p.start, last) if high else min(p.start, last), 0, 0)
        if packet in (aten.add, aten.sub, aten.mul, aten.rsub) and len(args) == 2 and not (
                kwargs):
            return self._prog_arith(packet, args[0], args[1], out)
        return None

    def _prog_of(self, x: object, out: torch.Tensor) -> Prog | None:
        """`x` as a progression aligned with `out`'s dimensions (broadcast from the right)."""
        if isinstance(x, torch.Tensor):
            p = self.prog(x)
            if p is not None:
                return p._replace(dim=p.dim + out.dim() - x.dim())
        v = self._one(x)
        return None if v is None else Prog(v, 0, -1)  # one value: any dimension

    def _prog_arith(self, packet: Any, a: object, b: object, out: torch.Tensor) -> Prog | None:
        pa, pb = self._prog_of(a, out), self._prog_of(b, out)
        if pa is None or pb is None or (pa.step == 0 and pb.step == 0):
            return None  # two single values: the value-set rules did it
        if pa.dim >= 0 and pb.dim >= 0 and pa.dim != pb.dim:
            return None
        if pa.dim >= 0 and pb.dim >= 0 and (not isinstance(a, torch.Tensor) or not isinstance(
                b, torch.Tensor) or a.shape[pa.dim - out.dim() + a.dim()] != b.shape[
                    pb.dim - out.dim() + b.dim()]):
            return None
        dim = max(pa.dim, pb.dim)
        if packet is aten.rsub:
            pa, pb = pb, pa
            packet = aten.sub
        if packet is aten.add:
            return Prog(pa.start + pb.start, pa.step + pb.step, dim)
        if packet is aten.sub:
            return Prog(pa.start - pb.start, pa.step - pb.step, dim)
        if pa.step and pb.step:
            return None  # a product of two progressions is not one
        c, p = (pa.start, pb) if pa.step == 0 else (pb.start, pa)
        return Prog(p.start * c, p.step * c, dim)

    def _prog_cat(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                  out: torch.Tensor) -> Prog | None:
        """Pieces that continue one progression along the cat dimension: each piece is a
        progression along that dimension or one value one element thick there."""
        tensors = args[0] if args else kwargs.get("tensors", [])
        d = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        d = d + out.dim() if d < 0 else d
        pieces = [t for t in tensors if isinstance(t, torch.Tensor) and t.numel() > 0]
        if not pieces or any(t.dim() != out.dim() for t in pieces):
            return None
        spans = []  # (first value, step or None for one value, length along d)
        for t in pieces:
            p = self.prog(t)
            if p is not None:
                if p.dim != d:  # it varies along another dimension
                    return None
                spans.append((p.start, p.step, t.shape[d]))
                continue
            v = self._one(t)
            if v is None or t.shape[d] != 1:
                return None
            spans.append((v, None, 1))
        steps = {step for _, step, _ in spans if step is not None}
        if len(steps) != 1:
            return None
        (step,) = steps
        start, at = spans[0][0], 0
        for first, _, n in spans:
            if first != start + step * at:
                return None
            at += n
        return Prog(start, step, d)

    @staticmethod
    def _reduction(packet: Any, src: torch.Tensor, vs: Values, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Values | None:
        dims: Any = args[1] if len(args) > 1 else kwargs.get("dim")
        if isinstance(dims, (bool, torch.Tensor)):  # max(a, b) / min(a, b): element-wise
            return None
        if isinstance(dims, (list, tuple)) and len(dims) == 0:
            if packet not in (aten.sum, aten.mean, aten.amax, aten.amin):
                return None  # all(dim=()) and the like: not followed
            dims = None  # sum / mean / amax / amin over dim=[]: every element
        if dims is None:
            count = src.numel()
        else:
            dims = [dims] if isinstance(dims, int) else list(dims)
            count = 1
            for d in dims:
                count *= src.shape[d] if src.dim() else 1
        out_dtype = kwargs.get("dtype") or src.dtype
        return _reduce(packet, vs, count, (src.dtype, out_dtype))
