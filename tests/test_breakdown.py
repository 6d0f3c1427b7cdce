"""Breakdowns people read: time by phase / module / op / kind sums to the totals, memory by
category sums to the peaks, the memory curve reaches the peak, parameters / FLOPs / MFU are
right, and the Prediction prints, repr's and round-trips well."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torchvision

import blink
from blink.cli import main
from blink.hardware import get_gpu
from blink.predict import MEMORY_CATEGORIES

ALLOC_ROUND = 512  # the caching allocator rounds every block up to 512 B


@pytest.fixture(scope="module")
def train() -> blink.Prediction:
    return blink.predict("torchvision:resnet18", batch_size=4, mode="train", gpu="A100-80GB")


@pytest.fixture(scope="module")
def infer() -> blink.Prediction:
    return blink.predict("torchvision:resnet18", batch_size=4, gpu="A100-80GB")


def _param_bytes() -> tuple[int, int, int, int]:
    """Parameters, their fp32 bytes, buffer bytes and tensor count of the real model."""
    net = torchvision.models.resnet18(weights=None)
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    return n, 4 * n, sum(b.numel() * b.element_size() for b in net.buffers()), len(params)


@pytest.mark.parametrize("by, depth", [("phase", 1), ("module", 1), ("module", 2),
                                       ("module", 9), ("op", 1), ("kind", 1)])
def test_time_breakdowns_sum_to_totals(train, by, depth):
    rows = train.breakdown(by, depth)
    assert sum(r.wall_ms for r in rows) == pytest.approx(train.time_ms, rel=1e-9)
    assert sum(r.gpu_ms for r in rows) == pytest.approx(train.gpu_busy_ms, rel=1e-9)
    assert sum(r.flops for r in rows) == pytest.approx(train.flops, rel=1e-9)
    assert all(r.wall_ms >= 0 for r in rows)


def test_phases_and_module_depth(train, infer):
    assert [r.key for r in train.breakdown("phase")] == ["forward", "backward", "optimizer"]
    assert [r.key for r in infer.breakdown("phase")] == ["forward"]
    d1 = {r.key for r in train.breakdown("module", 1)}
    d2 = {r.key for r in train.breakdown("module", 2)}
    assert {"layer1", "layer2", "layer3", "layer4", "conv1", "fc"} <= d1
    assert {"layer1.0", "layer4.1"} <= d2 and not any(k.count(".") > 1 for k in d2)
    # each depth-1 module's time is the sum of its depth-2 children
    for top in ("layer1", "layer3"):
        kids = [r.wall_ms for r in train.breakdown("module", 2) if r.key.startswith(top + ".")]
        ours = next(r.wall_ms for r in train.breakdown("module", 1) if r.key == top)
        assert sum(kids) == pytest.approx(ours, rel=1e-9)
    with pytest.raises(blink.BlinkError, match="unknown breakdown"):
        train.breakdown("layer")
    with pytest.raises(blink.BlinkError, match="depth"):
        train.breakdown("module", 0)


def test_memory_categories_sum_to_peaks(train, infer):
    for p in (train, infer):
        cats = p.memory_by_category
        assert tuple(cats) == MEMORY_CATEGORIES
        assert sum(cats.values()) == p.nvidia_smi_bytes
        allocated = sum(v for k, v in cats.items() if k not in ("allocator_cache", "cuda_context"))
        assert allocated == p.peak_allocated_bytes
        assert allocated + cats["allocator_cache"] == p.peak_reserved_bytes


def test_memory_categories_hold_what_they_say(train, infer):
    _n, weight_bytes, buffer_bytes, n_params = _param_bytes()
    raw = weight_bytes + buffer_bytes
    # blocks round up to 512 B, and a large block whose remainder is too small to split
    # stays whole: a few per cent at most
    slack = ALLOC_ROUND * (n_params + 60) + 0.01 * raw
    for p in (train, infer):
        # weights are parameters + buffers only: never the optimizer state
        assert raw <= p.memory_by_category["weights"] <= raw + slack
        assert p.memory_by_category["inputs"] >= 4 * 3 * 224 * 224 * 4
    # cuBLAS's workspace comes with the first GEMM: resnet's only one (fc) runs after the
    # inference peak, before the training one
    assert train.memory_by_category["workspace"] == train.workspace_bytes
    assert infer.memory_by_category["workspace"] == 0
    # AdamW keeps two moments per parameter (its fp32 step counters live on the CPU)
    assert 2 * weight_bytes <= train.memory_by_category["optimizer_state"] <= \
        2 * weight_bytes + 2 * slack
    assert infer.memory_by_category["optimizer_state"] == 0
    assert infer.memory_by_category["gradients"] == 0
    assert 0 < train.memory_by_category["gradients"] <= weight_bytes + slack
    assert train.memory_by_category["activations"] > infer.memory_by_category["activations"]
    # resident = everything that existed before the step, now split in the table
    resident = sum(train.memory_by_category[k] for k in ("weights", "inputs", "optimizer_state"))
    assert train.resident_bytes <= resident <= train.resident_bytes + slack * 3
    assert "optimizer state" in train.table() and "weights+inputs" not in train.table()


def test_gradients_without_optimizer():
    p = blink.predict("torchvision:resnet18", batch_size=2, mode="train", optimizer="none")
    _n, weight_bytes, _b, n_params = _param_bytes()
    assert p.memory_by_category["optimizer_state"] == 0
    assert weight_bytes * 0.5 < p.memory_by_category["gradients"] <= \
        weight_bytes + ALLOC_ROUND * n_params


def test_memory_curve(train):
    curve = train.memory_curve
    assert 10 < len(curve) <= 512
    assert max(c["allocated_bytes"] for c in curve) == train.peak_allocated_bytes
    assert max(c["reserved_bytes"] for c in curve) == train.peak_reserved_bytes
    counters = [e for e in train.to_chrome_trace()["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(curve)
    times = [c["t_ms"] for c in curve]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= train.time_ms
    assert {c["phase"] for c in curve} >= {"forward", "backward", "optimizer"}


def test_params_flops_mfu():
    p = blink.predict("torchvision:resnet18", batch_size=8, dtype="bf16", gpu="H100-SXM")
    n, *_ = _param_bytes()
    assert p.params == n
    assert p.flops == pytest.approx(sum(u.flops for u in p.units))
    # forward FLOPs of resnet18 at 224: 1.82 GMAC per image (torchvision's own weights card)
    gflops = torchvision.models.ResNet18_Weights.DEFAULT.meta["_ops"]
    assert p.flops == pytest.approx(8 * 2 * gflops * 1e9, rel=0.03)
    peak = get_gpu("H100-SXM").peak_flops["bf16"]
    assert p.peak_flops == peak and p.peak_flops_kind == "bf16"
    assert p.achieved_tflops == pytest.approx(p.flops / (p.time_ms * 1e-3) / 1e12)
    assert p.mfu == pytest.approx(p.achieved_tflops * 1e12 / peak)
    assert 0 < p.mfu < 1
    assert "MFU" in p.table() and "params" in p.table()


def test_repr_is_small_and_json_round_trips():
    p = blink.predict("hf:gpt2", batch_size=2, seq_len=128, mode="train")
    assert len(p.units) > 1000
    assert len(repr(p)) < 200 and "hf:gpt2" in repr(p)
    q = blink.Prediction.from_json(p.to_json())
    assert q == p and q.table() == p.table()
    with pytest.raises(blink.BlinkError, match="not a blink prediction"):
        blink.Prediction.from_json('{"format": "blink.trace"}')


def test_table_fits_any_op_name(train):
    long = "aten::" + "very_long_custom_kernel_name_" * 8
    top = max(train.units, key=lambda u: u.time_ms).op  # a unit's op (not a host-only row)
    units = [dataclasses.replace(u, op=long) if u.op == top else u for u in train.units]
    p = dataclasses.replace(train, units=units)
    lines = p.table().splitlines()
    rows = lines[lines.index(next(x for x in lines if x.strip().startswith("op "))):]
    rows = [x for x in rows if not x.strip().startswith("note:")]  # free text after the rows
    assert len({len(x) for x in rows}) == 1  # aligned columns
    assert max(len(x) for x in rows) <= 100
    assert any("\u2026" in x and x.strip().startswith("aten::very_long") for x in rows)
    short = blink.predict(torch.nn.Linear(8, 8), input_shape=(2, 8)).table()
    op_rows = [x for x in short.split("\n\n", 1)[1].splitlines()
               if not x.strip().startswith("note:")]
    assert max(len(x) for x in op_rows) < 70  # the column shrinks to the names


def test_custom_model_table_shows_batch():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    p = blink.predict(net, inputs=(torch.randn(16, 8),))
    assert p.batch_size == 16 and "batch 16" in p.table()
    p = blink.predict(net, input_shape=(24, 8))
    assert "batch 24" in p.table()


def test_cli_breakdowns(capsys):
    assert main(["predict", "torchvision:resnet18", "-b", "2", "--mode", "train", "--by",
                 "module", "--depth", "2", "--top", "40"]) == 0
    out = capsys.readouterr().out
    assert "module (depth 2)" in out and "layer1.0" in out and "layer4.1" in out
    assert main(["predict", "torchvision:resnet18", "-b", "2", "--mode", "train",
                 "--by", "phase"]) == 0
    out = capsys.readouterr().out.split("\n\n", 1)[1]
    assert [line.split()[0] for line in out.splitlines()[1:4]] == \
        ["forward", "backward", "optimizer"]
