"""CUDA autocast for meta tensors.

``torch.autocast("cuda")`` only acts on CUDA tensors (its kernels sit behind the
``AutocastCUDA`` dispatch key, which meta tensors do not carry) and
``torch.autocast("meta")`` is refused, so a dry run on the meta device would
trace a mixed-precision model as if it ran in float32.  :func:`meta_autocast`
reproduces CUDA autocast's op policy with a :class:`~torch.overrides.TorchFunctionMode`:

* it sits above autograd, like the real ``Autocast`` key, so its casts
  (``aten::_to_copy``) are recorded by autograd and differentiated;
* it follows the op lists of ``aten/src/ATen/autocast_mode.h`` /
  ``autocast_mode.cpp`` (``TORCH_LIBRARY_IMPL(aten, Autocast, m)``, torch 2.14.1)
  and ``aten/src/ATen/cudnn/AutocastRNN.cpp``;
* casts of float32 leaf tensors that require grad (the weights) are cached for
  the lifetime of the outermost autocast region, as ``cached_cast`` does;
* it sets the real thread-local CUDA autocast state (``torch.is_autocast_enabled("cuda")``,
  ``torch.get_autocast_dtype("cuda")``), so model code that inspects it takes
  the same branch as on a GPU, and a nested ``torch.autocast("cuda", enabled=False)``
  in the model switches the casting off, exactly as on a GPU.

Real autocast sees aten ops; a function mode sees Python API calls.  Builtin
(C++-bound) functions carry their aten op's name, so the policy table is keyed by
aten op name.  Python-level torch functions (``torch.nn.functional.*``,
``torch.functional.*``, Python ``Tensor`` methods) are run *transparently*: their
body runs with the mode still active, so the builtins they call are seen and
handled (``nn.MultiheadAttention`` → ``multi_head_attention_forward`` →
``linear``/``bmm``/``softmax``/``scaled_dot_product_attention``).  C++ composite ops
(``CompositeImplicitAutograd``) whose *inner* calls hit the lists are invisible
to a function mode; the ones that matter are listed in ``_DERIVED_OPS``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from types import FunctionType, TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from blink.errors import ConfigError, TraceError

__all__ = ["MetaAutocast", "autocast_policy", "meta_autocast"]

# Cast kinds.  The first three are CastPolicy values of autocast_mode.h.
_LOWER = "lower"  # CastPolicy::lower_precision_fp
_FP32 = "fp32"  # CastPolicy::fp32
_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # CastPolicy::fp32_set_opt_dtype
_APPEND_DTYPE = "fp32_append_dtype"  # CastPolicy::fp32_append_dtype
_PROMOTE = "promote"  # CastPolicy::promote
_RNN = "cudnn_rnn"  # AutocastRNN.cpp: _cudnn_rnn_cast_reflatten
_BANNED = "banned"  # autocast_mode.cpp: binary_cross_entropy_banned

# AT_FORALL_LOWER_PRECISION_FP (autocast_mode.h) plus the two CUDA-only
# registrations of autocast_mode.cpp (cudnn_convolution, cudnn_convolution_transpose).
_LOWER_PRECISION_OPS = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv",
    "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)  # fmt: skip

# AT_FORALL_FP32 (autocast_mode.h).
_FP32_OPS = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm",
    "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
    "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)  # fmt: skip

# AT_FORALL_FP32_SET_OPT_DTYPE (autocast_mode.h): not cast; an unset dtype= becomes float32.
_FP32_SET_OPT_DTYPE_OPS = (
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "sum",
)  # fmt: skip

# AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE (autocast_mode.h): norm.Scalar and
# norm.ScalarOpt_dim are redispatched with dtype=float32 appended.
_FP32_APPEND_DTYPE_OPS = ("norm",)

# AT_FORALL_PROMOTE (autocast_mode.h).  cat and stack were on this list in torch 1.x;
# in 2.x they are not (their kernels promote mixed dtypes themselves, with no cast op).
_PROMOTE_OPS = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip

# Blink's additions: CompositeImplicitAutograd ops (so not registered with autocast)
# whose decomposition calls a listed op.  On a GPU autocast catches the inner call;
# a function mode cannot see it, so the policy the inner call gets is applied to
# the composite.  Where this differs from CUDA it is said here.
_DERIVED_OPS: dict[str, str] = {
    "linalg_matmul": _LOWER,  # alias of matmul
    "matrix_power": _LOWER,  # -> matmul (exponents 0 and 1 are left alone)
    "linalg_matrix_power": _LOWER,
    "square": _FP32,  # -> pow.Tensor_Scalar
    "arccos": _FP32,  # aliases
    "arcsin": _FP32,
    "special_expm1": _FP32,
    "special_log1p": _FP32,
    "special_erfinv": _FP32,
    "special_logsumexp": _FP32,
    # -> log_softmax(dtype=float32) + nll_loss: same ops as casting the input first.
    "cross_entropy_loss": _FP32,
    "nll_loss_nd": _FP32,  # F.nll_loss -> nll_loss / nll_loss2d
    # -> sub, add, norm.ScalarOpt_dim (append dtype).  On CUDA sub/add stay in the
    # input dtype and only norm reads float32; here the inputs are cast first
    # (same output dtype, two extra casts).
    "pairwise_distance": _FP32,
    "special_softmax": _SET_OPT_DTYPE,
    "special_log_softmax": _SET_OPT_DTYPE,
    "linalg_norm": _SET_OPT_DTYPE,  # -> linalg_vector_norm / linalg_matrix_norm
    "arctan2": _PROMOTE,  # alias of atan2
    "inner": _PROMOTE,  # -> tensordot
}

# _VF.lstm / gru / rnn_tanh / rnn_relu reach _cudnn_rnn on a GPU, whose autocast
# wrapper (AutocastRNN.cpp) casts input, hx, cx and a flat copy of the weights to
# float16 -- float16 even under bfloat16 autocast.
_RNN_OPS = ("lstm", "gru", "rnn_tanh", "rnn_relu")

_KIND: dict[str, str] = {
    **{name: _LOWER for name in _LOWER_PRECISION_OPS},
    **{name: _FP32 for name in _FP32_OPS},
    **{name: _SET_OPT_DTYPE for name in _FP32_SET_OPT_DTYPE_OPS},
    **{name: _APPEND_DTYPE for name in _FP32_APPEND_DTYPE_OPS},
    **{name: _PROMOTE for name in _PROMOTE_OPS},
    **_DERIVED_OPS,
    **{name: _RNN for name in _RNN_OPS},
    "binary_cross_entropy": _BANNED,
}

_PUBLIC_POLICY = {
    _LOWER: "lower",
    _RNN: "lower",
    _FP32: "fp32",
    _SET_OPT_DTYPE: "fp32",
    _APPEND_DTYPE: "fp32",
    _PROMOTE: "promote",
}

# Python API names that differ from the aten op they reach (for autocast_policy only:
# the mode itself sees the builtin each of these calls).
_PYTHON_ALIASES = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "cross_entropy": "cross_entropy_loss",
    "grid_sample": "grid_sampler",
    "softmin": "softmax",
}

# Ops whose Python binding takes dtype positionally (softmax(input, dim, dtype));
# every other op of the set-dtype kinds takes it as keyword-only.
_DTYPE_POSITION = {"softmax": 2, "log_softmax": 2, "special_softmax": 2, "special_log_softmax": 2}

# The autograd entry points: autocast does not apply to the backward pass, so these
# run with the mode switched off (see MetaAutocast's docstring).
_OPAQUE: frozenset[Callable[..., Any]] = frozenset(
    {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
)

# The names by which torch's Python functions test for __torch_function__ overrides.
_GUARDS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")

# The device types CUDA autocast casts (is_autocast_eligible: is_cuda() || is_xla()),
# plus meta, which stands in for cuda in a dry run.
_ELIGIBLE_DEVICES = frozenset({"cuda", "meta"})

_BCE_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast; "
    "CUDA autocast raises here. Combine the sigmoid and the loss with "
    "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
    "which are safe to autocast."
)


def autocast_policy(name: str) -> str | None:
    """CUDA autocast's policy for an op: "lower", "fp32", "promote" or None.

    ``name`` is an aten op name (``"mm"``, ``"aten::softmax.int"``) or a Python
    API name (``"torch.nn.functional.linear"``, ``"Tensor.matmul"``); overloads are
    not told apart except that ``out=`` overloads, which autocast never touches,
    give None.  "fp32" covers ops cast to float32 and ops whose output dtype is
    set to float32 (softmax, sum, ...).  ``binary_cross_entropy``, which CUDA
    autocast refuses, gives None.
    """
    op = name.strip()
    if op.startswith("aten::"):
        op, _, overload = op[len("aten::") :].partition(".")
        if overload == "out" or overload.endswith("_out"):
            return None
    else:
        op = op.rpartition(".")[2]
        op = _PYTHON_ALIASES.get(op, op)
    kind = _KIND.get(op)
    return None if kind is None else _PUBLIC_POLICY.get(kind)


def meta_autocast(
    dtype: torch.dtype = torch.bfloat16, enabled: bool = True, *, cache_enabled: bool = True
) -> MetaAutocast:
    """A context manager that applies CUDA autocast's policy to meta (and CUDA) tensors.

    ``with meta_autocast(torch.bfloat16): loss = model(x)`` traces the ops that
    ``with torch.autocast("cuda", dtype=torch.bfloat16)`` would run on a GPU.
    """
    return MetaAutocast(dtype, enabled, cache_enabled=cache_enabled)


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.mode: _AutocastMode | None = None
        self.depth = 0
        # (id(source), dtype) -> (weakref to source, cast copy); cached_cast's cache.
        self.cache: dict[
            tuple[int, torch.dtype], tuple[weakref.ref[torch.Tensor], torch.Tensor]
        ] = {}


_state = _ThreadState()


class MetaAutocast:
    """``torch.autocast("cuda")`` for dry runs; see :func:`meta_autocast`.

    On entry it sets the thread's CUDA autocast state as ``torch.autocast`` does
    (enabled flag, dtype, cache flag, nesting count) and, in the outermost region
    of the thread, pushes the function mode that does the casting.  The mode reads
    the CUDA autocast state for every op, so regions nest with each other and with
    ``torch.autocast("cuda", ...)``.  On a host without CUDA, ``torch.autocast("cuda")``
    always turns itself off (with a warning when asked for ``enabled=True``), so
    inside such a region nothing is cast.

    The backward pass is left alone: ``Tensor.backward``, ``torch.autograd.backward``
    and ``torch.autograd.grad`` run with the mode off, and autograd's C++ backward
    nodes are never seen by a function mode.  (On a GPU, autocast is still enabled
    in backward ops when ``backward()`` is called inside the region; the lists make
    that a no-op for the backward formulas, whose inputs are already in the dtypes
    the forward casts produced.)
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.bfloat16,
        enabled: bool = True,
        *,
        cache_enabled: bool = True,
    ) -> None:
        if dtype not in (torch.bfloat16, torch.float16):
            raise ConfigError(
                f"meta_autocast dtype must be torch.bfloat16 or torch.float16, got {dtype}"
            )
        self.dtype = dtype
        self.enabled = bool(enabled)
        self.cache_enabled = bool(cache_enabled)
        self._saved: tuple[bool, torch.dtype, bool] | None = None
        self._mode: _AutocastMode | None = None

    def __enter__(self) -> MetaAutocast:
        if self._saved is not None:
            raise ConfigError("a meta_autocast region cannot be entered twice at once")
        self._saved = (
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
            torch.is_autocast_cache_enabled(),
        )
        torch.set_autocast_enabled("cuda", self.enabled)
        torch.set_autocast_dtype("cuda", self.dtype)
        torch.set_autocast_cache_enabled(self.cache_enabled)
        torch.autocast_increment_nesting()
        _state.depth += 1
        if _state.mode is None:
            self._mode = _AutocastMode()
            self._mode.__enter__()
            _state.mode = self._mode
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        saved = self._saved
        if saved is None:
            return
        self._saved = None
        try:
            mode = self._mode
            if mode is not None:
                self._mode = None
                _state.mode = None
                mode.__exit__(exc_type, exc, tb)
        finally:
            _state.depth -= 1
            # torch.autocast drops autocast's own cache when the nesting count
            # returns to 0; ours goes with the outermost meta_autocast region.
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            if _state.depth == 0:
                _state.cache.clear()
            torch.set_autocast_enabled("cuda", saved[0])
            torch.set_autocast_dtype("cuda", saved[1])
            torch.set_autocast_cache_enabled(saved[2])


class _AutocastMode(TorchFunctionMode):
    """The function mode behind :class:`MetaAutocast`."""

    def __init__(self) -> None:
        super().__init__()
        self._running: list[FunctionType] = []  # Python functions run transparently

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if not torch.is_autocast_enabled("cuda"):
            return func(*args, **kwargs)
        if isinstance(func, FunctionType):
            return self._run_python(func, args, kwargs)
        name = getattr(func, "__name__", "")
        kind = _KIND.get(name)
        # Autocast registers out-of-place overloads only; out= variants pass through.
        if kind is None or kwargs.get("out") is not None:
            return func(*args, **kwargs)
        return _apply(kind, name, func, args, kwargs, torch.get_autocast_dtype("cuda"))

    def _run_python(self, func: FunctionType, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a Python-level torch function with this mode active inside it.

        Such functions begin with ``if has_torch_function(...): return
        handle_torch_function(...)``, which is how the mode got the call.  A copy of
        the function whose globals answer False to that test runs the body with the
        mode pushed again, so the builtins it calls come back here.  A function that
        reaches the test another way comes back here with itself; it then runs
        opaquely, as does anything in _OPAQUE.
        """
        globals_ = func.__globals__
        if func in _OPAQUE or func in self._running or not any(g in globals_ for g in _GUARDS):
            return func(*args, **kwargs)
        shimmed = dict(globals_)
        for guard in _GUARDS:
            if guard in shimmed:
                shimmed[guard] = _no_override
        body = FunctionType(
            func.__code__, shimmed, func.__name__, func.__defaults__, func.__closure__
        )
        body.__kwdefaults__ = func.__kwdefaults__
        self._running.append(func)
        try:
            with self:
                return body(*args, **kwargs)
        finally:
            self._running.pop()


def _no_override(*args: Any) -> bool:
    return False


def _device_ok(t: torch.Tensor) -> bool:
    return t.device.type in _ELIGIBLE_DEVICES


def _eligible(value: object) -> bool:
    """is_eligible of autocast_mode.h: a floating, non-double tensor on the GPU."""
    return (
        isinstance(value, torch.Tensor)
        and _device_ok(value)
        and value.is_floating_point()
        and value.dtype is not torch.float64
    )


def _cached_cast(value: Any, to: torch.dtype, lower: torch.dtype) -> Any:
    """cached_cast of autocast_mode.cpp, for one argument (tensors in lists included)."""
    if type(value) in (list, tuple):
        if not any(isinstance(v, torch.Tensor) for v in value):
            return value
        return type(value)(_cached_cast(v, to, lower) for v in value)
    if not _eligible(value) or value.dtype == to:
        return value
    if (
        to == lower
        and value.dtype is torch.float32
        and value.requires_grad
        and value.is_leaf
        and not value._is_view()
        and torch.is_autocast_cache_enabled()
    ):
        # CUDA keys its cache by TensorImpl alone, so a nested region with the other
        # lower dtype gets the outer region's cast (and then a dtype mismatch on the
        # GPU).  Keying by dtype as well gives what the nested region asks for.
        key = (id(value), to)
        hit = _state.cache.get(key)
        if hit is not None and hit[0]() is value:
            return hit[1]
        cast = value.to(to)
        _state.cache[key] = (weakref.ref(value), cast)
        return cast
    return value.to(to)


def _tensors(values: Any) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) in (list, tuple):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _promote_type(name: str, lower: torch.dtype, values: Any) -> torch.dtype:
    """promote_type / prioritize of autocast_mode.h."""
    current = lower
    for t in _tensors(values):
        if not (_device_ok(t) and t.is_floating_point()) or t.dtype is torch.float64:
            continue
        if current is torch.float32 or t.dtype is torch.float32:
            current = torch.float32
        elif t.dtype != lower:
            # e.g. a float16 input under bfloat16 autocast: CUDA fails the same way.
            raise TraceError(
                f"CUDA autocast ({lower}) cannot promote a {t.dtype} input of {name}: "
                "Unexpected floating ScalarType in at::autocast::prioritize",
                op=f"aten::{name}",
            )
    return current


def _apply(
    kind: str,
    name: str,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    lower: torch.dtype,
) -> Any:
    if kind == _LOWER:
        if name in ("matrix_power", "linalg_matrix_power") and _exponent(args, kwargs) in (0, 1):
            return func(*args, **kwargs)  # clone / identity: no matmul, nothing cast
        return _call_cast(func, args, kwargs, lower, lower)
    if kind == _FP32:
        return _call_cast(func, args, kwargs, torch.float32, lower)
    if kind == _PROMOTE:
        to = _promote_type(name, lower, (*args, *kwargs.values()))
        return _call_cast(func, args, kwargs, to, lower)
    if kind in (_SET_OPT_DTYPE, _APPEND_DTYPE):
        return _call_float_dtype(kind, name, func, args, kwargs)
    if kind == _RNN:
        return _call_rnn(func, args, kwargs, lower)
    if kind == _BANNED:
        if any(_device_ok(t) for t in _tensors((*args, *kwargs.values()))):
            raise TraceError(_BCE_MESSAGE, op=f"aten::{name}")
        return func(*args, **kwargs)
    raise AssertionError(f"unknown autocast kind {kind!r}")  # pragma: no cover


def _call_cast(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    to: torch.dtype,
    lower: torch.dtype,
) -> Any:
    args = tuple(_cached_cast(a, to, lower) for a in args)
    kwargs = {k: _cached_cast(v, to, lower) for k, v in kwargs.items()}
    return func(*args, **kwargs)


def _call_float_dtype(
    kind: str, name: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """fp32_set_opt_dtype / fp32_append_dtype: an unset output dtype becomes float32.

    Nothing is cast: the op converts internally.  Only an eligible first argument
    triggers it (a float64 or integer input keeps its type).
    """
    if not args or not _eligible(args[0]):
        return func(*args, **kwargs)
    position = _DTYPE_POSITION.get(name)
    if position is not None and len(args) > position:
        if args[position] is not None:
            return func(*args, **kwargs)  # an explicit dtype is respected
        args = (*args[:position], torch.float32, *args[position + 1 :])
    elif kwargs.get("dtype") is not None:
        return func(*args, **kwargs)
    else:
        if kind == _APPEND_DTYPE and len(args) < 2 and "p" not in kwargs:
            args = (args[0], 2)  # norm.Scalar's default p; the dtype overloads require p
        kwargs = {**kwargs, "dtype": torch.float32}
    if name in ("softmax", "log_softmax") and args[0].dtype is torch.float16:
        # SoftMax.cpp: a CUDA float16 input with dtype=float32 runs the fused
        # half_to_float kernel, with no cast.  Meta would take the cast path.
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if isinstance(dim, int):
            fused = torch._softmax if name == "softmax" else torch._log_softmax
            return fused(args[0], dim, True)
    return func(*args, **kwargs)


def _call_rnn(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], lower: torch.dtype
) -> Any:
    """_cudnn_rnn_cast_reflatten of AutocastRNN.cpp (float16 regardless of autocast dtype).

    ``_VF.lstm(input, hx, params, ...)`` or, packed, ``_VF.lstm(data, batch_sizes, hx,
    params, ...)`` (gru, rnn_tanh and rnn_relu alike).  Without cuDNN the GPU runs the
    native RNN, whose inner linear calls are autocast to the region's dtype instead.
    """
    to = torch.float16 if torch.backends.cudnn.enabled else lower
    packed = isinstance(args[1], torch.Tensor) and not args[1].is_floating_point()
    where = 3 if packed else 2
    cast = [a if i == where else _cached_cast(a, to, lower) for i, a in enumerate(args)]
    params = args[where] if len(args) > where else None
    if isinstance(params, (list, tuple)) and params and _eligible(params[0]):
        if params[0].dtype != to:
            # The weights are copied into one flat buffer per call: cast, not cached.
            cast[where] = [w.to(to) if _eligible(w) else w for w in params]
    return func(*cast, **kwargs)


def _exponent(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("n")
