"""CUDA paths the meta dry run does not take, and how a trace is steered onto them.

Each rule mirrors one dispatch decision PyTorch's CUDA backend makes and the meta device cannot
(its test is ``input.is_cuda()``), and is installed only while a ``blink.trace`` runs:

* RNNs (``aten::lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu``, RNN.cpp): where
  ``at::cudnn_is_acceptable(input)`` holds (cuDNN on; float32, float16 or float64 input with
  elements), CUDA runs ``_cudnn_impl`` (cudnn/RNN.cpp): one ``aten::_cudnn_rnn`` over the whole
  sequence, and ``aten::_cudnn_rnn_backward`` in training. Meta would run the native cell loop
  (addmm + gate ops per timestep). ``_cudnn_rnn`` here allocates what the cuDNN path allocates:
  the reserve space (training) and, when the weights are not one flat buffer, the flat weight
  copy cuDNN needs (``_cudnn_rnn`` copies them on every call, as CUDA does).
* Dropout (``aten::dropout``, Dropout.cpp): in training with 0 < p < 1 CUDA runs the fused
  ``native_dropout`` kernel (a bool mask), backward ``native_dropout_backward``; meta would run
  bernoulli_ + div_ + mul with a float mask.
* Batch norm (``aten::_batch_norm_impl_index``, Normalization.cpp): where its ``use_cudnn``
  conditions hold CUDA calls ``cudnn_batch_norm`` (and ``cudnn_batch_norm_backward``).
* Autocast in the traced code: ``torch.autocast("cuda", ...)`` (and ``"meta"``, what
  ``x.device.type`` says in a dry run) becomes :func:`blink.autocast.meta_autocast`;
  ``torch.is_autocast_enabled("meta")`` / ``torch.get_autocast_dtype("meta")`` answer for CUDA.
* ``device="cuda"`` in the traced code: factory calls, ``Tensor.cuda()`` / ``.to("cuda")`` and
  ``Module.cuda()`` are given the meta device instead (the dry run stands in for the GPU).
* ``nn.MultiheadAttention``'s inference fast path (activation.py): it calls
  ``torch._native_multi_head_attention`` only for tensors on cpu / cuda (``_check_arg_device``),
  so on meta it took the slow path, whose in-projection of the transposed (L, N, E) input is a
  bmm over L batches of N-row GEMMs. CUDA's kernel (``native_multi_head_attention_cuda``,
  aten/src/ATen/native/transformers/cuda/attention.cu) is mirrored with the ops it runs
  (:func:`_native_mha_cuda`). ``nn.TransformerEncoderLayer``'s own fast path is left to its
  slow path, which runs the same kernels around this attention (add, layer norm, linear).

* ``masked_fill`` with a 0-dim CPU tensor as the value: CUDA reads it as a scalar
  (``masked_fill__cuda``, cuda/Indexing.cu), the meta kernel refuses a value on another device.
* ``torch._grouped_mm`` (MoE experts): CUDA takes float32, float16 and bfloat16
  (``_grouped_mm_validate_inputs``, aten/src/ATen/native/GroupedMMUtils.h; the non-bf16 ones run
  its per-group fallback, pytorch#162059), while the meta kernel of torch 2.14 refuses all but
  bf16 (and fp16 with cuBLASLt's grouped GEMM). The meta kernel here checks what CUDA checks
  and gives the output ``create_grouped_gemm_output_tensor``'s shape and 16-byte-padded
  strides.

Where cuDNN is not acceptable (bf16, cuDNN off) a meta LSTM runs the native loop as CUDA
does it (two matmuls and one fused ``_thnn_fused_lstm_cell`` per step); other ops whose rule
fails keep the behaviour PyTorch gives them off CUDA (``torch._decomp``'s RNN decompositions).
"""
from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["install", "cudnn_rnn_reserve_bytes", "RNN_MODES"]

_aten = torch.ops.aten


class _OverrideLibrary(torch.library.Library):
    """An ``aten`` IMPL library whose kernels replace those already registered, Python ones
    included. Overriding is the point of every rule here, but torch 2.11's ``Library.impl``
    refuses to replace a kernel that torch itself registered from Python (the meta kernels of
    ``convolution``, ``_cudnn_rnn``, ``_grouped_mm``, ``masked_fill``) unless
    ``allow_override=True``, its default only in later releases; torch <= 2.11 also warns
    "Overriding a previously registered kernel" on every override."""

    def __init__(self) -> None:
        super().__init__("aten", "IMPL")
        # keys torch's record of Python kernels (torch.library._impls, "ns/op/key") held before
        # this library replaced them: torch's own kernels', which _destroy and the library's
        # finalizer would take out of it along with this library's keys
        self._replaced: set[str] = set()

    def impl(self, op_name: Any, fn: Callable[..., Any], dispatch_key: str = "", *,
             with_keyset: bool = False, allow_override: bool = True) -> None:
        key = f"{self.ns}/{str(op_name).split('::')[-1]}/{dispatch_key}"
        if key in getattr(torch.library, "_impls", ()):
            self._replaced.add(key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            super().impl(op_name, fn, dispatch_key, with_keyset=with_keyset,
                         allow_override=allow_override)

    def _destroy(self) -> None:
        self._op_impls.difference_update(self._replaced)
        super()._destroy()


def override_library() -> torch.library.Library:
    """A fresh ``aten`` IMPL library for overriding kernels during a trace (its ``_destroy``
    puts the previous kernels back, and torch's record of them)."""
    return _OverrideLibrary()


# cudnnRNNMode_t values, as RNN.cpp passes them to _cudnn_rnn (mode), with their gate counts.
RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
_GATES = {0: 1, 1: 1, 2: 4, 3: 3}
# Activations cuDNN keeps per (layer, direction, timestep, batch row, hidden unit) in the
# training reserve space for the backward pass: the gate activations, plus the cell state and
# the hidden output for an LSTM, the reset-gated recurrent term and the output for a GRU, the
# output for a plain RNN. (cudnnGetRNNTempSpaceSizes reports it; cuDNN does not document the
# layout. This is the minimum the backward recurrences read.)
_RESERVE_PER_UNIT = {0: 2, 1: 2, 2: 6, 3: 5}


def _cudnn_acceptable(t: torch.Tensor) -> bool:
    """at::native::cudnn_is_acceptable (TensorProperties.cpp), with meta standing in for CUDA."""
    return (torch.backends.cudnn.enabled and t.device.type == "meta"
            and t.dtype in (torch.float32, torch.float16, torch.float64) and t.numel() > 0)


def cudnn_rnn_reserve_bytes(mode: int, seq_len: int, batch: int, hidden: int, num_layers: int,
                            bidirectional: bool, itemsize: int) -> int:
    """Bytes of the training reserve space of one _cudnn_rnn call (see _RESERVE_PER_UNIT)."""
    dirs = 2 if bidirectional else 1
    return (_RESERVE_PER_UNIT[mode] * num_layers * dirs * seq_len * batch * hidden * itemsize)


# ---- RNNs ---------------------------------------------------------------------------------------

def _flat_weight_buf(params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The weights' one flat buffer, when they are views into a single storage of exactly their
    size (what RNNBase.flatten_parameters makes on CUDA; blink.dryrun does the same on meta)."""
    if not params:
        return None
    storage = params[0].untyped_storage()
    if any(p.untyped_storage()._cdata != storage._cdata for p in params):
        return None
    dtype = params[0].dtype
    total = sum(p.numel() for p in params)
    if any(p.dtype != dtype for p in params) or storage.nbytes() != total * dtype.itemsize:
        return None
    return torch.empty(0, dtype=dtype, device=params[0].device).set_(storage, 0, (total,), (1,))


def _cudnn_impl(mode: int, input: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor | None,
                params: Sequence[torch.Tensor], has_biases: bool, num_layers: int,
                dropout: float, train: bool, bidirectional: bool, batch_first: bool,
                batch_sizes: Sequence[int] = ()) -> tuple[torch.Tensor, ...]:
    """_cudnn_impl of cudnn/RNN.cpp: one _cudnn_rnn call for the whole (packed) sequence."""
    hidden_size = cx.size(2) if cx is not None else hx.size(2)
    proj_size = hx.size(2) if cx is not None and hx.size(2) != cx.size(2) else 0
    stride0 = (4 if has_biases else 2) + (1 if proj_size else 0)
    weight_buf = _flat_weight_buf(params)
    out = _aten._cudnn_rnn(input, list(params), stride0, weight_buf, hx, cx, mode, hidden_size,
                           proj_size, num_layers, batch_first, dropout, train, bidirectional,
                           list(batch_sizes), None)
    return out[0], out[1], out[2]


def _native_lstm_cuda(input: Tensor, hx: Sequence[Tensor], params: Sequence[Tensor],
                      has_biases: bool, num_layers: int, dropout: float, train: bool,
                      bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The native LSTM as RNN.cpp runs it on CUDA (no cuDNN: bf16, or cuDNN off): FullLayer
    steps without the CPU-only input precompute, each step LSTMCell's two matmuls and one
    _thnn_fused_lstm_cell kernel (+ the projection matmul), dropout between layers."""
    h0, c0 = hx
    x = input.transpose(0, 1) if batch_first else input
    dirs = 2 if bidirectional else 1
    per = (4 if has_biases else 2) + (1 if h0.size(2) != c0.size(2) else 0)
    hy: list[Tensor] = []
    cy: list[Tensor] = []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            idx = layer * dirs + d
            w = params[idx * per:(idx + 1) * per]
            w_ih, w_hh = w[0], w[1]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            w_hr = w[-1] if per in (3, 5) else None
            h, c = h0[idx], c0[idx]
            steps = range(x.size(0) - 1, -1, -1) if d == 1 else range(x.size(0))
            seq: list[Tensor] = []
            for t in steps:
                igates = torch.matmul(x[t], w_ih.t())
                hgates = torch.matmul(h, w_hh.t())
                h, c, _ = _aten._thnn_fused_lstm_cell(igates, hgates, c, b_ih, b_hh)
                if w_hr is not None:
                    h = torch.matmul(h, w_hr.t())
                seq.append(h)
            if d == 1:
                seq.reverse()
            outs.append(torch.stack(seq, 0))
            hy.append(h)
            cy.append(c)
        x = outs[0] if dirs == 1 else torch.cat(outs, -1)
        if dropout > 0 and train and layer < num_layers - 1:
            x = torch.dropout(x, dropout, train)
    out = x.transpose(0, 1) if batch_first else x
    return out, torch.stack(hy, 0), torch.stack(cy, 0)


def _rnn_overrides(lib: torch.library.Library) -> None:
    from torch._decomp import decomposition_table

    def fallback(op: Any) -> Callable[..., Any]:
        return decomposition_table[op]

    lstm_in, lstm_data = fallback(_aten.lstm.input), fallback(_aten.lstm.data)

    def lstm_input(input: Tensor, hx: list[Tensor], params: list[Tensor], has_biases: bool,
                   num_layers: int, dropout: float, train: bool, bidirectional: bool,
                   batch_first: bool) -> tuple[Tensor, ...]:
        if not _cudnn_acceptable(input):
            if input.device.type == "meta" and input.numel() > 0:
                return _native_lstm_cuda(input, hx, params, has_biases, num_layers, dropout,
                                         train, bidirectional, batch_first)
            return lstm_in(input, hx, params, has_biases, num_layers, dropout, train,
                           bidirectional, batch_first)
        return _cudnn_impl(2, input, hx[0], hx[1], params, has_biases, num_layers, dropout,
                           train, bidirectional, batch_first)

    def lstm_packed(data: Tensor, batch_sizes: Tensor, hx: list[Tensor], params: list[Tensor],
                    has_biases: bool, num_layers: int, dropout: float, train: bool,
                    bidirectional: bool) -> tuple[Tensor, ...]:
        if not _cudnn_acceptable(data) or batch_sizes.device.type == "meta":
            return lstm_data(data, batch_sizes, hx, params, has_biases, num_layers, dropout,
                             train, bidirectional)
        return _cudnn_impl(2, data, hx[0], hx[1], params, has_biases, num_layers, dropout,
                           train, bidirectional, False, batch_sizes.tolist())

    lib.impl("lstm.input", lstm_input, "CompositeImplicitAutograd")
    lib.impl("lstm.data", lstm_packed, "CompositeImplicitAutograd")

    for name in ("gru", "rnn_tanh", "rnn_relu"):
        mode = RNN_MODES[name]
        base_in = fallback(getattr(_aten, name).input)
        base_data = fallback(getattr(_aten, name).data)

        def one_input(input: Tensor, hx: Tensor, params: list[Tensor], has_biases: bool,
                      num_layers: int, dropout: float, train: bool, bidirectional: bool,
                      batch_first: bool, _mode: int = mode,
                      _base: Callable[..., Any] = base_in) -> tuple[Tensor, Tensor]:
            if not _cudnn_acceptable(input):
                return _base(input, hx, params, has_biases, num_layers, dropout, train,
                             bidirectional, batch_first)
            out, hy, _ = _cudnn_impl(_mode, input, hx, None, params, has_biases, num_layers,
                                     dropout, train, bidirectional, batch_first)
            return out, hy

        def one_packed(data: Tensor, batch_sizes: Tensor, hx: Tensor, params: list[Tensor],
                       has_biases: bool, num_layers: int, dropout: float, train: bool,
                       bidirectional: bool, _mode: int = mode,
                       _base: Callable[..., Any] = base_data) -> tuple[Tensor, Tensor]:
            if not _cudnn_acceptable(data) or batch_sizes.device.type == "meta":
                return _base(data, batch_sizes, hx, params, has_biases, num_layers, dropout,
                             train, bidirectional)
            out, hy, _ = _cudnn_impl(_mode, data, hx, None, params, has_biases, num_layers,
                                     dropout, train, bidirectional, False, batch_sizes.tolist())
            return out, hy

        lib.impl(f"{name}.input", one_input, "CompositeImplicitAutograd")
        lib.impl(f"{name}.data", one_packed, "CompositeImplicitAutograd")


def _rnn_meta(lib: torch.library.Library) -> None:
    """Meta kernels of _cudnn_rnn (with the reserve space and weight copy cuDNN allocates) and of
    _cudnn_rnn_backward (which has none)."""

    def geometry(input: Tensor, proj_size: int, hidden_size: int, batch_first: bool,
                 bidirectional: bool, batch_sizes: Sequence[int]) -> tuple[int, int, int, int]:
        if batch_sizes:
            seq, batch = len(batch_sizes), int(batch_sizes[0])
        else:
            seq = input.size(1) if batch_first else input.size(0)
            batch = input.size(0) if batch_first else input.size(1)
        return seq, batch, (2 if bidirectional else 1), (proj_size or hidden_size)

    def cudnn_rnn(input: Tensor, weight: list[Tensor], weight_stride0: int,
                  weight_buf: Tensor | None, hx: Tensor, cx: Tensor | None, mode: int,
                  hidden_size: int, proj_size: int, num_layers: int, batch_first: bool,
                  dropout: float, train: bool, bidirectional: bool, batch_sizes: list[int],
                  dropout_state: Tensor | None) -> tuple[Tensor, ...]:
        seq, batch, dirs, out_size = geometry(input, proj_size, hidden_size, batch_first,
                                              bidirectional, batch_sizes)
        if batch_sizes:
            out_shape = [input.size(0), out_size * dirs]
        elif batch_first:
            out_shape = [batch, seq, out_size * dirs]
        else:
            out_shape = [seq, batch, out_size * dirs]
        output = input.new_empty(out_shape)
        hy = hx.new_empty([num_layers * dirs, batch, out_size])
        cy = (cx.new_empty([num_layers * dirs, batch, hidden_size]) if cx is not None
              else input.new_empty(0))
        nbytes = 0
        if train:
            nbytes = cudnn_rnn_reserve_bytes(mode, seq, batch, hidden_size, num_layers,
                                             bidirectional, input.element_size())
        reserve = input.new_empty(nbytes, dtype=torch.uint8)
        if weight_buf is None:
            # _cudnn_rnn copies non-flat weights into a new flat buffer on every call.
            weight_buf = input.new_empty(sum(w.numel() for w in weight))
        return output, hy, cy, reserve, weight_buf

    def cudnn_rnn_backward(input: Tensor, weight: list[Tensor], weight_stride0: int,
                           weight_buf: Tensor, hx: Tensor, cx: Tensor | None, output: Tensor,
                           grad_output: Tensor | None, grad_hy: Tensor | None,
                           grad_cy: Tensor | None, mode: int, hidden_size: int, proj_size: int,
                           num_layers: int, batch_first: bool, dropout: float, train: bool,
                           bidirectional: bool, batch_sizes: list[int],
                           dropout_state: Tensor | None, reserve: Tensor,
                           output_mask: list[bool]) -> tuple[Any, ...]:
        dx = input.new_empty(input.shape) if output_mask[0] else None
        dhx = hx.new_empty(hx.shape) if output_mask[1] else None
        dcx = cx.new_empty(cx.shape) if (output_mask[2] and cx is not None) else None
        dw: list[torch.Tensor] = []
        if output_mask[3]:
            # _cudnn_rnn_backward_weight fills one flat gradient buffer and returns views of it.
            flat = weight_buf.new_empty(weight_buf.numel())
            offset = 0
            for w in weight:
                dw.append(flat[offset:offset + w.numel()].view(w.shape))
                offset += w.numel()
        return dx, dhx, dcx, dw

    lib.impl("_cudnn_rnn", cudnn_rnn, "Meta")
    lib.impl("_cudnn_rnn_backward", cudnn_rnn_backward, "Meta")


def _grouped_mm_meta(lib: torch.library.Library) -> None:
    """Meta kernel of _grouped_mm with CUDA's checks and output layout (module docstring)."""
    dtypes = (torch.float32, torch.float16, torch.bfloat16)

    def grouped_mm(mat_a: Tensor, mat_b: Tensor, offs: Tensor | None = None,
                   bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
        torch._check(mat_a.dtype in dtypes and mat_b.dtype in dtypes, lambda: (
            f"Expected mat_a and mat_b to be Float32, BFloat16 or Float16 matrices, got "
            f"{mat_a.dtype} and {mat_b.dtype}"))
        torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                     lambda: "mat_a and mat_b have to be 2-D or 3-D")
        a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
        if not (a2 and b2):
            torch._check(mat_a.size(-1) == mat_b.size(-2),
                         lambda: "contraction dimension of mat_a and mat_b must match")
        torch._check((offs is not None) == (a2 or b2), lambda: (
            "Have to provide offsets if there is a 2d matrix, or no offset if both matrices "
            "are 3d"))
        if offs is not None:
            torch._check(offs.dim() == 1 and offs.dtype == torch.int32,
                         lambda: "offs has to be a 1-D int32 tensor")
        torch._check(bias is None, lambda: "Bias not supported yet")
        out = out_dtype or mat_a.dtype
        torch._check(out == mat_a.dtype, lambda: "Grouped gemm output dtype must match mat_a")
        if a2 and b2:
            size = [offs.size(0), mat_a.size(0), mat_b.size(1)]
        elif a2:
            torch._check(offs.size(0) == mat_b.size(0), lambda: "matrix batch sizes have to match")
            size = [mat_a.size(0), mat_b.size(-1)]
        elif b2:
            torch._check(offs.size(0) == mat_a.size(0), lambda: "matrix batch sizes have to match")
            size = [mat_a.size(1), mat_b.size(1)]
        else:
            torch._check(mat_a.size(0) == mat_b.size(0), lambda: "batched dimension has to match")
            size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
        # Rows padded to 16 bytes (TMA), as create_grouped_gemm_output_tensor lays them out.
        align = 16 // torch.empty((), dtype=out).element_size()
        padded = (size[-1] + align - 1) // align * align
        stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
        return torch.empty_strided(size, stride, dtype=out, device=mat_a.device)

    lib.impl("_grouped_mm", grouped_mm, "Meta")


def _masked_fill_meta(lib: torch.library.Library) -> None:
    """masked_fill with a 0-dim tensor value: CUDA reads the value as a scalar
    (``masked_fill__cuda``, aten/src/ATen/native/cuda/Indexing.cu: value.item()), so a CPU
    value (``x.masked_fill(m, torch.tensor(finfo.min))``, SEW-D's XSoftmax) is accepted; the
    meta kernel, a Python ref, refuses a value on another device. The in-place op keeps its
    shape checks through the Scalar overload's meta kernel; the out-of-place one is ATen's
    composite (TensorAdvancedIndexing.cpp masked_fill: expand_outplace, a contiguous clone,
    then masked_fill_), as CUDA runs it."""

    def check(mask: Tensor, value: Tensor) -> None:
        torch._check(value.dim() == 0, lambda: (
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
            f"{value.dim()} dimension(s)."))
        torch._check(mask.dtype == torch.bool, lambda: (
            f"masked_fill only supports boolean masks, but got mask with dtype {mask.dtype}"))

    def masked_fill(self: Tensor, mask: Tensor, value: Tensor) -> Tensor:
        check(mask, value)
        shape = torch.broadcast_shapes(mask.shape, self.shape)
        result = self.expand(shape).clone(memory_format=torch.contiguous_format)
        return result.masked_fill_(mask, value)

    def masked_fill_(self: Tensor, mask: Tensor, value: Tensor) -> Tensor:
        check(mask, value)
        return _aten.masked_fill_.Scalar(self, mask, 0)

    lib.impl("masked_fill.Tensor", masked_fill, "Meta")
    lib.impl("masked_fill_.Tensor", masked_fill_, "Meta")


# ---- dropout and batch norm ---------------------------------------------------------------

def _dropout_overrides(lib: torch.library.Library) -> None:
    def dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        # Dropout.cpp: is_fused_kernel_acceptable (CUDA, 0 < p < 1, elements) -> native_dropout.
        if input.device.type == "meta" and train and 0 < p < 1 and input.numel() > 0:
            return _aten.native_dropout(input, p, train)[0]
        if p == 0 or not train or input.numel() == 0:
            return input
        if p == 1:
            return input * torch.zeros((), dtype=input.dtype, device=input.device)
        noise = torch.empty_like(input).bernoulli_(1 - p).div_(1 - p)
        return input * noise

    def dropout_(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        if input.device.type == "meta" and train and 0 < p < 1 and input.numel() > 0:
            return input.copy_(_aten.native_dropout(input, p, train)[0])
        if p == 0 or not train or input.numel() == 0:
            return input
        if p == 1:
            return input.mul_(torch.zeros((), dtype=input.dtype, device=input.device))
        noise = torch.empty_like(input).bernoulli_(1 - p).div_(1 - p)
        return input.mul_(noise)

    lib.impl("dropout", dropout, "CompositeImplicitAutograd")
    lib.impl("dropout_", dropout_, "CompositeImplicitAutograd")


def _batch_norm_override(lib: torch.library.Library) -> None:
    def impl_index(input: Tensor, weight: Tensor | None, bias: Tensor | None,
                   running_mean: Tensor | None, running_var: Tensor | None, training: bool,
                   momentum: float, eps: float, cudnn_enabled: bool) -> tuple[Any, ...]:
        # _batch_norm_impl_index (Normalization.cpp): the use_cudnn conditions, meta for CUDA.
        # cuDNN >= 8's CUDNN_BN_MIN_EPSILON is 0, so eps never rules cuDNN out there.
        stats = running_mean is not None and running_var is not None
        use_cudnn = (
            input.device.type == "meta" and input.dtype != torch.float64
            and (input.dtype != torch.float16 or (weight is not None
                                                  and weight.dtype == torch.float32))
            and weight is not None and bias is not None
            and (stats or (running_mean is None and running_var is None and training))
            and input.dim() >= 3
            and ((input.size(0) <= 880801 and training) or (input.size(0) <= 65535
                                                             and not training))
            and eps >= 0 and cudnn_enabled and torch.backends.cudnn.enabled
            and input.numel() < 2**31 - 1
        )
        if use_cudnn:
            x = input.contiguous(memory_format=_suggest_memory_format(input))
            out = _aten.cudnn_batch_norm(x, weight.contiguous(), bias.contiguous(),
                                         running_mean, running_var, training, momentum, eps)
            return out[0], out[1], out[2], out[3], 1
        reserve = torch.empty(0, dtype=torch.uint8, device=input.device)
        out = _aten.native_batch_norm(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
        return out[0], out[1], out[2], reserve, 0

    lib.impl("_batch_norm_impl_index", impl_index, "CompositeImplicitAutograd")


def _suggest_memory_format(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) \
            and not t.is_contiguous():
        return torch.channels_last
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) \
            and not t.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


# ---- autocast and device="cuda" in the traced code -------------------------------------------

_GPU_DEVICE_TYPES = ("cuda", "meta")


def _patch_autocast(undo: list[Callable[[], None]]) -> None:
    from torch.amp.autocast_mode import autocast

    from .autocast import MetaAutocast

    orig_init, orig_enter, orig_exit = autocast.__init__, autocast.__enter__, autocast.__exit__
    orig_enabled, orig_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype

    def __init__(self: autocast, device_type: str, dtype: torch.dtype | None = None,  # noqa: N807
                 enabled: bool = True, cache_enabled: bool | None = None) -> None:
        if device_type not in _GPU_DEVICE_TYPES:
            orig_init(self, device_type, dtype, enabled, cache_enabled)
            return
        self.device = "cuda"
        self.fast_dtype = orig_dtype("cuda") if dtype is None else dtype
        self._cache_enabled = (torch.is_autocast_cache_enabled() if cache_enabled is None
                               else cache_enabled)
        if enabled and self.fast_dtype not in (torch.bfloat16, torch.float16):
            warnings.warn(f"In CUDA autocast, but the target dtype {self.fast_dtype} is not "
                          "supported. Disabling autocast.", stacklevel=2)
            enabled = False
        self._enabled = bool(enabled)
        self._blink = MetaAutocast(self.fast_dtype if self._enabled else torch.float16,
                                   self._enabled, cache_enabled=self._cache_enabled)

    def __enter__(self: autocast) -> autocast:  # noqa: N807
        blink_ctx = getattr(self, "_blink", None)
        if blink_ctx is None:
            if getattr(self, "device", None) == "cuda" and not getattr(self, "_enabled", True):
                # Made before the trace began (e.g. a decorator applied at import time): torch
                # switched it off then because this host has no CUDA, and which regions the user
                # meant to be off can no longer be told apart.
                warnings.warn(
                    "a torch.autocast('cuda') object created before blink.trace started is "
                    "disabled (torch turns CUDA autocast off on a host without CUDA), so this "
                    "region traces without autocast. Create the autocast region inside the "
                    "traced code, or pass dtype='amp-bf16' / 'amp-fp16' to blink.predict.",
                    stacklevel=2)
            return orig_enter(self)
        blink_ctx.__enter__()
        return self

    def __exit__(self: autocast, *exc: object) -> bool | None:  # noqa: N807
        blink_ctx = getattr(self, "_blink", None)
        if blink_ctx is None:
            return orig_exit(self, *exc)
        blink_ctx.__exit__(*exc)
        return False

    def is_autocast_enabled(*args: Any, **kwargs: Any) -> bool:
        device = args[0] if args else kwargs.get("device_type")
        if device == "meta":
            return orig_enabled("cuda")
        return orig_enabled(*args, **kwargs)

    def get_autocast_dtype(device_type: str) -> torch.dtype:
        return orig_dtype("cuda" if device_type == "meta" else device_type)

    autocast.__init__, autocast.__enter__, autocast.__exit__ = __init__, __enter__, __exit__
    torch.is_autocast_enabled = is_autocast_enabled
    torch.get_autocast_dtype = get_autocast_dtype

    def restore() -> None:
        autocast.__init__, autocast.__enter__, autocast.__exit__ = (orig_init, orig_enter,
                                                                   orig_exit)
        torch.is_autocast_enabled = orig_enabled
        torch.get_autocast_dtype = orig_dtype

    undo.append(restore)


def _is_cuda_device(d: object) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return False


_META = torch.device("meta")


class _MetaForCuda(TorchFunctionMode):
    """device="cuda" in traced code means the GPU the dry run stands in for: the meta device."""

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0].to(_META)
        if func is torch.Tensor.to and args:
            if len(args) > 1 and _is_cuda_device(args[1]):
                args = (args[0], _META, *args[2:])
            elif _is_cuda_device(kwargs.get("device")):
                kwargs = {**kwargs, "device": _META}
        elif "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = {**kwargs, "device": _META}
        return func(*args, **kwargs)


def _install_device_mode(undo: list[Callable[[], None]]) -> None:
    mode = _MetaForCuda()
    mode.__enter__()
    undo.append(lambda: mode.__exit__(None, None, None))


# ---- nn.MultiheadAttention's fast path (attention.cu) ---------------------------------------

def _native_mha_cuda(cc: tuple[int, int], query: Tensor, key: Tensor, value: Tensor,
                     embed_dim: int, num_head: int, qkv_weight: Tensor, qkv_bias: Tensor,
                     proj_weight: Tensor, proj_bias: Tensor, mask: Tensor | None = None,
                     need_weights: bool = True, average_attn_weights: bool = True,
                     mask_type: int | None = None) -> tuple[Tensor, Tensor | None]:
    """native_multi_head_attention_cuda's kernels, with public ops of the same traffic, for a
    GPU of compute capability `cc` (query: (B, T, D))."""
    from . import sdpa as _sdpa

    b, t = query.shape[0], query.shape[1]
    dph = embed_dim // num_head
    if query is key and key is value and not need_weights and mask is None:
        # Its SDPA branch: taken where select_sdp_backend, asked about views of the input,
        # picks a fused kernel.
        v4 = query.view(b, -1, num_head, dph).transpose(1, 2)
        backend = _sdpa.choose_sdpa_backend_for_tensors(v4, v4, v4,
                                                        compute_capability=cc)
        if backend in ("flash", "efficient", "cudnn"):
            x = torch.nn.functional.linear(query, qkv_weight, qkv_bias)
            q, k, v = (c.view(b, -1, num_head, dph).transpose(1, 2) for c in x.chunk(3, -1))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            y = y.transpose(1, 2).reshape(b, -1, embed_dim)
            return torch.nn.functional.linear(y, proj_weight, proj_bias), None
    # qkv_projection: one GEMM without the bias (query @ qkv_weight^T).
    qkv = torch.matmul(query, qkv_weight.t())
    # _transform_bias_rescale_qkv: one kernel adds the bias, scales q by 1/sqrt(dph) and writes
    # q, k, v as 3 x (B, H, T, dph): an add into that layout moves the same bytes.
    out = torch.empty(3, b, num_head, t, dph, dtype=qkv.dtype, device=qkv.device)
    torch.add(qkv.view(b, t, 3, num_head, dph), qkv_bias.view(3, num_head, dph),
              out=out.permute(1, 3, 0, 2, 4))
    q, k, v = out.unbind(0)
    qkt = torch.matmul(q, k.transpose(-2, -1))  # bmm_nt
    # _masked_softmax: one pass over the scores (the mask is read alongside).
    qkt = torch.softmax(qkt, -1)
    ctx = torch.matmul(qkt, v)  # bmm_nn, (B, H, T, dph)
    # transform0213_gemm_nt_bias: ctx to (B, T, H * dph), then addmm with the projection.
    proj = torch.nn.functional.linear(ctx.transpose(1, 2).reshape(b, t, embed_dim),
                                      proj_weight, proj_bias)
    if need_weights:
        w = qkt.sum(1) / num_head if average_attn_weights else qkt
        return proj, w
    return proj, None


def _patch_native_mha(undo: list[Callable[[], None]], cc: tuple[int, int]) -> None:
    import torch.nn.modules.activation as activation

    check, native = activation._check_arg_device, torch._native_multi_head_attention

    def meta_is_cuda(x: Tensor | None) -> bool:
        return x is None or x.device.type == "meta" or check(x)

    def mha(query: Tensor, *args: Any, **kwargs: Any) -> Any:
        if query.device.type != "meta":
            return native(query, *args, **kwargs)
        return _native_mha_cuda(cc, query, *args, **kwargs)

    overrides = torch.overrides.has_torch_function

    def has_torch_function(args: Any) -> bool:
        # The fast path's check, without this dry run's own TorchFunctionMode (_MetaForCuda),
        # which a run on the GPU does not have: only a Tensor subclass with its own
        # __torch_function__ counts (Parameter does not, as in has_torch_function's C++ check).
        if not overrides(args):
            return False
        return any(isinstance(a, Tensor) and type(a) not in (Tensor, torch.nn.Parameter)
                   and type(a).__torch_function__ is not Tensor.__torch_function__
                   for a in args)

    mha_cls = activation.MultiheadAttention
    forward = mha_cls.forward

    @functools.wraps(forward)
    def mha_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # The fast path's has_torch_function test is read off torch.overrides at call time;
        # swapped for this call only, so nothing else sees it.
        torch.overrides.has_torch_function = has_torch_function
        try:
            return forward(self, *args, **kwargs)
        finally:
            torch.overrides.has_torch_function = overrides

    activation._check_arg_device = meta_is_cuda
    torch._native_multi_head_attention = mha
    mha_cls.forward = mha_forward  # type: ignore[method-assign]

    def restore() -> None:
        activation._check_arg_device = check
        torch._native_multi_head_attention = native
        mha_cls.forward = forward  # type: ignore[method-assign]

    undo.append(restore)


# ---- entry point ------------------------------------------------------------------------------

_disabled = threading.local()


@contextmanager
def disabled() -> Iterator[None]:
    """Traces started inside keep the meta device's own paths: for a dry run compared against a
    real run on a device that is not CUDA (``blink collect --device cpu``)."""
    old = getattr(_disabled, "on", False)
    _disabled.on = True
    try:
        yield
    finally:
        _disabled.on = old


def install(undo: list[Callable[[], None]], cc: tuple[int, int] = (9, 0)) -> None:
    """Install every rule for a GPU of compute capability `cc`; each adds the callable that
    removes it to `undo` (run in reverse)."""
    if getattr(_disabled, "on", False):
        return
    lib = override_library()
    undo.append(lib._destroy)
    _rnn_overrides(lib)
    _dropout_overrides(lib)
    _batch_norm_override(lib)
    meta_lib = override_library()
    undo.append(meta_lib._destroy)
    _rnn_meta(meta_lib)
    _grouped_mm_meta(meta_lib)
    _masked_fill_meta(meta_lib)
    _patch_autocast(undo)
    _patch_native_mha(undo, cc)
    _install_device_mode(undo)


def flatten_rnn_weights(net: torch.nn.Module) -> None:
    """Make each RNN module's weights views into one flat buffer, as RNNBase.flatten_parameters
    does when the module moves to CUDA (cuDNN then reads them in place). For blink's own meta
    copies of user models (blink.dryrun); the bytes are the same, in one storage."""
    for m in net.modules():
        if not isinstance(m, torch.nn.RNNBase):
            continue
        weights = [w for w in m._flat_weights if isinstance(w, torch.Tensor)]
        if not weights or any(w.device.type != "meta" for w in weights):
            continue
        dtype = weights[0].dtype
        if any(w.dtype != dtype for w in weights):
            continue
        flat = torch.empty(sum(w.numel() for w in weights), dtype=dtype, device="meta")
        offset = 0
        with torch.no_grad():
            for w in weights:
                w.data = flat[offset:offset + w.numel()].view(w.shape)
                offset += w.numel()
        m._init_flat_weights()
