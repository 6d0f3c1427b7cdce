"""The one-call dry run: a model (or zoo name) and input shapes in, a Trace out.

The user's model is never touched: Blink traces a copy whose parameters and buffers are fresh
meta tensors (a deepcopy with those pre-seeded in the memo, so no weight is ever copied).
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from . import zoo
from .errors import BatchSizeError, ConfigError, DataDependentError, TraceError
from .trace import _C, Trace, needs_values, trace

MODES = ("inference", "train")
OPTIMIZERS = ("adamw", "adam", "sgd", "none")
# name -> (parameter dtype, autocast dtype or None)
DTYPES: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "fp16": (torch.float16, None),
    "amp-bf16": (torch.float32, torch.bfloat16),
    "amp-fp16": (torch.float32, torch.float16),
}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
                  "half": "fp16", "autocast": "amp-bf16", "amp": "amp-bf16"}


def normalize_dtype(dtype: str | torch.dtype | None) -> str:
    if dtype is None:
        return "fp32"
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if not isinstance(dtype, str):
        raise ConfigError(f"dtype must be a string or torch.dtype, not {type(dtype).__name__}")
    key = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if key not in DTYPES:
        raise ConfigError(
            f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)} "
            "(amp-* = fp32 weights under CUDA autocast)"
        )
    return key


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a positive integer, not {value!r}")
    if value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value}")
    return value


# Inputs larger than this are no batch any GPU could hold (the largest have ~0.2-0.3 TB); such a
# batch size is a typo, rejected before tensors with overflowing sizes are made.
MAX_INPUT_BYTES = 1 << 40


def check_input_size(name: str, batch_size: int | None, shapes: Sequence[Sequence[int]],
                     itemsize: int) -> None:
    """Reject a batch whose inputs alone exceed MAX_INPUT_BYTES, naming the batch size."""
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= int(d)
        total += n * itemsize
    if total > MAX_INPUT_BYTES:
        what = f"batch_size {batch_size}" if batch_size is not None else "the input shape"
        raise BatchSizeError(
            f"{what} is too large for {name}: its inputs alone would take {total / 2**40:.3g} "
            f"TiB, more than any GPU's memory. Use a realistic batch size (e.g. 1-4096)."
        )


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A structural copy of `model` whose tensors are new meta tensors; `model` is untouched."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"),
                                             requires_grad=p.requires_grad)
    for b in model.buffers():
        if id(b) not in memo:
            memo[id(b)] = torch.empty_like(b, device="meta")
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:  # noqa: BLE001 - any failure means we cannot copy safely
        raise ConfigError(
            f"cannot make a meta-device copy of {type(model).__name__} ({exc}). Build the model "
            "on the meta device yourself (`with torch.device('meta'): model = MyModel()`) and "
            "pass that, or trace your own code with `with blink.trace(model):`."
        ) from exc


def _to_meta(value: object, where: str, cast: torch.dtype | None = None) -> object:
    """Meta copies of the input tensors; floating ones become `cast` when given (dtype="fp16"
    applies to the inputs too, as model.half() and x.half() would on a GPU)."""
    if isinstance(value, torch.Tensor):
        dtype = cast if cast is not None and value.is_floating_point() else value.dtype
        return torch.empty_strided(value.shape, value.stride(), dtype=dtype, device="meta")
    if isinstance(value, Mapping):
        return {k: _to_meta(v, f"{where}[{k!r}]", cast) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v, f"{where}[{i}]", cast) for i, v in enumerate(value))
    if value is None or isinstance(value, (int, float, bool, str)):
        return value
    raise ConfigError(f"{where}: unsupported input type {type(value).__name__}; pass tensors, "
                      "or tuples / lists / dicts of tensors")


def enable_grad_checkpointing(net: torch.nn.Module, label: str) -> None:
    """Switch on the library's own activation checkpointing on Blink's meta copy, as a user
    does before training: transformers' `activation_checkpointing_enable` /
    `gradient_checkpointing_enable` (non-reentrant torch.utils.checkpoint around each layer)
    or timm's `set_grad_checkpointing`. Backward then recomputes each checkpointed block's
    forward: more time, fewer saved activations."""
    switches = (("activation_checkpointing_enable",  # transformers 5 (the old name warns)
                 {"activation_checkpointing_kwargs": {"use_reentrant": False}}),
                ("gradient_checkpointing_enable",
                 {"gradient_checkpointing_kwargs": {"use_reentrant": False}}),
                ("set_grad_checkpointing", {"enable": True}))
    # A switch whose signature differs (a TypeError: a model's own method of the same name)
    # is not the library's: the next name is tried. A switch that refuses stops the search.
    mismatched: list[str] = []
    for name, kwargs in switches:
        fn = getattr(net, name, None)
        if callable(fn):
            try:
                fn(**kwargs)
            except TypeError as exc:
                mismatched.append(f"{name}: {exc}")
                continue
            except (ValueError, NotImplementedError, AssertionError) as exc:
                raise ConfigError(f"{label} does not support gradient checkpointing ({name}: "
                                  f"{exc}); drop grad_checkpointing") from None
            return
    found = f" ({'; '.join(mismatched)})" if mismatched else ""
    raise ConfigError(
        f"{label} has no gradient-checkpointing switch that Blink can call (transformers' "
        f"gradient_checkpointing_enable or timm's set_grad_checkpointing){found}; wrap its "
        f"blocks in torch.utils.checkpoint.checkpoint(..., use_reentrant=False) in your own "
        f"model and predict that instead")


def _channels_last(net: torch.nn.Module, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The run as `model.to(memory_format=torch.channels_last)` with its 4-D floating inputs
    made channels-last, as NVIDIA recommends for convolution nets under AMP: cuDNN then runs
    NHWC kernels with no layout transposes. The module is converted in place (it is blink's
    meta copy, never the caller's model)."""
    found = [False]

    def conv(v: object) -> object:
        if isinstance(v, torch.Tensor):
            if v.dim() == 4 and v.is_floating_point():
                found[0] = True
                return v.contiguous(memory_format=torch.channels_last)
            return v
        if isinstance(v, Mapping):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(conv(x) for x in v)
        return v

    new_args = tuple(conv(a) for a in args)
    new_kwargs = {k: conv(v) for k, v in kwargs.items()}
    if not found[0]:
        raise ConfigError("channels_last needs a 4-D floating input (N, C, H, W): none of the "
                          "inputs is one; drop channels_last or give an image input")
    net.to(memory_format=torch.channels_last)
    return new_args, new_kwargs


def _shape_inputs(input_shape: object, batch_size: int | None,
                  dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    shapes: list[Sequence[int]]
    if isinstance(input_shape, Sequence) and input_shape and all(
            isinstance(s, Sequence) for s in input_shape):
        shapes = list(input_shape)  # several inputs
    elif isinstance(input_shape, Sequence):
        shapes = [input_shape]
    else:
        raise ConfigError(f"input_shape must be a tuple of ints (or a list of them), "
                          f"not {input_shape!r}")
    out = []
    for shape in shapes:
        dims = list(shape)
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
            raise ConfigError(
                f"bad input_shape {tuple(shape)!r}: every dimension must be a positive integer, "
                "batch dimension first, e.g. (32, 3, 224, 224)"
            )
        if batch_size is not None:
            dims[0] = batch_size
        check_input_size("the model", batch_size, [dims], dtype.itemsize)
        out.append(torch.empty(*dims, dtype=dtype, device="meta"))
    return tuple(out)


def _default_loss(output: object, labels: torch.Tensor | None) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    if isinstance(output, Mapping) and not hasattr(output, "logits"):
        # Dict outputs without a loss (torchvision's segmentation heads: {"out", "aux"}): the
        # stand-in loss below over every tensor, so backward starts from each head.
        heads = [v for v in output.values() if isinstance(v, torch.Tensor)]
        if heads:
            return torch.stack([h.float().sum() for h in heads]).sum()
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        output = output[0]
    logits = getattr(output, "logits", output)
    if not isinstance(logits, torch.Tensor):
        raise ConfigError("cannot derive a loss from the model's output; pass loss_fn=")
    if labels is not None and logits.dim() == 2 and labels.dim() == 1:
        return torch.nn.functional.cross_entropy(logits, labels)
    # A stand-in loss for arbitrary models: one reduction, so backward starts from every output.
    return logits.float().sum()


# Inside torch112_sgd_step(): a training step as torch < 2.0 ran timm's benchmark step.
_TORCH112_SGD: ContextVar[bool] = ContextVar("blink_torch112_sgd", default=False)


@contextmanager
def torch112_sgd_step(enabled: bool = True) -> Iterator[None]:
    """Inside (when `enabled`): a training step is traced as timm's benchmark ran it on torch
    1.12 (the public RTX 3090 training times, blink.train.timm_cache), not as the installed torch
    runs it. timm's create_optimizer_v2(opt="sgd") is torch.optim.SGD with Nesterov momentum
    0.9, and torch < 2.0 defaulted to its single-tensor loop (foreach=None meant False): four
    kernels per parameter, each launched from Python. optimizer.zero_grad() left zero-filled
    gradients (set_to_none=False before 2.0), outside the timed step, so the backward's
    AccumulateGrad adds each parameter's gradient into them in place."""
    token = _TORCH112_SGD.set(enabled)
    try:
        yield
    finally:
        _TORCH112_SGD.reset(token)


def _make_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer | None:
    # foreach=True: the multi-tensor path CUDA uses by default (meta tensors would otherwise get
    # the per-parameter loop, which is not what a GPU run executes).
    if name == "none" or not params:
        return None
    if name == "sgd" and _TORCH112_SGD.get():
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, nesterov=True, foreach=False)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=True)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True)


@dataclass
class Prepared:
    """A meta-device model copy and its inputs, ready to run."""

    net: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    labels: torch.Tensor | None
    meta: dict[str, Any]
    amp_dtype: torch.dtype | None
    # Keyword inputs Blink made whose every element has a known value (token ids), and whether
    # execute follows known values (blink.known_values) to answer .item() from them.
    known: dict[str, bool | int | float] = field(default_factory=dict)
    known_values: bool = False
    items_answered: int = 0  # .item() calls the last execute answered from known values
    shapes_sized: int = 0  # data-dependent shapes it sized from host copies (known_values.py)

    def known_values_mode(self) -> Any:
        """A blink.known_values.KnownValues mode that knows this run's known inputs."""
        from .known_values import KnownValues

        return KnownValues((v, self.known[k]) for k, v in self.kwargs.items() if k in self.known)


def prepare(
    model: torch.nn.Module | str,
    inputs: object = None,
    *,
    input_shape: object = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    dtype: str | torch.dtype | None = None,
    mode: str = "inference",
    optimizer: str = "adamw",
    channels_last: bool = False,
    grad_checkpointing: bool = False,
    kv_cache: int | None = None,
) -> Prepared:
    """Validate the arguments and build the meta model copy and inputs (see trace_model)."""
    for flag, value in (("channels_last", channels_last),
                        ("grad_checkpointing", grad_checkpointing)):
        if not isinstance(value, bool):
            raise ConfigError(f"{flag} must be True or False, not {value!r}")
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; choose 'inference' or 'train'")
    if grad_checkpointing and mode != "train":
        raise ConfigError("grad_checkpointing changes only a training step (backward recomputes "
                          "the forward); use mode='train' or drop it")
    if not isinstance(optimizer, str) or optimizer.lower() not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    optimizer = optimizer.lower()
    dtype_key = normalize_dtype(dtype)
    param_dtype, amp_dtype = DTYPES[dtype_key]
    if batch_size is not None:
        _positive_int("batch_size", batch_size)
    if seq_len is not None:
        _positive_int("seq_len", seq_len)
    if kv_cache is not None:
        _positive_int("kv_cache", kv_cache)
        if mode != "inference":
            raise ConfigError("kv_cache predicts a generation step, which is inference; use "
                              "mode='inference' or drop kv_cache")

    zoo_name = model if isinstance(model, str) else None
    made_inputs = False  # Blink made the inputs from the zoo entry (their values are its own)
    kwargs: dict[str, Any] = {}
    args: tuple[Any, ...] = ()
    labels: torch.Tensor | None = None
    if zoo_name is not None:
        entry = zoo.get_entry(zoo_name)  # raises with the list of known names
        zoo_name = entry.name  # a bare name made prefixed (llama-1b -> hf:llama-1b)
        if inputs is None and input_shape is None:
            if batch_size is None:
                raise ConfigError(f"give batch_size for {zoo_name} (e.g. batch_size=8)")
            kwargs = zoo.make_inputs(zoo_name, batch_size, seq_len, param_dtype,
                                     with_labels=mode == "train")
            made_inputs = True
            if not zoo_name.startswith("hf:") and "labels" in kwargs:
                labels = kwargs.pop("labels")
        net = zoo.build(zoo_name)
        family = entry.family
    else:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module or a zoo name, not "
                              f"{type(model).__name__}; known names: blink.zoo.list_models()")
        net = _meta_copy(model)
        family = type(model).__name__
        if inputs is None and input_shape is None:
            from . import models

            found = models.entry_for_module(model)
            if found is None or batch_size is None:
                raise models.no_inputs_error(model, batch_size)
            kwargs = zoo.entry_inputs(found, batch_size, seq_len, param_dtype,
                                      with_labels=mode == "train")
            made_inputs = True
            if not found.name.startswith("hf:") and "labels" in kwargs:
                labels = kwargs.pop("labels")
    if not kwargs:
        if inputs is not None:
            # fp16 / bf16 apply to floating inputs too; amp-* keeps them fp32 (autocast casts).
            cast = param_dtype if param_dtype != torch.float32 else None
            moved = _to_meta(inputs, "inputs", cast)
            if isinstance(moved, Mapping):
                kwargs = dict(moved)
            elif isinstance(moved, tuple):
                args = moved
            else:
                args = (moved,)
        elif input_shape is not None:
            args = _shape_inputs(input_shape, batch_size, param_dtype)
        else:
            raise ConfigError(
                "no inputs: pass inputs=(tensors...), input_shape=(batch, ...) or, for zoo "
                "models, batch_size="
            )

    known: dict[str, bool | int | float] = {}
    if made_inputs and "input_ids" in kwargs:  # a text model's tokens (not image labels)
        token = _plain_token_id(net)
        known = {k: token for k in _TOKEN_INPUTS if k in kwargs}
    if param_dtype != torch.float32:
        net = net.to(param_dtype)
    if channels_last:
        args, kwargs = _channels_last(net, args, kwargs)
    if grad_checkpointing:
        enable_grad_checkpointing(net, zoo_name or type(model).__name__)
    from .cuda_paths import flatten_rnn_weights

    flatten_rnn_weights(net)  # as RNNBase.flatten_parameters does on .cuda()
    net.train(mode == "train")
    if mode == "inference":
        for p in net.parameters():
            p.requires_grad_(False)
    if kv_cache is not None:
        _check_positions(zoo_name, kwargs, kv_cache)
        ids = kwargs["input_ids"]
        prompt = torch.empty(ids.shape[0], kv_cache, dtype=ids.dtype, device="meta")
        cache = fill_kv_cache(net, prompt, zoo_name or type(model).__name__)
        kwargs[_cache_keyword(net) or "past_key_values"] = cache  # fill_kv_cache checked it
        kwargs["use_cache"] = True

    if batch_size is None:  # a custom model's table shows its batch: the first input's dim 0
        first = next((v for v in (*args, *kwargs.values())
                      if isinstance(v, torch.Tensor) and v.dim() > 0), None)
        batch_size = int(first.shape[0]) if first is not None else None
    params = sum(q.numel() for q in {id(q): q for q in net.parameters()}.values())
    meta = {
        "model": zoo_name or type(model).__name__, "family": family, "mode": mode,
        "dtype": dtype_key, "batch_size": batch_size, "seq_len": seq_len, "params": int(params),
        "optimizer": optimizer if mode == "train" else None,
        "channels_last": channels_last,
        "grad_checkpointing": grad_checkpointing,
        "kv_cache": kv_cache,
        "torch_version": torch.__version__,
        # The tensor inputs' shapes (the model-level correction reads an image input's side).
        "input_shapes": [list(v.shape) for v in (*args, *kwargs.values())
                         if isinstance(v, torch.Tensor)],
    }
    return Prepared(net, args, kwargs, labels, meta, amp_dtype, known)


# Token inputs Blink makes for text models (zoo.entry_inputs): one ordinary token repeated, so
# that checks on their values (``pad_token_id in input_ids``) have the answer an unpadded batch
# gives on a GPU.
_TOKEN_INPUTS = ("input_ids", "decoder_input_ids", "labels")


def _check_positions(zoo_name: str | None, kwargs: dict[str, Any], kv_cache: int) -> None:
    """A generation step needs a text model's token ids, and the cached plus new tokens must
    fit its position embeddings."""
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ConfigError("kv_cache needs a text model's input_ids (a transformers causal LM: "
                          "hf: names or configs, or the model with inputs={'input_ids': ...})")
    # the prompt that fills the cache is an input of batch x kv_cache token ids
    check_input_size(zoo_name or "the model", int(ids.shape[0]), [(ids.shape[0], kv_cache)], 8)
    if zoo_name is not None:
        limit = zoo.get_entry(zoo_name).max_seq_len
        if limit and kv_cache + ids.shape[1] > limit:
            raise ConfigError(f"kv_cache {kv_cache} + seq_len {ids.shape[1]} tokens exceed "
                              f"{zoo_name}'s {limit} positions")


# The forward's keyword for a KV cache: `cache` from transformers 5.x, `past_key_values` before.
_CACHE_KEYWORDS = ("cache", "past_key_values")


def _cache_keyword(net: torch.nn.Module) -> str | None:
    """The forward's KV-cache keyword; None when it takes none (a masked LM, a vision model)."""
    import inspect

    params = inspect.signature(net.forward).parameters
    return next((k for k in _CACHE_KEYWORDS if k in params), None)


def cache_keyword(p: Prepared) -> str | None:
    """The keyword of a kv_cache run's KV cache input (None for other runs)."""
    if not p.meta.get("kv_cache"):
        return None
    return next((k for k in _CACHE_KEYWORDS if k in p.kwargs), None)


def kv_cache_resident(p: Prepared) -> dict[str, list[torch.Tensor]]:
    """The `resident` entry of a trace of `p` for its KV cache's layers ({} for other runs): a
    fresh list, which the trace releases after registering them (blink.trace.Trace), so the
    layers the step replaces can be released."""
    key = cache_keyword(p)
    return {} if key is None else {"kv_cache": _tensors(p.kwargs[key])}


def fill_kv_cache(net: torch.nn.Module, prompt: torch.Tensor, label: str) -> Any:
    """The model's own KV cache after the prompt's tokens (an untraced forward; on meta for a
    dry run, on the device for a real one): whatever its layers keep (full or sliding-window
    attention, MLA's latents, a hybrid's recurrent state), as generate() hands it to the next
    step."""
    config = getattr(net, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"{label} is an encoder-decoder model: kv_cache predicts a decoder-only "
                          "causal LM's generation step (an encoder-decoder's step, with its "
                          "cross-attention cache over the encoder's output, is not modelled); "
                          "predict it without kv_cache")
    if _cache_keyword(net) is None:
        raise ConfigError(f"{label} ({type(net).__name__}) takes no KV cache (its forward has no "
                          "past_key_values): kv_cache applies to transformers causal LMs; "
                          "predict it without kv_cache")
    try:
        with torch.no_grad():
            out = net(input_ids=prompt, use_cache=True)
    except Exception as exc:  # noqa: BLE001 - the model's own failure, named
        raise ConfigError(f"could not fill a KV cache of {prompt.shape[1]} tokens for {label}: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    cache = next((c for c in (getattr(out, k, None) for k in _CACHE_KEYWORDS) if c is not None),
                 None)
    if cache is None:
        raise ConfigError(f"{label} returned no KV cache (past_key_values) with use_cache=True; "
                          "kv_cache applies to transformers causal LMs")
    return cache


def _plain_token_id(net: torch.nn.Module) -> int:
    """The smallest token id from 3 up that the model's config gives no special role (pad, bos,
    eos, sep, cls, mask, ...)."""
    config = getattr(net, "config", None)
    special: set[int] = set()
    todo = [config.to_dict() if hasattr(config, "to_dict") else {}]
    while todo:  # nested configs too (text_config, decoder, ...)
        fields = todo.pop()
        for key, value in fields.items():
            if isinstance(value, dict):
                todo.append(value)
            elif isinstance(key, str) and key.endswith(("token_id", "token_ids")):
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(v, int):
                        special.add(v)
    token = 3
    while token in special:
        token += 1
    return token


def trace_model(
    model: torch.nn.Module | str,
    inputs: object = None,
    *,
    input_shape: object = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    dtype: str | torch.dtype | None = None,
    mode: str = "inference",
    optimizer: str = "adamw",
    gpu: str = "H200",
    loss_fn: Callable[[object], torch.Tensor] | None = None,
    nonzero: str = "error",
    first_step: bool = False,
    warmup: bool = False,
    channels_last: bool = False,
    grad_checkpointing: bool = False,
    kv_cache: int | None = None,
    known_values: bool | None = None,
) -> Trace:
    """Dry-run an inference forward or one whole training step and return its Trace.

    `model` is an nn.Module or a zoo name (``blink.zoo.list_models()``). Inputs come from
    `inputs` (tensors on any device; only their shapes and dtypes are used), from `input_shape`
    (batch dimension first; `batch_size` replaces it), or, for zoo models, from `batch_size` and
    `seq_len`. mode="train" runs forward, loss, backward and `optimizer.step()`.

    A training step is traced in steady state, as a GPU run is timed after warm-up: the
    optimizer's state (AdamW moments, momentum) exists before the step, so it counts as resident
    memory and the step does not include creating it. first_step=True traces the very first step
    instead (state created inside it).

    warmup=True traces the same step once first and discards it, so that the kept trace's
    timestamps are those of warm code (a model's first call pays one-off Python costs such as
    imports and first-call caches; eager timings are taken after warm-up).

    channels_last=True runs the model as `model.to(memory_format=torch.channels_last)` with its
    4-D inputs channels-last (NHWC); a ConfigError when no input is 4-D.

    grad_checkpointing=True (mode="train") switches on the model's own activation
    checkpointing first, as transformers' `gradient_checkpointing_enable()` (non-reentrant) or
    timm's `set_grad_checkpointing()` do; a ConfigError for a model with neither.

    kv_cache=N (inference, transformers causal LMs) traces a generation step: `seq_len` new
    tokens (1: one decode step) per sequence after N tokens already in the model's own KV cache
    (filled by an untraced meta forward of N tokens). The cache is resident as an input; the
    layers the step replaces with longer ones (DynamicCache's torch.cat) are released, as on a
    GPU.

    known_values: whether to follow tensors of known values (and host copies of tensors made
    from host memory) to answer .item() and size data-dependent shapes (blink.known_values);
    None (default) does so only to retry a trace that failed for want of values, as that mode
    sends every op through Python.

    The host's random draws inside the step (LayerDrop, numpy masks) come from a fixed seed
    (fixed_host_rng); the caller's generators are left as they were.
    """
    run = dict(input_shape=input_shape, batch_size=batch_size, seq_len=seq_len, dtype=dtype,
               mode=mode, optimizer=optimizer, gpu=gpu, loss_fn=loss_fn, nonzero=nonzero,
               first_step=first_step, warmup=warmup, channels_last=channels_last,
               grad_checkpointing=grad_checkpointing, kv_cache=kv_cache)
    # (building a model on the host draws its initial values too: the caller's generators are
    # left as they were)
    with fixed_host_rng():
        if known_values is not None:
            return _trace_once(model, inputs, known_values, **run)
        try:
            return _trace_once(model, inputs, False, **run)
        except DataDependentError as exc:
            if not asks_for_values(exc):
                raise
        return _trace_once(model, inputs, True, **run)


def asks_for_values(exc: BaseException) -> bool:
    """Whether a dry run failed for want of tensor values (.item(), a data-dependent shape; a
    retry following known values and host copies may answer it): blink's DataDependentError
    from a trace, or torch's own error from an untraced step."""
    if isinstance(exc, DataDependentError):
        return True
    return isinstance(exc, (RuntimeError, NotImplementedError)) and needs_values(str(exc))


def _trace_once(model: torch.nn.Module | str, inputs: object, known_values: bool, *,
                gpu: str, loss_fn: Callable[[object], torch.Tensor] | None, nonzero: str,
                first_step: bool, warmup: bool, **prep: Any) -> Trace:
    """trace_model with the known-values choice made (`prep`: prepare's keywords)."""
    p = prepare(model, inputs, **prep)
    p.known_values = known_values
    mode = p.meta["mode"]
    opt = None
    if not first_step:
        opt = make_optimizer(p)
        if opt is not None:
            _prime_optimizer_state(opt)
    p.meta["first_step"] = bool(first_step) if mode == "train" else None
    if nonzero != "error":
        p.meta["nonzero"] = nonzero
    key = cache_keyword(p)
    plain = {k: v for k, v in p.kwargs.items() if k != key}
    state = _tensors(list(opt.state.values())) if opt is not None else []
    # torch112_sgd_step's zero-filled gradients live across steps, as the optimizer's state
    # does: resident under that role (RESIDENT_ROLES has no gradients role; only the timm
    # training cache traces this way, and it reads times, not the memory breakdown).
    legacy_grads = mode == "train" and _TORCH112_SGD.get()
    resident = {"inputs": _tensors((p.args, plain, p.labels)),
                "optimizer_state": state + (_zero_filled_grads(p) if legacy_grads else [])}
    # the warm-up grows the cache: the kept step starts from a copy of it as it was
    pristine = copy.deepcopy(p.kwargs[key]) if key is not None and warmup else None
    try:
        if warmup:
            with fixed_host_rng(), trace(p.net, gpu=gpu, nonzero=nonzero, meta=p.meta,
                                         resident={**resident, **kv_cache_resident(p)}):
                execute(p, loss_fn=loss_fn, optimizer=opt)
            # The warm-up must not change the state the kept step starts from: without an
            # optimizer (which zeroes them) its gradients would be resident in the kept trace,
            # and a KV cache would have grown by its tokens.
            for param in p.net.parameters():
                param.grad = None
            if legacy_grads:  # fresh zero-filled gradients (the step's in-place updates
                # keep the optimizer's state tensors the same objects)
                resident["optimizer_state"] = state + _zero_filled_grads(p)
            if key is not None:
                p.kwargs[key] = pristine
        with fixed_host_rng(), trace(p.net, gpu=gpu, nonzero=nonzero, meta=p.meta,
                                     resident={**resident, **kv_cache_resident(p)}) as result:
            execute(p, loss_fn=loss_fn, optimizer=opt)
        if known_values:
            result.meta["items_answered"] = p.items_answered
            result.meta["shapes_sized"] = p.shapes_sized
    except TraceError as exc:
        b = p.meta.get("batch_size")
        if b is not None and "overflow" in str(exc).lower():
            raise BatchSizeError(f"batch_size {b} is too large: a tensor of {p.meta['model']} "
                                 f"would overflow ({exc}). Use a realistic batch size.") from exc
        raise
    return result


def _tensors(value: object) -> list[torch.Tensor]:
    """The tensors in nested tuples / lists / dicts (and a transformers KV cache's layers), in
    order."""
    if isinstance(value, torch.Tensor):
        return [value]
    layers = getattr(value, "layers", None)
    if type(value).__name__.endswith("Cache") and isinstance(layers, list):
        return [t for layer in layers for t in vars(layer).values()
                if isinstance(t, torch.Tensor)]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _prime_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create the optimizer's state with one untraced step on zero gradients (meta tensors: no
    arithmetic happens), without the cost of a whole forward and backward."""
    params = [q for group in opt.param_groups for q in group["params"]]
    for q in params:
        q.grad = torch.zeros_like(q)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _zero_filled_grads(p: Prepared) -> list[torch.Tensor]:
    """Give every trainable parameter a zero-filled gradient, untraced (torch112_sgd_step: the
    benchmark zeroed them outside its timed step); returns them, resident before the step."""
    grads = []
    for q in p.net.parameters():
        if q.requires_grad:
            q.grad = torch.zeros_like(q)
            grads.append(q.grad)
    return grads


def make_optimizer(p: Prepared) -> torch.optim.Optimizer | None:
    """The optimizer `execute` makes for `p` (None in inference mode or with optimizer='none').
    Pass one to `execute(p, optimizer=...)` to run several steps with the same state."""
    if p.meta["mode"] != "train":
        return None
    params = [q for q in p.net.parameters() if q.requires_grad]
    return _make_optimizer(p.meta["optimizer"] or "none", params)


# The seed of the host's random draws inside every traced step (see fixed_host_rng).
HOST_SEED = 0


@contextmanager
def fixed_host_rng() -> Iterator[None]:
    """Draw the host's random numbers from HOST_SEED, then give the caller's generators back.

    A model's host-side draws decide which kernels a step runs (LayerDrop's ``torch.rand([])``
    or ``random.uniform`` skips whole layers; SpecAugment's numpy masks size an indexing): a
    fixed seed makes a prediction deterministic. torch's CPU generator, Python's and numpy's
    global ones are restored after. Around each traced step, not inside execute: it costs
    ~0.1 ms of host time, which a timed loop of real steps must not pay."""
    try:
        import numpy as np
    except ImportError:  # (not a dependency of blink or torch; then nothing draws from it)
        np = None
    py_state = random.getstate()
    np_state = np.random.get_state() if np is not None else None
    torch_state = torch.random.get_rng_state()
    torch.random.default_generator.manual_seed(HOST_SEED)
    random.seed(HOST_SEED)
    if np is not None:
        np.random.seed(HOST_SEED)
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(py_state)
        if np is not None:
            np.random.set_state(np_state)


def execute(p: Prepared, *, loss_fn: Callable[[object], torch.Tensor] | None = None,
            optimizer: torch.optim.Optimizer | None = None,
            on_phase: Callable[[int], None] | None = None) -> None:
    """Run the prepared inference forward or training step (traced or not: the caller decides).

    optimizer: the one to step (keeps its state across calls); None makes a fresh one, so the
    step includes creating the optimizer state. on_phase(code) is called with 1 before the
    backward pass, 2 before the optimizer step and 0 after each (phase markers for a tracer
    other than blink's own, e.g. blink._cupti).
    """
    mode = p.meta["mode"]
    opt = optimizer if optimizer is not None else make_optimizer(p)
    with ExitStack() as stack:
        amp = stack.enter_context(ExitStack())
        if p.amp_dtype is not None:
            from .autocast import meta_autocast

            amp.enter_context(meta_autocast(p.amp_dtype))
        if mode == "inference":
            stack.enter_context(torch.no_grad())
        if p.known_values:
            follow = stack.enter_context(p.known_values_mode())
            stack.callback(lambda: setattr(p, "items_answered", follow.answered))
            stack.callback(lambda: setattr(p, "shapes_sized", follow.sized))
        out = p.net(*p.args, **p.kwargs)
        if mode == "inference":
            del out
            return
        loss = loss_fn(out) if loss_fn is not None else _default_loss(out, p.labels)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = (type(loss).__name__ if not isinstance(loss, torch.Tensor)
                    else f"a tensor of shape {tuple(loss.shape)}")
            raise ConfigError(f"loss_fn returned {what}; it must return the loss as a "
                              "one-element tensor, e.g. lambda out: out.logits.float().mean()")
        amp.close()  # autocast covers forward and loss, never backward
        del out
        tracing = _C.tracer_active()
        if tracing:
            _C.tracer_set_phase(1)
        if on_phase is not None:
            on_phase(1)
        loss.backward()
        del loss
        if tracing:
            _C.tracer_set_phase(0)
        if on_phase is not None:
            on_phase(0)
        if opt is not None:
            if on_phase is not None:
                on_phase(2)
            opt.step()  # the optimizer hooks mark its phase for blink's tracer
            opt.zero_grad(set_to_none=True)
            if on_phase is not None:
                on_phase(0)
