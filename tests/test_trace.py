"""The dispatch tracer on real torch, real models and the real compiled extension."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import blink
from blink import _C
from blink.trace import FORMAT_VERSION


def _small() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).to("meta")


def _storage_allocs(t: blink.Trace) -> dict[int, int]:
    return {e.storage: e.nbytes for e in t.allocations if not e.is_free}


def test_hand_built_model_ops_and_allocation_sizes():
    model = _small()
    x = torch.empty(8, 16, device="meta")
    with torch.no_grad(), blink.trace(model) as t:
        y = model(x)
        del y
    user = [op for op in t.user_ops()]
    assert [op.name for op in user] == ["aten::linear", "aten::relu", "aten::linear"]
    # linear's call tree: transpose of the weight, then one addmm
    first = user[0]
    assert [c.name for c in t.children(first)] == ["aten::t", "aten::addmm"]
    assert [op.module for op in user] == ["0", "1", "2"]
    # Output sizes derived by hand: fp32 (8x32), (8x32), (8x4)
    expected = [8 * 32 * 4, 8 * 32 * 4, 8 * 4 * 4]
    allocs = _storage_allocs(t)
    for op, nbytes in zip(user, expected, strict=True):
        (out,) = op.tensors("outputs")
        assert out.storage > 0, "output storage must be one the trace allocated"
        assert allocs[out.storage] == nbytes
        assert out.nbytes == nbytes
    # Inputs and weights existed before the trace: external storages, sized exactly.
    ext = t.external_storages
    w0 = user[0].tensors("inputs")[1]
    assert w0.storage < 0 and ext[w0.storage] == 32 * 16 * 4
    assert user[0].tensors("inputs")[0].storage < 0


def test_alloc_free_events_balance_and_order():
    model = _small()
    with blink.trace(model) as t:
        x = torch.empty(8, 16, device="meta")
        loss = model(x).sum()
        loss.backward()
        del x, loss
    seen: dict[int, int] = {}
    freed: set[int] = set()
    for e in t.allocations:
        if e.is_free:
            assert e.storage in seen, "free of a storage never allocated"
            assert e.storage not in freed, "double free"
            assert seen[e.storage] == e.nbytes
            freed.add(e.storage)
        else:
            assert e.storage not in seen, "storage id reused"
            seen[e.storage] = e.nbytes
    alive = set(seen) - freed
    # What is left alive is exactly the parameters' .grad storages (4 parameters).
    grads = {p.grad.untyped_storage().nbytes() for p in model.parameters()}
    assert len(alive) == 4
    assert {seen[s] for s in alive} == grads


def test_views_share_storage_and_inplace_allocates_nothing_that_survives():
    with blink.trace() as t:
        x = torch.empty(4, 6, device="meta")
        v = x.view(6, 4)
        x.relu_()
        del v
    ops = {op.name: op for op in t.user_ops()}
    view, relu_ = ops["aten::view"], ops["aten::relu_"]
    assert view.tensors("outputs")[0].storage == view.tensors("inputs")[0].storage
    assert relu_.tensors("outputs")[0].storage == relu_.tensors("inputs")[0].storage
    sub = {o.id for o in t.walk(relu_)}
    made = {e.storage for e in t.allocations if not e.is_free and e.op in sub}
    freed_in = {e.storage for e in t.allocations if e.is_free and e.op in sub}
    assert made <= freed_in, "an in-place op must not leave a new storage behind"


def test_storages_freed_during_the_trace_never_share_an_id():
    # Storages the recording allocator did not make (zero-byte tensors, CPU scalars) are named
    # by their StorageImpl. One freed mid-trace must not pass its id to the next such storage
    # that happens to reuse its address: the two would look like one tensor, giving the unit
    # graph (the GNN's input) edges between unrelated ops that changed from run to run.
    with blink.trace() as t:
        x = torch.empty(4, 6, device="meta")
        for _ in range(4):
            e = x.new_empty(0)
            torch.cat([x.flatten(), e])
            del e
    cats = [op for op in t.user_ops() if op.name == "aten::cat"]
    assert len(cats) == 4
    ids = [op.tensors("inputs")[1].storage for op in cats]
    assert len(set(ids)) == 4, ids


def test_saved_tensors_live_until_backward_frees_them():
    model = _small()
    x = torch.empty(8, 16, device="meta")
    with blink.trace(model) as t:
        loss = model(x).sum()
        loss.backward()
        del loss
    relu = next(op for op in t.user_ops() if op.name == "aten::relu")
    out = relu.tensors("outputs")[0].storage
    free = next(e for e in t.allocations if e.is_free and e.storage == out)
    assert t.ops[free.op].phase == "backward"
    assert any(op.phase == "backward" and op.name == "aten::threshold_backward" for op in t.ops)


def test_phases_and_backward_module_attribution():
    t = blink.trace_model(_small(), input_shape=(8, 16), mode="train", optimizer="sgd")
    phases = {op.phase for op in t.ops}
    assert phases == {"forward", "backward", "optimizer"}
    mm_bwd = [op for op in t.ops if op.name == "aten::mm" and op.phase == "backward"]
    assert mm_bwd and all(op.module in ("0", "2") for op in mm_bwd)
    opt_ops = [op for op in t.ops if op.phase == "optimizer"]
    assert any(op.name.startswith("aten::_foreach_") for op in opt_ops)


def test_torch112_sgd_step_traces_the_single_tensor_loop_into_zero_filled_grads():
    """timm's 2022 training benchmark (torch 1.12): Nesterov SGD's per-parameter loop, four ops
    per parameter, and the backward adding each gradient into a zero-filled one in place; the
    installed torch's step (foreach SGD, gradients set to None) outside the context."""
    from blink.dryrun import torch112_sgd_step

    model = _small()
    n_params = len(list(model.parameters()))
    modern = blink.trace_model(model, input_shape=(8, 16), mode="train", optimizer="sgd")
    with torch112_sgd_step():
        legacy = blink.trace_model(model, input_shape=(8, 16), mode="train", optimizer="sgd")

    def names(t, phase):
        return [op.name for op in t.user_ops() if op.phase == phase]

    step = names(legacy, "optimizer")
    assert not any(n.startswith("aten::_foreach_") for n in step)
    # buf.mul_(0.9).add_(grad); grad.add(buf, alpha=0.9) (Nesterov); param.add_(update)
    assert sorted(step) == sorted(["aten::mul_", "aten::add_", "aten::add", "aten::add_"]
                                  * n_params)
    assert any(n.startswith("aten::_foreach_") for n in names(modern, "optimizer"))
    # AccumulateGrad: one in-place add per parameter in the backward, none with grads at None
    accumulate = names(legacy, "backward").count("aten::add_")
    assert accumulate == names(modern, "backward").count("aten::add_") + n_params
    assert all(q.grad is None for q in model.parameters())  # the user's model is untouched


class _InPlace(torch.nn.Module):
    """In-place ops on a 32 MiB activation: silu_ and mul_ by a grad-requiring gate, whose
    derivatives read the input they overwrite; relu_ and add_, whose derivatives do not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1024, 1024)
        self.gate = torch.nn.Parameter(torch.ones(1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        torch.nn.functional.silu(y, inplace=True)
        y.mul_(self.gate)
        y.add_(self.gate)
        return torch.nn.functional.relu(y, inplace=True)


def test_training_step_charges_autograds_clone_of_an_in_place_ops_input():
    """An in-place op whose derivative reads its input makes autograd clone that input before
    the kernel overwrites it: one more copy kernel of the input's bytes in a training step,
    none in inference or for relu_ / add_."""
    from blink.cost import trace_features
    from blink.hardware import get_gpu

    gpu = get_gpu("H200")

    def units(mode: str) -> dict[str, dict]:
        t = blink.trace_model(_InPlace(), input_shape=(8192, 1024), mode=mode, optimizer="sgd")
        first: dict[str, dict] = {}  # the forward's, which comes first
        for f in trace_features(t, gpu):
            if f["op"] in ("aten::silu_", "aten::mul_.Tensor", "aten::relu_",
                           "aten::add_.Tensor"):
                first.setdefault(f["op"], f)
        return first

    train, infer = units("train"), units("inference")
    assert set(train) == set(infer) == {"aten::silu_", "aten::mul_.Tensor", "aten::relu_",
                                        "aten::add_.Tensor"}
    copy_s = 2 * 8192 * 1024 * 4 / (gpu.memory_bandwidth_bytes_per_s * gpu.dram_efficiency)
    for op in ("aten::silu_", "aten::mul_.Tensor"):
        assert train[op]["kernels"] == infer[op]["kernels"] + 1
        # the copy's bytes at the streaming rate, plus its own DRAM round trip (~1 us)
        extra = train[op]["analytic_time_s"] - infer[op]["analytic_time_s"]
        assert copy_s <= extra <= copy_s + 2e-6
    for op in ("aten::relu_", "aten::add_.Tensor"):
        assert train[op]["kernels"] == infer[op]["kernels"]
        assert train[op]["analytic_time_s"] == pytest.approx(infer[op]["analytic_time_s"])


def test_trace_is_deterministic():
    def run() -> tuple[list[str], list[int]]:
        t = blink.trace_model("torchvision:resnet18", batch_size=2, mode="train")
        return [op.full_name for op in t.ops], [op.parent for op in t.ops]

    assert run() == run()


def test_json_round_trip(tmp_path):
    t = blink.trace_model("hf:gpt2", batch_size=1, seq_len=16)
    path = tmp_path / "t.json"
    t.to_json(path)
    back = blink.Trace.from_json(path)
    assert len(back) == len(t)
    assert [op.full_name for op in back.ops] == [op.full_name for op in t.ops]
    assert back.ops[5].inputs == t.ops[5].inputs
    assert back.allocations == t.allocations
    assert back.meta["model"] == "hf:gpt2"


def test_json_errors(tmp_path):
    t = blink.trace_model(_small(), input_shape=(2, 16))
    doc = json.loads(t.to_json())
    doc["format_version"] = 99
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(blink.BlinkError, match="format_version 99"):
        blink.Trace.from_json(bad)
    trunc = tmp_path / "t.json"
    trunc.write_text(t.to_json()[:200])
    with pytest.raises(blink.BlinkError, match="invalid JSON"):
        blink.Trace.from_json(trunc)
    del doc["ops"]
    doc["format_version"] = FORMAT_VERSION
    bad.write_text(json.dumps(doc))
    with pytest.raises(blink.BlinkError, match="missing ops"):
        blink.Trace.from_json(bad)


FUSED = ("flash", "efficient", "cudnn")


def test_sdpa_traced_as_fused_kernel_with_logsumexp():
    t = blink.trace_model("hf:gpt2", batch_size=2, seq_len=128, dtype="bf16", mode="train",
                          gpu="H100-SXM")
    names = {op.name for op in t.ops}
    # Which fused kernel depends on the torch version's rules (dropout 0.1: cuDNN on 2.11,
    # flash from 2.12); never the math decomposition.
    fwd = [n for n in names if any(n == f"aten::_scaled_dot_product_{b}_attention"
                                   for b in FUSED)]
    assert len(fwd) == 1, names
    assert fwd[0] + "_backward" in names
    assert "aten::_scaled_dot_product_attention_math" not in names
    op = next(o for o in t.ops if o.name == fwd[0])
    lse = op.tensors("outputs")[1]
    assert lse.numel == 2 * 12 * 128 and lse.dtype == "float32"
    # No L x L score matrix was ever allocated under the fused op.
    sub = {o.id for o in t.walk(op)}
    big = [e for e in t.allocations if not e.is_free and e.op in sub
           and e.nbytes >= 2 * 12 * 128 * 128 * 2]
    assert big == []


class _BiasedAttention(torch.nn.Module):
    """Attention with a learned relative-position bias as its attn_mask (timm's CoAtNet and
    MaxViT pass theirs the same way)."""

    def __init__(self, heads: int = 4, tokens: int = 64, dim: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.bias = torch.nn.Parameter(torch.zeros(1, heads, tokens, tokens))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.bias.to(q.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return out.transpose(1, 2).reshape(b, n, c)


def _attention_kernels(t: blink.Trace) -> set[str]:
    return {o.name for o in t.ops if o.name.startswith("aten::_scaled_dot_product_")}


def test_sdpa_with_a_mask_that_needs_its_gradient_is_not_run_on_cudnn():
    """PyTorch's check_attn_mask_shape turns cuDNN attention down for an attn_mask that
    requires grad (its backward returns none for the bias): on an H100, whose bf16 SDPA
    prefers cuDNN, a learned bias in training runs mem-efficient attention, and the same
    model in inference (no grad) runs cuDNN."""
    shape = (8, 64, 64)
    train = blink.trace_model(_BiasedAttention(), input_shape=shape, dtype="bf16",
                              mode="train", gpu="H100-SXM")
    assert _attention_kernels(train) == {"aten::_scaled_dot_product_efficient_attention",
                                         "aten::_scaled_dot_product_efficient_attention_backward"}
    infer = blink.trace_model(_BiasedAttention(), input_shape=shape, dtype="bf16",
                              gpu="H100-SXM")
    assert _attention_kernels(infer) == {"aten::_scaled_dot_product_cudnn_attention"}


def test_nested_trace_refused_and_state_clean_after_error():
    with pytest.raises(blink.BlinkError, match="already running"):
        with blink.trace():
            with blink.trace():
                pass
    assert not _C.tracer_active()
    with blink.trace() as t:
        torch.empty(3, device="meta")
    assert len(t) >= 1


def test_import_does_not_initialise_cuda():
    code = "import blink, torch; blink.trace_model('torchvision:resnet18', batch_size=1); " \
           "print(torch.cuda.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_summary_prints_table():
    t = blink.trace_model("torchvision:resnet18", batch_size=2)
    text = t.summary()
    assert "aten::conv2d" in text and "calls" in text
    conv_line = next(line for line in text.splitlines() if line.startswith("aten::conv2d"))
    assert conv_line.split()[1] == "20"  # resnet18 has 20 convolutions


def test_failed_dry_run_names_op_and_module():
    class Gate(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent Python branch
                return x
            return -x

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), Gate())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    with pytest.raises(blink.DataDependentError) as info:
        blink.trace_model(Net(), input_shape=(2, 4))
    assert info.value.module == "body.1"
    assert "body.1" in str(info.value)
    assert not _C.tracer_active()


# Run in a fresh interpreter, where torch's record of its Python kernels (torch.library._impls)
# is what torch made it, whatever other tests registered or removed.
_TORCH_2_11_RULE = r"""
import gc

import torch
import torch._meta_registrations

import blink

orig = torch.library.Library.impl


def impl_2_11(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=False):
    return orig(self, op_name, fn, dispatch_key, with_keyset=with_keyset,
                allow_override=allow_override)


torch.library.Library.impl = impl_2_11
replaced = {"aten/convolution/Meta", "aten/_cudnn_rnn/Meta", "aten/masked_fill.Tensor/Meta"}
assert replaced <= torch.library._impls
try:
    torch.library.Library("aten", "IMPL").impl("convolution", lambda *a: None, "Meta")
    raise SystemExit("a plain override went through")
except RuntimeError as e:
    assert "already a kernel registered from python" in str(e), e


class ConvLstmMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)

    def forward(self, x):
        y = self.conv(x).mean(dim=2).transpose(1, 2)  # (N, W, 8)
        out, _ = self.lstm(y)
        return out.masked_fill(out > 0, torch.tensor(0.5))


t = blink.trace_model(ConvLstmMask(), input_shape=(2, 3, 8, 8), batch_size=2, mode="train",
                      gpu="H200")
print(sorted({op.name for op in t.ops}))
gc.collect()  # the trace's libraries are gone, their finalizers run
assert replaced <= torch.library._impls, "torch's record of its own kernels was dropped"
out = torch.nn.functional.conv2d(torch.empty(1, 3, 8, 8, device="meta"),
                                 torch.empty(4, 3, 3, 3, device="meta"))
print(tuple(out.shape))
"""


def test_trace_overrides_kernels_under_torch_2_11s_library_rule():
    """torch 2.11 (the H200's) refuses Library.impl over a kernel torch registered from Python
    (meta convolution, _cudnn_rnn, masked_fill, _grouped_mm) unless allow_override=True, the
    default from later releases on. Every trace failed there when an override used the
    default. Trace a convolution, an LSTM and masked_fill with a 0-dim value (each overridden
    during a trace) under 2.11's default."""
    r = subprocess.run([sys.executable, "-c", _TORCH_2_11_RULE], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    names, shape = r.stdout.strip().splitlines()[-2:]
    for op in ("aten::_cudnn_rnn", "aten::_cudnn_rnn_backward", "aten::convolution",
               "aten::masked_fill"):
        assert repr(op) in names, names
    assert shape == "(1, 4, 6, 6)"  # the meta convolution is torch's own again afterwards
