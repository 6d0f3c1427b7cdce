"""Every zoo model dry-runs in inference and in a training step; FLOPs agree with torch's
FlopCounterMode over the same forward (and backward)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import blink
from blink.dryrun import _default_loss, prepare
from blink.flops import trace_flops
from blink.trace import cuda_sdpa

MODELS = blink.zoo.list_models()


# Mixtures of experts run torch._grouped_mm, whose meta kernel outside a blink trace (the
# FlopCounterMode runs below) takes bf16 only; their fp32 trace is in test_grouped_mm.py.
MOE = ("hf:olmoe-1b-7b", "hf:mixtral-8x7b")


def _kw(name: str) -> dict:
    text = blink.zoo.get_entry(name).kind != blink.zoo.VISION
    return {"batch_size": 2, **({"seq_len": 64} if text else {}),
            **({"dtype": "bf16"} if name in MOE else {})}


@pytest.mark.parametrize("mode", ["inference", "train"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_traces(name, mode):
    t = blink.trace_model(name, mode=mode, **_kw(name))
    phases = {op.phase for op in t.ops}
    if mode == "train":
        assert phases == {"forward", "backward", "optimizer"}
        # every trainable parameter got a gradient
        assert any(op.name == "aten::_foreach_mul_" or op.name.startswith("aten::_foreach_")
                   for op in t.ops if op.phase == "optimizer")
    else:
        assert phases == {"forward"}
    assert trace_flops(t) > 0
    assert sum(t.external_storages.values()) > 0  # the weights are resident
    assert t.user_ops()[0].module is not None


def _grouped_mm_flops(a: list[int], b: list[int], *args, **kwargs) -> int:
    """torch._grouped_mm, which FlopCounterMode has no formula for: 2 FLOPs per multiply-add
    over all rows, whatever the groups (2-D x 3-D, 3-D x 2-D, 2-D x 2-D grouped along K,
    3-D x 3-D batched)."""
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 2 and len(b) == 3:
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 3:
        return 2 * a[1] * a[2] * b[1]
    return 2 * a[0] * a[1] * b[1]


def _counter_flops(name: str, mode: str) -> int:
    p = prepare(name, mode=mode, **_kw(name))
    counter = FlopCounterMode(display=False,
                              custom_mapping={torch.ops.aten._grouped_mm: _grouped_mm_flops})
    # .item() on all-ones masks (BART, DeBERTa) is answered as in blink's own retry
    try:
        with cuda_sdpa("H200"), p.known_values_mode(), counter as fc:
            if mode == "inference":
                with torch.no_grad():
                    p.net(*p.args, **p.kwargs)
            else:
                out = p.net(*p.args, **p.kwargs)
                _default_loss(out, p.labels).backward()
    except AssertionError as e:
        if "sdpa_flop_count" not in str(e):
            raise
        # the reference, not blink: torch 2.11's formula refuses grouped-query SDPA shapes
        pytest.skip(f"torch {torch.__version__}'s FlopCounterMode cannot count grouped-query "
                    "SDPA (enable_gqa)")
    return fc.get_total_flops()


@pytest.mark.parametrize("name", MODELS)
def test_flops_match_flop_counter_inference(name):
    t = blink.trace_model(name, **_kw(name))
    assert trace_flops(t) == _counter_flops(name, "inference")


# Models without grouped convolutions: FlopCounterMode's convolution_backward formula ignores
# `groups` for the input gradient (it counts a depthwise conv's dgrad `groups` times over), see
# test_grouped_conv_backward_flops_by_hand.
@pytest.mark.parametrize("name", ["torchvision:resnet50", "hf:gpt2", "hf:llama-1b",
                                  "torchvision:vit_b_16", "torchvision:densenet121",
                                  "hf:olmoe-1b-7b"])
def test_flops_match_flop_counter_train(name):
    t = blink.trace_model(name, mode="train", optimizer="none", **_kw(name))
    assert trace_flops(t) == _counter_flops(name, "train")


def test_hand_formulas_on_a_conv_and_a_linear():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, groups=1),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10))
    t = blink.trace_model(net, input_shape=(4, 3, 32, 32))
    conv = 2 * 4 * 8 * 16 * 16 * 3 * 3 * 3  # 2 * N * K * Ho * Wo * C * R * S
    linear = 2 * 4 * (8 * 16 * 16) * 10
    assert trace_flops(t) == conv + linear


def test_grouped_conv_backward_flops_by_hand():
    net = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
    x = torch.empty(2, 32, 16, 16, requires_grad=True)
    with blink.trace(net) as t:
        m = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False, device="meta")
        xm = torch.empty(2, 32, 16, 16, device="meta", requires_grad=True)
        m(xm).sum().backward()
    fwd = 2 * 2 * 32 * 16 * 16 * 1 * 3 * 3  # 2 * N * K * Ho * Wo * (C / groups) * R * S
    assert trace_flops(t) == 3 * fwd  # forward, input gradient, weight gradient
    assert x.grad is None  # the user's tensors were not touched
