"""Bad input gets a clear blink error, and the user's model is left exactly as it was."""
from __future__ import annotations

import pytest
import torch

import blink
from blink import _C


class Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return y[y > 0]  # boolean mask: a data-dependent shape


def test_boolean_mask_names_op_and_module_and_policy_works():
    with pytest.raises(blink.DataDependentError) as info:
        blink.trace_model(Masked(), input_shape=(4, 8))
    # the op user code called (boolean-mask indexing runs nonzero inside it)
    assert info.value.op == "aten::index"
    assert info.value.module == ""
    assert "nonzero='assume_all'" in str(info.value)
    t = blink.trace_model(Masked(), input_shape=(4, 8), nonzero="assume_all")
    index = next(op for op in t.ops if op.name == "aten::index")
    assert index.tensors("outputs")[0].shape == (4 * 8,)  # every element counted non-zero
    full = blink.trace_model(Masked(), input_shape=(4, 8), nonzero="assume_all")
    assert len(full) == len(t)


def test_item_names_module():
    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.max().item()

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale())
    with pytest.raises(blink.DataDependentError) as info:
        blink.trace_model(net, input_shape=(2, 4))
    assert info.value.module == "1"
    assert ".item()" in str(info.value)


def test_custom_op_without_meta_kernel():
    lib = torch.library.Library("blinktest_nometa", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")

    class Custom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.blinktest_nometa.twice(x)

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), Custom())
    with pytest.raises(blink.MissingMetaKernelError) as info:
        blink.trace_model(net, input_shape=(2, 4))
    assert info.value.op == "blinktest_nometa::twice"
    assert info.value.module == "1"
    assert "register_fake" in str(info.value)
    assert not _C.tracer_active()


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"batch_size": -3}, "batch_size must be a positive integer"),
    ({"batch_size": True}, "batch_size must be a positive integer"),
    ({"batch_size": 2, "dtype": "int7"}, "unsupported dtype 'int7'.*fp32, bf16, fp16"),
    ({"batch_size": 2, "mode": "training"}, "unknown mode 'training'"),
    ({"batch_size": 2, "optimizer": "lion"}, "unknown optimizer 'lion'.*adamw"),
    ({"batch_size": 2, "seq_len": 0}, "seq_len must be a positive integer"),
    ({}, "give batch_size"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(blink.ConfigError, match=match):
        blink.trace_model("hf:gpt2", **kwargs)


def test_seq_len_beyond_positions():
    with pytest.raises(blink.ConfigError, match="1024 position embeddings"):
        blink.trace_model("hf:gpt2", batch_size=1, seq_len=4096)


def test_unknown_zoo_name_lists_known():
    with pytest.raises(blink.UnknownModelError) as info:
        blink.trace_model("torchvision:resnet5O", batch_size=1)
    text = str(info.value)
    assert "torchvision:resnet50" in text and "hf:llama-7b" in text and "Did you mean" in text


def test_bad_shapes():
    net = torch.nn.Linear(4, 4)
    with pytest.raises(blink.ConfigError, match="positive integer"):
        blink.trace_model(net, input_shape=(2, 0))
    with pytest.raises(blink.ConfigError, match="positive integer"):
        blink.trace_model(net, input_shape=(2, "4"))
    with pytest.raises(blink.ConfigError, match="no inputs"):
        blink.trace_model(net)
    # a shape the model cannot take is a trace error naming the op
    with pytest.raises(blink.TraceError) as info:
        blink.trace_model(net, input_shape=(2, 5))
    assert info.value.op is not None


def test_unknown_gpu():
    with pytest.raises(blink.UnknownGPUError, match="H200"):
        blink.trace_model("torchvision:resnet18", batch_size=1, gpu="H300")


def test_user_model_left_unchanged():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2))
    net.eval()
    calls = []
    net.register_forward_hook(lambda *a: calls.append(1))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    hooks_before = dict(net._forward_hooks)
    t = blink.trace_model(net, input_shape=(4, 8), mode="train")
    assert len(t) > 0
    assert not net.training
    assert all(p.device.type == "cpu" and p.grad is None for p in net.parameters())
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert dict(net._forward_hooks) == hooks_before
    # The copy keeps the model's own hooks (they are part of its behaviour): one dry-run call.
    assert calls == [1]
    net(torch.randn(1, 8))
    assert calls == [1, 1]
    assert not _C.tracer_active()


def test_user_inputs_left_unchanged():
    x = torch.randn(3, 4)
    ref = x.clone()
    blink.trace_model(torch.nn.Linear(4, 2), inputs=x, mode="train")
    assert torch.equal(x, ref) and x.grad is None and x.device.type == "cpu"
