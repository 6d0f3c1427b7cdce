"""meta_autocast: CUDA autocast's op policy on meta tensors (no GPU needed)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from blink.autocast import _KIND, autocast_policy, meta_autocast
from blink.errors import BlinkError, ConfigError, TraceError

META = torch.device("meta")
BF16 = torch.bfloat16


class OpLog(TorchDispatchMode):
    """Records the aten ops that reach the backend (below autograd)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...] | None, torch.dtype | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        shape = tuple(first.shape) if first is not None else None
        self.ops.append((str(func.overloadpacket), shape, None if first is None else first.dtype))
        return func(*args, **(kwargs or {}))

    def names(self) -> list[str]:
        return [name for name, _, _ in self.ops]

    def casts(self, shape: tuple[int, ...] | None = None) -> int:
        return sum(
            1 for name, s, _ in self.ops
            if name == "aten._to_copy" and (shape is None or s == shape)
        )  # fmt: skip


def meta(*shape: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, device=META, dtype=dtype, requires_grad=grad)


def test_linear_runs_in_lower_precision() -> None:
    lin = nn.Linear(8, 4, device=META)
    with meta_autocast(BF16):
        assert lin(meta(2, 8)).dtype == BF16
        assert torch.matmul(meta(2, 8), meta(8, 3)).dtype == BF16
        assert (meta(2, 8) @ meta(8, 3)).dtype == BF16
        assert torch.baddbmm(meta(2, 3, 3), meta(2, 3, 4), meta(2, 4, 3)).dtype == BF16
        assert torch.einsum("ij,jk->ik", meta(2, 8), meta(8, 3)).dtype == BF16
        assert F.conv2d(meta(1, 3, 8, 8), meta(4, 3, 3, 3)).dtype == BF16
        q = meta(2, 4, 16, 8)
        assert F.scaled_dot_product_attention(q, q, q).dtype == BF16
    with meta_autocast(torch.float16):
        assert lin(meta(2, 8)).dtype == torch.float16


def test_fp32_ops_run_in_float32() -> None:
    x = meta(2, 16, dtype=BF16)
    with meta_autocast(BF16):
        assert F.softmax(x, dim=-1).dtype == torch.float32
        assert x.log_softmax(-1).dtype == torch.float32
        assert torch.softmax(x, -1).dtype == torch.float32
        assert F.layer_norm(x, (16,)).dtype == torch.float32
        assert nn.LayerNorm(16, device=META)(x).dtype == torch.float32
        assert F.group_norm(meta(2, 4, 3, dtype=BF16), 2).dtype == torch.float32
        assert torch.exp(x).dtype == torch.float32
        assert (x**2).dtype == torch.float32
        assert x.sum().dtype == torch.float32
        assert x.cumsum(0).dtype == torch.float32
        assert F.mse_loss(x, x).dtype == torch.float32
        target = torch.zeros(2, dtype=torch.long, device=META)
        assert F.cross_entropy(x, target).dtype == torch.float32
        assert F.nll_loss(x, target).dtype == torch.float32
        assert F.interpolate(meta(1, 2, 4, 4, dtype=BF16), scale_factor=2.0).dtype == torch.float32
        # An explicit dtype is respected; integer inputs keep their type.
        assert F.softmax(x, dim=-1, dtype=BF16).dtype == BF16
        assert x.sum(dtype=BF16).dtype == BF16
        assert torch.ones(3, dtype=torch.long, device=META).sum().dtype == torch.int64


def test_set_opt_dtype_does_not_cast_but_fp32_ops_do() -> None:
    x = meta(4, 8, dtype=BF16)
    with meta_autocast(BF16), OpLog() as log:
        x.sum()
    assert log.casts() == 0 and "aten.sum" in log.names()
    with meta_autocast(BF16), OpLog() as log:
        x.exp()
    assert log.casts() == 1


def test_float16_softmax_uses_the_fused_kernel() -> None:
    # SoftMax.cpp: CUDA float16 with dtype=float32 runs _softmax(half_to_float=True).
    with meta_autocast(torch.float16), OpLog() as log:
        y = F.softmax(meta(4, 8, dtype=torch.float16), dim=-1)
    assert y.dtype == torch.float32
    assert log.casts() == 0


def test_promote_ops_use_the_widest_type() -> None:
    lo, hi = meta(4, dtype=BF16), meta(4)
    with meta_autocast(BF16):
        assert torch.addcmul(lo, lo, hi).dtype == torch.float32
        assert torch.addcmul(lo, lo, lo).dtype == BF16
        assert torch.atan2(lo, hi).dtype == torch.float32
        assert torch.dot(lo, lo).dtype == BF16
        # A float16 input cannot be promoted under bfloat16 autocast on CUDA either.
        with pytest.raises(TraceError, match="prioritize"):
            torch.addcmul(lo, lo, meta(4, dtype=torch.float16))


def test_float64_is_never_cast() -> None:
    lin = nn.Linear(8, 4, device=META, dtype=torch.float64)
    x = meta(2, 8, dtype=torch.float64)
    with meta_autocast(BF16), OpLog() as log:
        assert lin(x).dtype == torch.float64
        assert F.softmax(x, dim=-1).dtype == torch.float64
        assert torch.exp(x).dtype == torch.float64
        assert torch.addcmul(x, x, x).dtype == torch.float64
    assert log.casts() == 0


def test_weight_cast_is_cached_for_the_region() -> None:
    lin = nn.Linear(8, 4, bias=False, device=META)
    with meta_autocast(BF16), OpLog() as log:
        lin(meta(2, 8))
        lin(meta(2, 8))
    # Weight (4, 8): once; input (2, 8): once per call.
    assert log.casts((4, 8)) == 1
    assert log.casts((2, 8)) == 2
    assert log.casts() == 3
    # The cache ends with the region: a new region casts the weight again.
    with meta_autocast(BF16), OpLog() as log:
        lin(meta(2, 8))
    assert log.casts((4, 8)) == 1


def test_cache_rules_follow_cached_cast() -> None:
    w = meta(4, 8)  # does not require grad: cast on every use, as on CUDA
    with meta_autocast(BF16), OpLog() as log:
        F.linear(meta(2, 8), w)
        F.linear(meta(2, 8), w)
    assert log.casts((4, 8)) == 2
    p = meta(4, 8, grad=True)
    with meta_autocast(BF16, cache_enabled=False), OpLog() as log:
        F.linear(meta(2, 8), p)
        F.linear(meta(2, 8), p)
    assert log.casts((4, 8)) == 2
    with meta_autocast(BF16), OpLog() as log:
        with meta_autocast(BF16):
            F.linear(meta(2, 8), p)
        F.linear(meta(2, 8), p)  # still inside the outermost region: cached
    assert log.casts((4, 8)) == 1


def test_casts_are_differentiated() -> None:
    lin = nn.Linear(8, 4, device=META)
    x = meta(2, 8, grad=True)
    with meta_autocast(BF16):
        out = lin(x)
        loss = out.float().sum()
    assert out.dtype == BF16
    assert out.grad_fn is not None
    loss.backward()
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32
    assert x.grad is not None and x.grad.dtype == torch.float32


def test_resnet18_forward_backward() -> None:
    torchvision = pytest.importorskip("torchvision")
    with META:
        model = torchvision.models.resnet18()
    conv_dtypes: list[torch.dtype] = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_hook(lambda m, i, o: conv_dtypes.append(o.dtype))
    x = meta(2, 3, 64, 64)
    target = torch.zeros(2, dtype=torch.long, device=META)
    with meta_autocast(BF16):
        logits = model(x)
        loss = F.cross_entropy(logits, target)
        loss.backward()
    assert len(conv_dtypes) == 20 and set(conv_dtypes) == {BF16}
    assert logits.dtype == BF16
    assert loss.dtype == torch.float32
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert param.grad.dtype == torch.float32, name


def test_backward_is_not_autocast() -> None:
    def step() -> torch.Tensor:
        w = meta(8, 8, grad=True)
        return (F.softmax(meta(4, 8) @ w, dim=-1) * 2).sum()

    with meta_autocast(BF16):
        loss = step()
        with OpLog() as inside:
            loss.backward()
    with meta_autocast(BF16):
        loss = step()
    with OpLog() as outside:
        loss.backward()
    assert inside.ops == outside.ops

    seen: list[torch.dtype] = []

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            out = torch.mm(grad, torch.ones(8, 8, device=META))  # would be bf16 if autocast
            seen.append(out.dtype)
            return out

    with meta_autocast(BF16):
        Twice.apply(meta(4, 8, grad=True)).sum().backward()
    assert seen == [torch.float32]


def test_nested_torch_autocast_disabled_region() -> None:
    lin = nn.Linear(8, 4, device=META)
    with meta_autocast(BF16):
        assert torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_dtype("cuda") == BF16
        with torch.autocast("cuda", enabled=False):
            assert lin(meta(2, 8)).dtype == torch.float32
        assert lin(meta(2, 8)).dtype == BF16
        with meta_autocast(enabled=False):
            assert lin(meta(2, 8)).dtype == torch.float32
        with meta_autocast(torch.float16):
            assert lin(meta(2, 8)).dtype == torch.float16
        assert lin(meta(2, 8)).dtype == BF16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_enabled_torch_autocast_turns_itself_off_without_cuda() -> None:
    # torch.autocast("cuda") on a host without CUDA warns and disables itself; so
    # inside it nothing is cast (a known difference from a GPU run).
    lin = nn.Linear(8, 4, device=META)
    with meta_autocast(BF16):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast("cuda", dtype=BF16):
                assert lin(meta(2, 8)).dtype == torch.float32


def test_disabled_region_casts_nothing() -> None:
    lin = nn.Linear(8, 4, device=META)
    with meta_autocast(BF16, enabled=False), OpLog() as log:
        assert lin(meta(2, 8)).dtype == torch.float32
        assert F.softmax(meta(2, 8, dtype=BF16), dim=-1).dtype == BF16
    assert log.casts() == 0


def test_nothing_left_behind() -> None:
    lin = nn.Linear(8, 4, device=META)
    before = (
        torch.is_autocast_enabled("cuda"),
        torch.get_autocast_dtype("cuda"),
        torch.is_autocast_cache_enabled(),
    )
    with meta_autocast(BF16):
        lin(meta(2, 8))
    assert lin(meta(2, 8)).dtype == torch.float32
    assert torch._C._len_torch_function_stack() == 0
    after = (
        torch.is_autocast_enabled("cuda"),
        torch.get_autocast_dtype("cuda"),
        torch.is_autocast_cache_enabled(),
    )
    assert after == before
    with pytest.raises(RuntimeError), meta_autocast(BF16):
        raise RuntimeError("boom")
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.is_autocast_enabled("cuda")
    assert lin(meta(2, 8)).dtype == torch.float32


def test_python_composites_are_seen_through() -> None:
    mha = nn.MultiheadAttention(16, 4, device=META)
    q = meta(5, 2, 16)
    with meta_autocast(BF16):
        out, weights = mha(q, q, q)
        assert out.dtype == BF16
        assert weights is not None and weights.dtype == torch.float32  # softmax
        assert F.normalize(meta(2, 8, dtype=BF16)).dtype == torch.float32  # norm -> fp32
        assert torch.norm(meta(2, 8, dtype=BF16)).dtype == torch.float32
        layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, device=META)
        assert layer(q).dtype == torch.float32  # ends in LayerNorm


def test_rnn_follows_cudnn_autocast() -> None:
    # AutocastRNN.cpp casts cuDNN RNNs to float16 even under bfloat16 autocast.
    lstm = nn.LSTM(8, 16, device=META)
    with meta_autocast(BF16):
        out, (h, c) = lstm(meta(5, 2, 8))
        assert out.dtype == torch.float16 and h.dtype == torch.float16
        assert nn.GRU(8, 16, device=META)(meta(5, 2, 8))[0].dtype == torch.float16
        cell = nn.LSTMCell(8, 16, device=META)
        assert cell(meta(2, 8))[0].dtype == BF16


def test_binary_cross_entropy_is_refused() -> None:
    p = meta(4)
    with meta_autocast(BF16), pytest.raises(TraceError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, p)
    with meta_autocast(BF16):
        assert F.binary_cross_entropy_with_logits(p, p).dtype == torch.float32
    assert isinstance(TraceError("x"), BlinkError)


def test_bad_dtype() -> None:
    with pytest.raises(ConfigError):
        meta_autocast(torch.float32)


def test_autocast_policy() -> None:
    assert autocast_policy("mm") == "lower"
    assert autocast_policy("aten::linear") == "lower"
    assert autocast_policy("torch.nn.functional.linear") == "lower"
    assert autocast_policy("Tensor.matmul") == "lower"
    assert autocast_policy("Tensor.__matmul__") == "lower"
    assert autocast_policy("torch.nn.functional.cross_entropy") == "fp32"
    assert autocast_policy("torch.nn.functional.softmax") == "fp32"
    assert autocast_policy("scaled_dot_product_attention") == "lower"
    assert autocast_policy("layer_norm") == "fp32"
    assert autocast_policy("aten::softmax.int") == "fp32"
    assert autocast_policy("sum") == "fp32"
    assert autocast_policy("cross_entropy_loss") == "fp32"
    assert autocast_policy("addcmul") == "promote"
    assert autocast_policy("index_put") == "promote"
    assert autocast_policy("cat") is None
    assert autocast_policy("stack") is None
    assert autocast_policy("relu") is None
    assert autocast_policy("aten::mm.out") is None
    assert autocast_policy("binary_cross_entropy") is None


# Op names in the table that are aten-only (no Python binding) in torch 2.11-2.14.
_ATEN_ONLY = {"_thnn_fused_lstm_cell", "_thnn_fused_gru_cell"}


@pytest.mark.parametrize("name", sorted(set(_KIND) - _ATEN_ONLY))
def test_table_names_exist(name: str) -> None:
    namespaces = (torch, torch.Tensor, torch._C._nn, torch._C._linalg, torch._C._special)
    assert any(hasattr(ns, name) for ns in namespaces), name
