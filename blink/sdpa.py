"""Which fused kernel ``F.scaled_dot_product_attention`` picks on a CUDA GPU that is not here.

PyTorch chooses the SDPA kernel at run time, on the GPU, in ``sdp::select_sdp_backend``
(``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, with shared checks in
``aten/src/ATen/native/transformers/sdp_utils_cpp.h``), and ``at::native::
scaled_dot_product_attention`` (``aten/src/ATen/native/transformers/attention.cpp``) then calls
the matching aten op. Blink traces on the meta device, where that choice is never made (meta
tensors always take the math path), so this module re-implements it for a *target* GPU:

* :func:`choose_sdpa_backend` -- the choice, from shapes, strides, dtype and flags;
* :func:`explain_sdpa_choice` -- the same, with the reason each backend was turned down;
* :func:`call_fused_sdpa` -- call the aten op of a backend exactly as ``attention.cpp`` does;
* :func:`target_scaled_dot_product_attention` -- all of ``at::native::scaled_dot_product_attention``
  (empty-input path, unbatched inputs, choice, call) for a target GPU, for use as an override.

The rules are those of the CUDA 13 wheels of torch 2.11, 2.12, 2.13 and 2.14 (``torch_version``
selects them; the default is the running torch). They were checked case by case against the
C++ ``select_sdp_backend`` of each of those wheels, run on a faked device (the golden test in
``tests/test_sdpa.py``, made by ``scripts/sdpa_oracle/``). Differences between versions:

* priority: the default order is flash, efficient, math, cudnn (so cuDNN is never reached while
  math is enabled), but ``check_prefer_cudnn_attention`` puts cuDNN first when the runtime cuDNN
  is newer than 9.15.0 on sm90 / sm10x; 2.11-2.12 require minor 0 or 3 (sm90, sm100, sm103),
  2.13+ CUDA>=13 builds take any 10.x minor. ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` turns it off,
  and an order set with ``sdpa_kernel(..., set_priority=True)`` replaces it.
* 2.12+: cuDNN needs a dropout that is a multiple of 1/16 (``check_cudnn_dropout``).
* 2.13+: cuDNN needs batch and heads <= 65535; mem-efficient needs q/k/v storage offsets aligned
  on sm80+ (``check_data_ptr_alignment_mem_efficient``).
* 2.14: cuDNN head-dim limit 256 on sm90/sm10x only with cuDNN > 9.22 (was: sm90 with cuDNN >=
  9.10), backward head-dim pairs limited (``check_cudnn_d256_bprop_head_dim``), decode (s_q == 1)
  disabled on sm10x/sm11x for cuDNN 9.19-9.25.0 except 9.24.x; mem-efficient accepts GQA; all
  three fused kernels accept MQA (key and value with one head) without ``enable_gqa``;
  ``attention.cpp`` runs 3-D (unbatched) inputs as a batch of one.
* 2.12+: ``attention.cpp`` returns zeros for empty inputs without choosing a kernel.

Only dense (non-nested) tensors are modelled. ROCm is not modelled.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import torch

from .errors import ConfigError, TraceError

__all__ = [
    "SDPA_BACKENDS",
    "SDPAChoice",
    "call_fused_sdpa",
    "choose_sdpa_backend",
    "choose_sdpa_backend_for_tensors",
    "explain_sdpa_choice",
    "target_scaled_dot_product_attention",
    "torch24_math_sdpa",
]

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")

# at::Context's default sdp_priority_order (flash, efficient, math, cudnn, overrideable).
_DEFAULT_ORDER = ("flash", "efficient", "math", "cudnn")
# priority_order() when check_prefer_cudnn_attention() holds.
_CUDNN_FIRST_ORDER = ("cudnn", "flash", "efficient", "math")
_OLDEST_RULES = (2, 11)
_NEWEST_RULES = (2, 14)
# cuDNN runtime version shipped with the cu130 wheel of each torch minor (nvidia-cudnn-cu13 pin).
_WHEEL_CUDNN = {(2, 11): 91900, (2, 12): 92000, (2, 13): 92000, (2, 14): 92400}

# Every rule that differs between the torch minors, as the first minor whose rules have it.
_V_EMPTY_INPUTS = (2, 12)  # attention.cpp: an empty q, k or v gives zeros, no kernel is chosen
_V_CUDNN_DROPOUT = (2, 12)  # check_cudnn_dropout
_V_EMPTY_OUTPUT = (2, 13)  # attention.cpp: "empty" is an empty output or seq_len_kv == 0
_V_CUDNN_BATCH_HEADS = (2, 13)  # check_cudnn_tensor_shapes: batch and heads <= 65535
_V_MEM_EFFICIENT_ALIGNMENT = (2, 13)  # check_data_ptr_alignment_mem_efficient
_V_PREFER_CUDNN_ANY_SM10X = (2, 13)  # check_prefer_cudnn_attention: any 10.x minor (CUDA 13)
_V_CUDNN_D256 = (2, 14)  # kCuDNNFrontendSupportsD256 limits, check_cudnn_d256_bprop_head_dim
_V_CUDNN_DECODE_DISABLED = (2, 14)  # is_cudnn_attention_decode_disabled
_V_MEM_EFFICIENT_GQA = (2, 14)  # mem-efficient check_batch_size_and_num_heads_dense<true, ...>
_V_MQA = (2, 14)  # check_batch_size_and_num_heads_dense<..., supports_mqa = true>
_V_UNBATCHED = (2, 14)  # sdp::normalize_unbatched_input

# The torch.backends.cuda flag of each backend: enable_<flag>_sdp() and <flag>_sdp_enabled().
_TORCH_FLAG = {"flash": "flash", "efficient": "mem_efficient", "cudnn": "cudnn", "math": "math"}
# Each fused kernel's name in reasons, and the SMs it runs on, both ends inclusive
# (check_{flash_attention,mem_efficient,cudnn}_hardware_support).
_LABEL = {"flash": "flash", "efficient": "mem-efficient", "cudnn": "cuDNN attention"}
_SM_RANGE = {"flash": ((8, 0), (12, 1)), "efficient": ((5, 0), (12, 1)), "cudnn": ((8, 0), (12, 1))}

_HALF_DTYPES = (torch.float16, torch.bfloat16)
_FP8_E4M3 = getattr(torch, "float8_e4m3fn", None)


@dataclass(frozen=True)
class SDPAChoice:
    """The outcome of :func:`explain_sdpa_choice`.

    ``backend`` is the chosen backend (one of :data:`SDPA_BACKENDS`), ``order`` the priority
    order that was tried, and ``reasons`` maps every backend to why it was turned down (``None``
    where it is usable; for ``math`` only the enable flag matters).
    """

    backend: str
    order: tuple[str, ...]
    reasons: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Params:
    """sdp::sdp_params, as plain numbers."""

    cc: tuple[int, int]
    dtype: torch.dtype
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    q_stride: tuple[int, ...]
    k_stride: tuple[int, ...]
    v_stride: tuple[int, ...]
    offsets: tuple[int, int, int]
    has_mask: bool
    mask_shape: tuple[int, ...] | None
    mask_stride: tuple[int, ...] | None
    mask_requires_grad: bool
    dropout: float
    is_causal: bool
    enable_gqa: bool
    requires_grad: bool  # sdp::input_requires_grad: any input requires grad and grad mode on


@dataclass(frozen=True)
class _Env:
    """Everything outside the tensors that the choice depends on."""

    rules: tuple[int, int]
    cudnn: int
    cuda: tuple[int, int]
    enabled: Mapping[str, bool]
    deterministic: bool
    fa3: bool


# --------------------------------------------------------------------------------------------
# small helpers


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride = []
    running = 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(int(size), 1)
    return tuple(reversed(stride))


def _parse_version(version: str | Sequence[int] | None) -> tuple[int, int]:
    if version is None:
        version = torch.__version__
    if isinstance(version, str):
        parts = version.split("+")[0].split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError) as exc:
            raise ConfigError(f"cannot read a torch version from {version!r}") from exc
    values = tuple(int(x) for x in version)
    if len(values) < 2:
        raise ConfigError(f"a torch version needs a major and a minor number, got {version!r}")
    return values[0], values[1]


def _rules_for(torch_version: str | Sequence[int] | None) -> tuple[int, int]:
    """The rule set used for a torch version: 2.11-2.14 exactly, nearest otherwise."""
    return max(_OLDEST_RULES, min(_NEWEST_RULES, _parse_version(torch_version)))


def _local_cudnn_version() -> int | None:
    try:
        return torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - a CPU-only build has no cuDNN
        return None


def _cuda_version_tuple(cuda_version: str | Sequence[int] | None) -> tuple[int, int]:
    if cuda_version is None:
        cuda_version = torch.version.cuda or "13.0"
    if isinstance(cuda_version, str):
        parts = cuda_version.split(".")
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    values = tuple(int(x) for x in cuda_version)
    return values[0], values[1] if len(values) > 1 else 0


_ENABLED_ALIASES = {
    "flash": "flash",
    "flash_attention": "flash",
    "efficient": "efficient",
    "mem_efficient": "efficient",
    "efficient_attention": "efficient",
    "cudnn": "cudnn",
    "cudnn_attention": "cudnn",
    "math": "math",
}


def _resolve_enabled(enabled: Mapping[str, bool] | None) -> dict[str, bool]:
    backends = torch.backends.cuda
    flags = {
        name: bool(getattr(backends, f"{flag}_sdp_enabled")()) for name, flag in _TORCH_FLAG.items()
    }
    for key, value in (enabled or {}).items():
        name = _ENABLED_ALIASES.get(key)
        if name is None:
            raise ConfigError(f"unknown SDPA backend {key!r} in enabled; use {SDPA_BACKENDS}")
        flags[name] = bool(value)
    return flags


def _sm_in(cc: tuple[int, int], lower: tuple[int, int], upper: tuple[int, int]) -> bool:
    # check_sm_version<lower, upper>: inclusive on both ends.
    return lower <= cc <= upper


def _sm90_or_sm10x(cc: tuple[int, int]) -> bool:
    return cc == (9, 0) or cc[0] == 10


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _first_failure(checks: Iterator[str | None]) -> str | None:
    # The use_<backend> loops: the first filter that fails decides (filters run lazily, in order).
    for reason in checks:
        if reason is not None:
            return reason
    return None


# --------------------------------------------------------------------------------------------
# shared checks (sdp_utils_cpp.h)


def _check_runtime_enabled(backend: str, env: _Env) -> str | None:
    # check_runtime_disabled_{flash,mem_efficient,cudnn}: the torch.backends.cuda flag.
    if env.enabled[backend]:
        return None
    return f"disabled (torch.backends.cuda.enable_{_TORCH_FLAG[backend]}_sdp(False))"


def _check_hardware(backend: str, p: _Params) -> str | None:
    # check_{flash_attention,mem_efficient,cudnn}_hardware_support: the kernel's SM range.
    lower, upper = _SM_RANGE[backend]
    if _sm_in(p.cc, lower, upper):
        return None
    return f"{_LABEL[backend]} needs {_sm(lower)}..{_sm(upper)}, target is {_sm(p.cc)}"


def _check_tensor_shapes(p: _Params) -> str | None:
    # check_tensor_shapes: q, k, v all 4-D.
    if not (len(p.q) == len(p.k) == len(p.v) == 4):
        return f"fused kernels need 4-D query/key/value, got {len(p.q)}-D/{len(p.k)}-D/{len(p.v)}-D"
    return None


def _check_for_attn_mask(p: _Params) -> str | None:
    # check_for_attn_mask: flash takes no attn_mask.
    return "flash attention does not take an attn_mask" if p.has_mask else None


def _check_attn_mask_shape(p: _Params) -> str | None:
    # check_attn_mask_shape: no grad on the mask, 2-D (L|1, S|1) or 4-D (B|1, H|1, L|1, S|1).
    if not p.has_mask or p.mask_shape is None:
        return None
    if p.mask_requires_grad:
        return "attn_mask requires grad"
    m = p.mask_shape
    batch, heads, seq_q, seq_k = p.q[0], p.q[1], p.q[2], p.k[2]
    ok = len(m) >= 2 and m[-2] in (seq_q, 1) and m[-1] in (seq_k, 1)
    ok = ok and (len(m) == 2 or (len(m) == 4 and m[0] in (1, batch) and m[1] in (1, heads)))
    return None if ok else f"attn_mask shape {m} is not (L|1, S|1) or (B|1, H|1, L|1, S|1)"


def _check_nonzero_sequence_lengths(p: _Params) -> str | None:
    # check_nonzero_sequence_lengths_dense: seq_len_q and seq_len_kv > 0.
    return "zero seq_len_q or seq_len_kv" if p.q[-2] == 0 or p.k[-2] == 0 else None


def _check_last_dim_stride_1(p: _Params, *, ignore_singleton_dim: bool) -> str | None:
    # check_last_dim_stride_equals_1_dense<ignore_singleton_dim>: q, k, v (and mask) stride(-1)==1.
    qkv_ok = p.q_stride[-1] == 1 and p.k_stride[-1] == 1 and p.v_stride[-1] == 1
    if ignore_singleton_dim:
        qkv_ok = qkv_ok or p.q[-1] == 1
    mask_ok = not p.has_mask or p.mask_stride is None or p.mask_stride[-1] == 1
    return None if qkv_ok and mask_ok else "an input's (or the mask's) last stride is not 1"


def _check_grouped_query_attention(p: _Params, *, requires_same_num_heads: bool) -> str | None:
    # check_grouped_query_attention<requires_same_num_heads>.
    hq, hk, hv = p.q[1], p.k[1], p.v[1]
    if requires_same_num_heads and hk != hv:
        return f"GQA needs key and value with the same number of heads, got {hk} and {hv}"
    if hk == 0 or hq % hk != 0 or (not requires_same_num_heads and (hv == 0 or hq % hv != 0)):
        return f"key/value heads ({hk}, {hv}) must divide query heads ({hq})"
    return None


def _check_batch_size_and_num_heads(
    p: _Params, env: _Env, *, supports_gqa: bool, requires_same_num_heads: bool
) -> str | None:
    # check_batch_size_and_num_heads_dense<supports_gqa, requires_same_num_heads[, supports_mqa]>,
    # where every fused kernel has supports_mqa from 2.14.
    if not (p.q[0] == p.k[0] == p.v[0]):
        return f"query/key/value batch sizes differ: {p.q[0]}, {p.k[0]}, {p.v[0]}"
    if p.enable_gqa and supports_gqa:
        return _check_grouped_query_attention(p, requires_same_num_heads=requires_same_num_heads)
    if p.q[1] == p.k[1] == p.v[1]:
        return None
    if env.rules >= _V_MQA and p.k[1] == 1 and p.v[1] == 1:  # key/value with one head (MQA)
        return None
    return f"query/key/value heads differ ({p.q[1]}, {p.k[1]}, {p.v[1]}) without enable_gqa"


def _check_dtype(p: _Params, allowed: Sequence[torch.dtype]) -> str | None:
    # check_tensor_dtype: q, k, v share one dtype in the allowed list.
    if p.dtype in allowed:
        return None
    names = ", ".join(_dtype_name(d) for d in allowed)
    return f"dtype {_dtype_name(p.dtype)} is not one of {{{names}}}"


def _low_precision_dtypes(cc: tuple[int, int]) -> tuple[torch.dtype, ...]:
    # check_dtypes_low_precision: fp16, and bf16 on sm80+.
    return _HALF_DTYPES if cc[0] >= 8 else (torch.float16,)


# --------------------------------------------------------------------------------------------
# flash attention (can_use_flash_attention)


def _flash_checks(p: _Params, env: _Env) -> Iterator[str | None]:
    yield _check_runtime_enabled("flash", env)  # check_runtime_disabled_flash
    yield _check_tensor_shapes(p)  # check_tensor_shapes
    yield _check_for_attn_mask(p)  # check_for_attn_mask
    yield _flash_head_dim(p)  # check_head_dim_size_flash
    yield _check_hardware("flash", p)  # check_flash_attention_hardware_support
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    yield _flash_grad_head_dim(p)
    yield _flash_causal_square(p)  # check_flash_causal_non_square_seqlens
    yield _flash_dtype(p, env)  # check_dtypes_flash_attention
    # check_batch_size_and_num_heads_dense<true, true[, true]>
    yield _check_batch_size_and_num_heads(p, env, supports_gqa=True, requires_same_num_heads=True)
    yield _check_nonzero_sequence_lengths(p)  # check_nonzero_sequence_lengths_dense
    yield _check_last_dim_stride_1(p, ignore_singleton_dim=True)  # ..._equals_1_dense<true>


def _flash_head_dim(p: _Params) -> str | None:
    # check_head_dim_size_flash: q, k, v head dims equal and <= 256 (odd sizes are padded to 8).
    dq, dk, dv = p.q[-1], p.k[-1], p.v[-1]
    if dq == dk == dv and dq <= 256:
        return None
    return f"flash needs equal head dims <= 256, got q={dq} k={dk} v={dv}"


def _flash_grad_head_dim(p: _Params) -> str | None:
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: training on
    # sm86-sm89 / sm120-sm121 needs head_dim <= 192, or > 224 without dropout.
    if not p.requires_grad:
        return None
    if not (_sm_in(p.cc, (8, 6), (8, 9)) or _sm_in(p.cc, (12, 0), (12, 1))):
        return None
    head_dim = p.q[-1]
    if head_dim <= 192 or (p.dropout <= 0.0 and head_dim > 224):
        return None
    return f"flash backward on {_sm(p.cc)} does not support head_dim {head_dim} here"


def _flash_causal_square(p: _Params) -> str | None:
    # check_flash_causal_non_square_seqlens: is_causal needs seq_len_q == seq_len_kv.
    if p.is_causal and len(p.q) >= 2 and len(p.k) >= 2 and p.q[-2] != p.k[-2]:
        return f"flash is_causal needs seq_len_q == seq_len_kv, got {p.q[-2]} and {p.k[-2]}"
    return None


def _flash_dtype(p: _Params, env: _Env) -> str | None:
    # check_dtypes_flash_attention: fp16/bf16 (sm80+), plus fp8 e4m3 with FA3 on sm90+.
    if p.cc[0] >= 9 and env.fa3 and _FP8_E4M3 is not None:
        return _check_dtype(p, (_FP8_E4M3, *_HALF_DTYPES))
    return _check_dtype(p, _low_precision_dtypes(p.cc))


# --------------------------------------------------------------------------------------------
# memory-efficient attention (can_use_mem_efficient_attention)


def _minimum_gemm_alignment(p: _Params) -> int:
    # minimum_gemm_alignment: in elements, from use_tensor_cores() and the dtype width.
    is_half = p.dtype in _HALF_DTYPES
    use_tc = p.cc[0] >= 8 or (p.cc[0] >= 7 and is_half)
    alignment = 4 if p.cc[0] >= 8 else 1
    if use_tc:
        alignment = max(alignment, 128 // (16 if is_half else 32))
    return alignment


def _efficient_checks(p: _Params, env: _Env) -> Iterator[str | None]:
    yield _check_runtime_enabled("efficient", env)  # check_runtime_disabled_mem_efficient
    yield _check_hardware("efficient", p)  # check_mem_efficient_hardware_support
    yield _check_tensor_shapes(p)  # check_tensor_shapes
    yield _efficient_head_dim(p)  # check_head_dim_size_mem_efficient
    yield _efficient_ptr_alignment(p, env)  # check_data_ptr_alignment_mem_efficient (2.13+)
    yield _check_nonzero_sequence_lengths(p)  # check_nonzero_sequence_lengths_dense
    yield _check_last_dim_stride_1(p, ignore_singleton_dim=False)  # ..._equals_1_dense<false>
    yield _check_batch_size_and_num_heads(  # check_batch_size_and_num_heads_dense<gqa, true[, mqa]>
        p, env, supports_gqa=env.rules >= _V_MEM_EFFICIENT_GQA, requires_same_num_heads=True
    )
    yield _efficient_dtype(p)  # check_tensor_dtype (sm80+: fp16/fp32/bf16, else fp16/fp32)


def _efficient_head_dim(p: _Params) -> str | None:
    # check_head_dim_size_mem_efficient: q/k head dims equal; q and v head dims > 0 and
    # divisible by minimum_gemm_alignment (8 for fp16/bf16, 4 for fp32 on sm80+; 1 below sm75).
    alignment = _minimum_gemm_alignment(p)
    dq, dk, dv = p.q[-1], p.k[-1], p.v[-1]
    if dq == dk and dq > 0 and dv > 0 and dq % alignment == 0 and dv % alignment == 0:
        return None
    return f"mem-efficient needs head dims divisible by {alignment}, got q={dq} k={dk} v={dv}"


def _efficient_ptr_alignment(p: _Params, env: _Env) -> str | None:
    # check_data_ptr_alignment_mem_efficient (2.13+): on sm80+, storage_offset * element_size of
    # q, k, v must be a multiple of minimum_gemm_alignment * element_size (empty tensors pass).
    if env.rules < _V_MEM_EFFICIENT_ALIGNMENT or p.cc[0] < 8:
        return None
    element_size = p.dtype.itemsize
    alignment_bytes = _minimum_gemm_alignment(p) * element_size
    for shape, offset in zip((p.q, p.k, p.v), p.offsets, strict=True):
        if math.prod(shape) != 0 and (offset * element_size) % alignment_bytes != 0:
            return f"mem-efficient on sm80+ needs storage offsets aligned to {alignment_bytes} B"
    return None


def _efficient_dtype(p: _Params) -> str | None:
    # check_tensor_dtype: fp16, fp32, and bf16 on sm80+.
    if p.cc[0] >= 8:
        return _check_dtype(p, (torch.float16, torch.float32, torch.bfloat16))
    return _check_dtype(p, (torch.float16, torch.float32))


# --------------------------------------------------------------------------------------------
# cuDNN attention (can_use_cudnn_attention)


def _cudnn_checks(p: _Params, env: _Env) -> Iterator[str | None]:
    yield _cudnn_version_guards(p, env)  # CUDNN_VERSION guards in can_use_cudnn_attention
    yield _check_runtime_enabled("cudnn", env)  # check_runtime_disabled_cudnn
    yield _check_tensor_shapes(p)  # check_tensor_shapes
    yield _cudnn_deterministic(env)  # check_cudnn_deterministic
    yield _check_dtype(p, _low_precision_dtypes(p.cc))  # check_dtypes_low_precision
    yield _check_attn_mask_shape(p)  # check_attn_mask_shape
    yield _check_hardware("cudnn", p)  # check_cudnn_hardware_support
    yield _cudnn_dropout(p, env)  # check_cudnn_dropout (2.12+)
    yield _check_nonzero_sequence_lengths(p)  # check_nonzero_sequence_lengths_dense
    yield _check_last_dim_stride_1(p, ignore_singleton_dim=True)  # ..._equals_1_dense<true>
    # check_batch_size_and_num_heads_dense<true, false[, true]>
    yield _check_batch_size_and_num_heads(p, env, supports_gqa=True, requires_same_num_heads=False)
    yield _cudnn_tensor_shapes(p, env)  # check_cudnn_tensor_shapes
    yield _cudnn_d256_bprop(p, env)  # check_cudnn_d256_bprop_head_dim (2.14)


def _cudnn_version_guards(p: _Params, env: _Env) -> str | None:
    if env.cudnn < 90000:
        return f"cuDNN {env.cudnn} is older than 9.0.0"  # CUDNN_VERSION < 90000 guard
    if p.dropout > 0.0 and 91100 < env.cudnn < 91400:
        return "cuDNN 9.11-9.13 attention does not support dropout"  # can_use_cudnn_attention
    return None


def _cudnn_deterministic(env: _Env) -> str | None:
    # check_cudnn_deterministic: torch.use_deterministic_algorithms(True) without warn_only.
    return "cuDNN SDPA is not deterministic" if env.deterministic else None


def _cudnn_dropout(p: _Params, env: _Env) -> str | None:
    # check_cudnn_dropout (2.12+): dropout must be a multiple of 1/16.
    if env.rules >= _V_CUDNN_DROPOUT and p.dropout * 16.0 != math.floor(p.dropout * 16.0):
        return f"cuDNN dropout must be a multiple of 1/16, got {p.dropout}"
    return None


def _cudnn_supports_d256(p: _Params, env: _Env) -> bool:
    # 2.14: kCuDNNFrontendSupportsD256 && cudnn > 9.22 && (sm90 || sm10x) && !(sm107 && <= 9.25).
    unsupported_sm107 = p.cc == (10, 7) and env.cudnn <= 92500
    return env.cudnn > 92200 and _sm90_or_sm10x(p.cc) and not unsupported_sm107


def _cudnn_decode_disabled(p: _Params, env: _Env) -> bool:
    # is_cudnn_attention_decode_disabled (2.14): cuDNN 9.19.0-9.25.0 except 9.24.x, on sm10x/sm11x.
    if env.rules < _V_CUDNN_DECODE_DISABLED or p.cc[0] not in (10, 11):
        return False
    return 91900 <= env.cudnn <= 92500 and not 92401 <= env.cudnn <= 92499


def _cudnn_head_dim_limit(p: _Params, env: _Env) -> int:
    # The head-dim limit of check_cudnn_tensor_shapes: 256 where d256 is supported, 192 for the
    # (192, 128) DeepSeek shape from cuDNN 9.11, else 128.
    if env.rules >= _V_CUDNN_D256:
        d256 = _cudnn_supports_d256(p, env)
        deepseek_sms = _sm90_or_sm10x(p.cc)
    else:  # 2.11-2.13: sm90 gets 256 from cuDNN 9.10; sm10x gets the DeepSeek shape from 9.11.
        d256 = env.cudnn >= 91000 and p.cc == (9, 0)
        deepseek_sms = p.cc[0] == 10
    if d256:
        return 256
    if deepseek_sms and env.cudnn >= 91100 and (p.q[3], p.v[3]) == (192, 128):
        return 192
    return 128


def _cudnn_tensor_shapes(p: _Params, env: _Env) -> str | None:
    # check_cudnn_tensor_shapes.
    if env.rules >= _V_CUDNN_BATCH_HEADS and (p.q[0] > 65535 or p.q[1] > 65535):
        return "cuDNN attention needs batch and num_heads <= 65535"
    if env.cudnn < 8903:
        return "cuDNN attention needs cuDNN 8.9.3"
    if env.cudnn < 8906 and p.dropout != 0.0:
        return "cuDNN attention dropout needs cuDNN 8.9.6"
    s_q, s_k, d_qk, d_v = p.q[2], p.k[2], p.q[3], p.v[3]
    if s_q == 1 and _cudnn_decode_disabled(p, env):
        return f"cuDNN decode (seq_len_q 1) is disabled on sm{p.cc[0]}x with cuDNN {env.cudnn}"
    limit = _cudnn_head_dim_limit(p, env)
    if d_qk > limit or d_v > limit:
        return f"cuDNN attention head_dim must be <= {limit}, got q={d_qk} v={d_v}"
    if d_qk % 8 != 0 or d_v % 8 != 0:
        return f"cuDNN attention head_dim must be a multiple of 8, got q={d_qk} v={d_v}"
    if env.cudnn < 8906 and s_k % 64 != 0:
        return "seq_len_kv not a multiple of 64 needs cuDNN 8.9.6"
    if env.cudnn < 90000:
        if s_q < 64:
            return "seq_len_q < 64 needs cuDNN 9.0.0"
        if p.dropout != 0.0 and (s_q % 64 != 0 or s_k % 64 != 0):
            return "dropout with seq_len not a multiple of 64 needs cuDNN 9.0.0"
    if s_k == 1:
        return "cuDNN attention does not support seq_len_kv 1"
    if p.dropout != 0.0 and s_q == 1:
        return "cuDNN attention does not support seq_len_q 1 with dropout"
    return None


def _cudnn_d256_bprop(p: _Params, env: _Env) -> str | None:
    # check_cudnn_d256_bprop_head_dim (2.14): with d256 support, training needs head dims
    # (<=128, <=128), (192, 128) or (256, 256).
    if env.rules < _V_CUDNN_D256 or not p.requires_grad or not _cudnn_supports_d256(p, env):
        return None
    d_qk, d_v = p.q[3], p.v[3]
    if (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256)):
        return None
    return f"cuDNN backward on {_sm(p.cc)} does not support head dims ({d_qk}, {d_v})"


# The checks of each fused kernel (can_use_<kernel>_attention), in SDPA_BACKENDS order.
_FUSED_CHECKS: dict[str, Callable[[_Params, _Env], Iterator[str | None]]] = {
    "flash": _flash_checks,
    "efficient": _efficient_checks,
    "cudnn": _cudnn_checks,
}


# --------------------------------------------------------------------------------------------
# priority order (priority_order / check_prefer_cudnn_attention) and select_sdp_backend


def _prefers_cudnn(cc: tuple[int, int], env: _Env) -> bool:
    # check_prefer_cudnn_attention: not TORCH_CUDNN_SDPA_DEPRIORITIZED=1, runtime cuDNN > 9.15.0,
    # sm9x/sm10x; minor 0 or 3 in 2.11-2.12 and in 2.13+ builds for CUDA < 13.
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1":
        return False
    if env.cudnn <= 91500 or cc[0] not in (9, 10):
        return False
    if env.rules < _V_PREFER_CUDNN_ANY_SM10X or env.cuda < (13, 0):
        return cc[1] in (0, 3)
    return True


# at::SDPBackend values, as returned by torch._C._get_sdp_priority_order().
_BACKEND_IDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
_UNTOUCHED_ORDER = [1, 2, 0, 3, 4]


def _user_priority() -> tuple[str, ...] | None:
    """The order set with ``sdpa_kernel(..., set_priority=True)`` in this process, if any."""
    getter = getattr(torch._C, "_get_sdp_priority_order", None)
    if getter is None:
        return None
    ids = list(getter())
    if ids == _UNTOUCHED_ORDER:
        return None
    return tuple(_BACKEND_IDS[i] for i in ids if i in _BACKEND_IDS)


def _normalize_priority(priority: Sequence[object], fallback: Sequence[str]) -> tuple[str, ...]:
    # sdpa_kernel(set_priority=True) appends the backends it was not given in their old order.
    order: list[str] = []
    for name in priority:
        if isinstance(name, int) or hasattr(name, "value"):
            key = _BACKEND_IDS.get(int(getattr(name, "value", name)))  # type: ignore[arg-type]
        else:
            text = str(name).lower().rsplit(".", 1)[-1]
            key = _ENABLED_ALIASES.get(text)
        if key is None:
            raise ConfigError(f"unknown SDPA backend {name!r} in priority; use {SDPA_BACKENDS}")
        if key not in order:
            order.append(key)
    return tuple(order) + tuple(b for b in fallback if b not in order)


def _select(p: _Params, env: _Env, priority: Sequence[str] | None) -> SDPAChoice:
    # select_sdp_backend: the first backend in priority order whose checks all pass.
    reasons = {name: _first_failure(checks(p, env)) for name, checks in _FUSED_CHECKS.items()}
    reasons["math"] = None if env.enabled["math"] else "disabled (enable_math_sdp(False))"
    order = _CUDNN_FIRST_ORDER if _prefers_cudnn(p.cc, env) else _DEFAULT_ORDER
    if priority is None:
        priority = _user_priority()
    if priority is not None:
        order = _normalize_priority(priority, order)
    for backend in order:
        if reasons[backend] is None:
            return SDPAChoice(backend=backend, order=order, reasons=reasons)
    details = "; ".join(f"{name}: {reasons[name]}" for name in SDPA_BACKENDS)
    raise TraceError(
        f"No available SDPA kernel on {_sm(p.cc)} (torch would abort): {details}",
        op="aten::scaled_dot_product_attention",
    )


# --------------------------------------------------------------------------------------------
# the public choice


def _as_tuple(values: Sequence[int] | None, what: str) -> tuple[int, ...] | None:
    if values is None:
        return None
    try:
        return tuple(int(x) for x in values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} must be a sequence of ints, got {values!r}") from exc


def explain_sdpa_choice(
    *,
    compute_capability: tuple[int, int],
    dtype: torch.dtype,
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    v_shape: Sequence[int],
    has_attn_mask: bool,
    attn_mask_dtype: torch.dtype | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
    requires_grad: bool,
    q_stride: Sequence[int] | None = None,
    k_stride: Sequence[int] | None = None,
    v_stride: Sequence[int] | None = None,
    enabled: dict[str, bool] | None = None,
    attn_mask_shape: Sequence[int] | None = None,
    attn_mask_stride: Sequence[int] | None = None,
    attn_mask_requires_grad: bool = False,
    storage_offsets: Sequence[int] | None = None,
    torch_version: str | Sequence[int] | None = None,
    cudnn_version: int | None = None,
    cuda_version: str | Sequence[int] | None = None,
    deterministic: bool | None = None,
    fa3_enabled: bool | None = None,
    priority: Sequence[str] | None = None,
) -> SDPAChoice:
    """Like :func:`choose_sdpa_backend`, but also says why each backend was turned down."""
    cc = _as_tuple(compute_capability, "compute_capability")
    if cc is None or len(cc) != 2:
        raise ConfigError(f"compute_capability must be (major, minor), got {compute_capability!r}")
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"dtype must be a torch.dtype, got {dtype!r}")
    q = _as_tuple(q_shape, "q_shape") or ()
    k = _as_tuple(k_shape, "k_shape") or ()
    v = _as_tuple(v_shape, "v_shape") or ()
    if min(len(q), len(k), len(v)) < 2:
        raise ConfigError("query, key and value must be at least 2-D")
    if has_attn_mask and attn_mask_dtype is not None:
        # validate_sdpa_input: the mask is bool, float32 or the query dtype.
        if attn_mask_dtype not in (torch.bool, torch.float32, dtype):
            raise ConfigError(
                f"attn_mask dtype must be bool, float32 or {_dtype_name(dtype)}, "
                f"got {_dtype_name(attn_mask_dtype)}"
            )
    offsets = _as_tuple(storage_offsets, "storage_offsets") or (0, 0, 0)
    if len(offsets) != 3:
        raise ConfigError(f"storage_offsets must be three ints (q, k, v), got {storage_offsets!r}")
    mask_shape = _as_tuple(attn_mask_shape, "attn_mask_shape") if has_attn_mask else None
    mask_stride = _as_tuple(attn_mask_stride, "attn_mask_stride") if has_attn_mask else None
    if mask_stride is None and mask_shape is not None:
        mask_stride = _contiguous_stride(mask_shape)
    p = _Params(
        cc=(cc[0], cc[1]),
        dtype=dtype,
        q=q,
        k=k,
        v=v,
        q_stride=_as_tuple(q_stride, "q_stride") or _contiguous_stride(q),
        k_stride=_as_tuple(k_stride, "k_stride") or _contiguous_stride(k),
        v_stride=_as_tuple(v_stride, "v_stride") or _contiguous_stride(v),
        offsets=(offsets[0], offsets[1], offsets[2]),
        has_mask=bool(has_attn_mask),
        mask_shape=mask_shape,
        mask_stride=mask_stride,
        mask_requires_grad=bool(attn_mask_requires_grad) and bool(has_attn_mask),
        dropout=float(dropout_p),
        is_causal=bool(is_causal),
        enable_gqa=bool(enable_gqa),
        requires_grad=bool(requires_grad),
    )
    rules = _rules_for(torch_version)
    if cudnn_version is None:  # this process's cuDNN for the running torch, else the wheel's
        local = _local_cudnn_version() if torch_version is None else None
        cudnn_version = local or _WHEEL_CUDNN[rules]
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled() and not (
            torch.is_deterministic_algorithms_warn_only_enabled()
        )
    if fa3_enabled is None:
        getter = getattr(torch._C, "_get_fa3_sdp_enabled", None)
        fa3_enabled = bool(getter()) if getter is not None else False
    env = _Env(
        rules=rules,
        cudnn=int(cudnn_version),
        cuda=_cuda_version_tuple(cuda_version),
        enabled=_resolve_enabled(enabled),
        deterministic=bool(deterministic),
        fa3=bool(fa3_enabled),
    )
    return _select(p, env, priority)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _parameters_of(source: Callable[_P, Any]) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Give the decorated function ``source``'s parameters (for inspect, help() and typing)."""

    def apply(fn: Callable[..., _R]) -> Callable[_P, _R]:
        returns = inspect.signature(fn).return_annotation
        signature = inspect.signature(source).replace(return_annotation=returns)
        fn.__signature__ = signature  # type: ignore[attr-defined]
        return fn

    return apply


@_parameters_of(explain_sdpa_choice)
def choose_sdpa_backend(**kwargs: Any) -> str:
    """The SDPA backend PyTorch's CUDA ``select_sdp_backend`` would pick on the target GPU.

    Returns one of :data:`SDPA_BACKENDS`. Shapes are those the kernel sees: 4-D
    ``(batch, heads, seq, head_dim)`` (anything else can only run the math kernel; see
    :func:`choose_sdpa_backend_for_tensors` for the unbatched inputs that torch 2.14 lifts to
    4-D). ``requires_grad`` is ``sdp::input_requires_grad``: any of q/k/v requires grad *and*
    grad mode is on. Strides default to contiguous.

    ``enabled`` overrides ``torch.backends.cuda.{flash,mem_efficient,cudnn,math}_sdp_enabled()``
    (keys ``flash``, ``efficient``, ``cudnn``, ``math``; missing keys read torch's flags).

    Extras beyond the basic description, all optional:

    * ``attn_mask_shape`` / ``attn_mask_stride`` / ``attn_mask_requires_grad``: cuDNN takes only
      2-D ``(L|1, S|1)`` or 4-D ``(B|1, H|1, L|1, S|1)`` masks without grad, and every fused
      kernel wants the mask's last stride to be 1. Without a shape the mask is assumed fine.
    * ``storage_offsets``: ``(q, k, v)`` storage offsets in elements (mem-efficient, 2.13+).
    * ``torch_version``: the target's torch (``"2.11"``, ``(2, 14)``); default the running one.
      Versions before 2.11 use the 2.11 rules, after 2.14 the 2.14 rules.
    * ``cudnn_version``: the target's runtime cuDNN as an int (9.19.0 -> ``91900``). Default:
      this process's cuDNN when ``torch_version`` is not given, else the cuDNN that the cu130 wheel
      of that torch ships (2.11: 9.19, 2.12/2.13: 9.20, 2.14: 9.24).
    * ``cuda_version``: the CUDA of the target's torch build (default this torch's).
    * ``deterministic``: ``torch.use_deterministic_algorithms(True)`` without warn_only (turns
      cuDNN off); default: read torch's setting. ``fa3_enabled``: FA3 flash (fp8 inputs).
    * ``priority``: an explicit order, as set with ``sdpa_kernel(..., set_priority=True)``.

    Raises :class:`blink.errors.TraceError` where torch would fail with "No available kernel"
    (every fused kernel turned down and math disabled).
    """
    return explain_sdpa_choice(**kwargs).backend


def _input_requires_grad(*tensors: torch.Tensor) -> bool:
    # sdp::input_requires_grad / should_compute_logsumexp.
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _as_batch_of_one(
    rules: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    # sdp::normalize_unbatched_input (2.14): strided 3-D q, k and v (and a 3-D mask) run as a
    # batch of one; None where that does not apply.
    tensors = (query, key, value)
    if rules < _V_UNBATCHED or any(t.dim() != 3 or t.layout != torch.strided for t in tensors):
        return None
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.unsqueeze(0)
    return query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), attn_mask


def choose_sdpa_backend_for_tensors(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
    *,
    compute_capability: tuple[int, int],
    enabled: dict[str, bool] | None = None,
    torch_version: str | Sequence[int] | None = None,
    cudnn_version: int | None = None,
    cuda_version: str | Sequence[int] | None = None,
    deterministic: bool | None = None,
    fa3_enabled: bool | None = None,
    priority: Sequence[str] | None = None,
) -> str:
    """:func:`choose_sdpa_backend` for (meta or real) tensors, as ``F.sdpa`` would see them."""
    batched = _as_batch_of_one(_rules_for(torch_version), query, key, value, attn_mask)
    if batched is not None:
        query, key, value, attn_mask = batched
    return choose_sdpa_backend(
        compute_capability=compute_capability,
        dtype=query.dtype,
        q_shape=tuple(query.shape),
        k_shape=tuple(key.shape),
        v_shape=tuple(value.shape),
        has_attn_mask=attn_mask is not None,
        attn_mask_dtype=attn_mask.dtype if attn_mask is not None else None,
        dropout_p=dropout_p,
        is_causal=is_causal,
        enable_gqa=enable_gqa,
        requires_grad=_input_requires_grad(query, key, value),
        q_stride=query.stride(),
        k_stride=key.stride(),
        v_stride=value.stride(),
        enabled=enabled,
        attn_mask_shape=tuple(attn_mask.shape) if attn_mask is not None else None,
        attn_mask_stride=attn_mask.stride() if attn_mask is not None else None,
        attn_mask_requires_grad=bool(attn_mask is not None and attn_mask.requires_grad),
        storage_offsets=(query.storage_offset(), key.storage_offset(), value.storage_offset()),
        torch_version=torch_version,
        cudnn_version=cudnn_version,
        cuda_version=cuda_version,
        deterministic=deterministic,
        fa3_enabled=fa3_enabled,
        priority=priority,
    )


# --------------------------------------------------------------------------------------------
# calling the chosen kernel (at::native::scaled_dot_product_attention, CUDA branch)


def _convert_boolean_attn_mask(
    attn_mask: torch.Tensor | None, dtype: torch.dtype, *, neg: float = -math.inf
) -> torch.Tensor | None:
    # convert_boolean_attn_mask: a bool mask (True = attend) becomes an additive 0 / -inf mask.
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    zero = torch.zeros((), dtype=dtype, device=attn_mask.device)
    return torch.where(attn_mask.logical_not(), neg, zero)


def _pad_last_dim(tensor: torch.Tensor, alignment: int) -> torch.Tensor:
    # pad_last_dim<alignment, false>: zero-pad the last dim up to a multiple of alignment.
    last = tensor.size(-1)
    if last % alignment == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, alignment - last % alignment))


def _aligned_tensor(tensor: torch.Tensor, alignment: int) -> bool:
    # aligned_tensor<alignment>: every stride but the last a multiple of alignment, last == 1.
    strides = tensor.stride()
    return all(s % alignment == 0 for s in strides[:-1]) and strides[-1] == 1


def _preprocess_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    # preprocess_mask: pad_bias<8> (pad then slice back) when not aligned, then expand to
    # (B, H, L, S) so the mem-efficient kernel reads a bias of full shape.
    if not _aligned_tensor(mask, 8):
        last = mask.size(-1)
        mask = torch.nn.functional.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))


def call_fused_sdpa(
    backend: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Run ``backend``'s aten op the way ``at::native::scaled_dot_product_attention`` does on CUDA.

    * ``flash``: head dims padded to a multiple of 8, scale taken from the unpadded head dim,
      ``_scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
      return_debug_mask=False, scale=...)``, output sliced back to the original head dim.
    * ``efficient``: bool mask -> additive, mask padded/expanded to ``(B, H, L, S)``,
      ``_scaled_dot_product_efficient_attention(q, k, v, mask, compute_log_sumexp, dropout_p,
      is_causal, scale=scale)`` with ``compute_log_sumexp`` = inputs require grad.
    * ``cudnn``: ``_scaled_dot_product_cudnn_attention(q, k, v, mask, compute_log_sumexp,
      dropout_p, is_causal, return_debug_mask=False, scale=scale)``.
    * ``math``: ``_scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal,
      dropout_mask=None, scale=scale, enable_gqa=enable_gqa)``.

    Each op returns a tuple; the output is its first element. Key and value are passed as they
    are: flash, cuDNN (and, from 2.14, mem-efficient) handle GQA/MQA heads inside the kernel,
    and only the math op repeats key/value heads (``repeat_interleave``, when ``enable_gqa``).
    ``enable_gqa`` is therefore only used by ``math``.
    """
    if backend not in SDPA_BACKENDS:
        raise ConfigError(f"unknown SDPA backend {backend!r}; use one of {SDPA_BACKENDS}")
    ops = torch.ops.aten
    if backend == "flash":
        if attn_mask is not None:
            raise ConfigError("flash attention takes no attn_mask; choose another backend")
        og_size = query.size(-1)
        og_scale = scale if scale is not None else 1.0 / math.sqrt(og_size)
        out = ops._scaled_dot_product_flash_attention(
            _pad_last_dim(query, 8),
            _pad_last_dim(key, 8),
            _pad_last_dim(value, 8),
            dropout_p,
            is_causal,
            False,
            scale=og_scale,
        )[0]
        # post_process_flash_output: slice the padded head dim away.
        return out[..., :og_size] if out.size(-1) != og_size else out
    mask = _convert_boolean_attn_mask(attn_mask, query.dtype)
    if backend == "math":
        if _TORCH24_MATH.get():
            return _math_torch24(query, key, value, mask, dropout_p, is_causal, scale,
                                 enable_gqa)
        return ops._scaled_dot_product_attention_math(
            query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]
    lse = _input_requires_grad(query, key, value)  # compute_log_sumexp
    if backend == "cudnn":
        return ops._scaled_dot_product_cudnn_attention(
            query, key, value, mask, lse, dropout_p, is_causal, False, scale=scale
        )[0]
    if mask is not None:
        mask = _preprocess_mask(mask, query, key)
    return ops._scaled_dot_product_efficient_attention(
        query, key, value, mask, lse, dropout_p, is_causal, scale=scale
    )[0]


# The math backend as torch <= 2.4 ran it, for replaying measurements taken with that torch
# only (timm's 2024 RTX 3090 files: blink/train/timm_cache.py); Blink's targets are 2.11-2.14.
# attention.cpp's _scaled_dot_product_attention_math of 2.4 computed in the inputs' dtype and
# took a plain softmax. 2.5 made it upcast half / bfloat16 inputs to float32 (unless
# torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp) and take _safe_softmax (eq / all /
# where passes over the attention matrix): traced with today's path, timm's 5-D attentions
# (NesT, Twins-SVT), which only the math kernel runs, cost 1.3-2.1x their measured time.
_TORCH24_MATH: contextvars.ContextVar[bool] = contextvars.ContextVar("torch24_math",
                                                                     default=False)


@contextlib.contextmanager
def torch24_math_sdpa(enabled: bool = True) -> Iterator[None]:
    """Inside (when `enabled`): the math SDPA backend is traced as torch <= 2.4 ran it (in the
    inputs' dtype, plain softmax), not as the installed torch runs it."""
    token = _TORCH24_MATH.set(enabled)
    try:
        yield
    finally:
        _TORCH24_MATH.reset(token)


def _math_torch24(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    # torch 2.4 attention.cpp _scaled_dot_product_attention_math, step by step.
    if enable_gqa:
        raise ConfigError("torch 2.4's scaled_dot_product_attention has no enable_gqa")
    s = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    factor = math.sqrt(abs(s))  # q and k each scaled by sqrt(scale), for stability
    q = query * (-factor if s < 0 else factor)
    if is_causal:
        causal = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool,
                            device=query.device).tril()
        mask = _convert_boolean_attn_mask(causal, query.dtype)
    attn = torch.matmul(q, key.transpose(-2, -1) * factor)
    if mask is not None:
        attn.add_(mask)
    attn = torch.softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.dropout(attn, dropout_p, True)
    return torch.matmul(attn, value)


def _empty_output(
    rules: tuple[int, int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor | None:
    # attention.cpp (2.12+): empty inputs return zeros (+ 0 * the input sums, to keep autograd).
    out_shape = (*query.shape[:-1], value.size(-1))
    if rules >= _V_EMPTY_OUTPUT:
        empty = math.prod(out_shape) == 0 or key.size(-2) == 0
    elif rules >= _V_EMPTY_INPUTS:
        empty = query.numel() == 0 or key.numel() == 0 or value.numel() == 0
    else:
        return None
    if not empty:
        return None
    zeros = torch.zeros(out_shape, dtype=query.dtype, device=query.device)
    return zeros + (query.sum() + key.sum() + value.sum()) * 0


def target_scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    compute_capability: tuple[int, int],
    enabled: dict[str, bool] | None = None,
    torch_version: str | Sequence[int] | None = None,
    cudnn_version: int | None = None,
    cuda_version: str | Sequence[int] | None = None,
    deterministic: bool | None = None,
    fa3_enabled: bool | None = None,
    priority: Sequence[str] | None = None,
) -> torch.Tensor:
    """``at::native::scaled_dot_product_attention`` as it runs on the target CUDA GPU.

    Meant for an override of ``aten::scaled_dot_product_attention`` while tracing on meta:
    mirrors ``attention.cpp``'s empty-input path (2.12+) and unbatched inputs (2.14), picks the
    backend with :func:`choose_sdpa_backend_for_tensors` and calls it with
    :func:`call_fused_sdpa`.
    """
    if query.dtype != key.dtype or query.dtype != value.dtype:  # validate_sdpa_input
        raise ConfigError(
            "query, key and value must share a dtype, got "
            f"{_dtype_name(query.dtype)}, {_dtype_name(key.dtype)}, {_dtype_name(value.dtype)}"
        )
    rules = _rules_for(torch_version)
    batched = _as_batch_of_one(rules, query, key, value, attn_mask)
    if batched is not None:
        query, key, value, attn_mask = batched
    out = _empty_output(rules, query, key, value)
    if out is None:
        backend = choose_sdpa_backend_for_tensors(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            enable_gqa,
            compute_capability=compute_capability,
            enabled=enabled,
            torch_version=torch_version,
            cudnn_version=cudnn_version,
            cuda_version=cuda_version,
            deterministic=deterministic,
            fa3_enabled=fa3_enabled,
            priority=priority,
        )
        out = call_fused_sdpa(
            backend, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    return out if batched is None else out.squeeze(0)
