"""blink.predict on real zoo traces: memory against an independent Python replay, GPU
scaling, fused attention, the timeline, exports and errors."""
from __future__ import annotations

import json

import pytest
import torch
from alloc_reference import ReferenceAllocator

import blink
from blink import _C
from blink.cli import main
from blink.hardware import get_gpu
from blink.predict import cublas_workspace_bytes, predict_trace

GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
         "aten::addmv", "aten::mv", "aten::_scaled_mm"}


# c10's code for the meta device, as the trace records it
META = next(c for c in range(21) if _C.device_type_name(c) == "meta")


def _python_replay(t: blink.Trace, workspace: int) -> dict:
    """The memory rules of blink.predict, re-derived in Python from the trace: resident meta
    storages first; then every storage event, except storages allocated and freed inside one
    kernel op (meta-only scratch); the cuBLAS workspace at the first GEMM's first event."""
    ops = t.ops
    alloc = ReferenceAllocator()
    rid = -1
    for _sid, nbytes, device in t._raw["externals"]:
        if nbytes > 0 and device == META:
            alloc.malloc(rid, nbytes)
            rid -= 1
    first_op: dict[int, int] = {}
    scratch = set()
    for e in t.allocations:
        if not e.is_free:
            first_op[e.storage] = e.op
        elif first_op.get(e.storage) == e.op and e.op >= 0 and ops[e.op].kernel:
            scratch.add(e.storage)
    ws_done = False
    for e in t.allocations:
        if not ws_done and e.op >= 0 and ops[e.op].kernel and ops[e.op].name in GEMMS:
            alloc.malloc(rid, workspace)
            ws_done = True
        if e.storage in scratch:
            continue
        if e.is_free:
            alloc.free(e.storage)
        else:
            alloc.malloc(e.storage, e.nbytes)
    return alloc.stats()


@pytest.mark.parametrize("name, mode, kw", [
    ("torchvision:resnet50", "inference", {"batch_size": 8}),
    ("torchvision:resnet50", "train", {"batch_size": 8}),
    ("hf:gpt2", "train", {"batch_size": 2, "seq_len": 128}),
    ("hf:llama-1b", "inference", {"batch_size": 1, "seq_len": 256}),
    ("torchvision:mobilenet_v2", "train", {"batch_size": 4}),
])
def test_memory_peaks_equal_python_replay(name, mode, kw):
    t = blink.trace_model(name, mode=mode, dtype="bf16", **kw)
    p = predict_trace(t, "H200", expandable_segments=False)
    ref = _python_replay(t, cublas_workspace_bytes(get_gpu("H200")))
    assert p.peak_allocated_bytes == ref["peak_allocated_bytes"]
    assert p.peak_reserved_bytes == ref["peak_reserved_bytes"]
    # the workspace is charged once and never freed: without it, that much less is still
    # allocated at the end, give or take one unsplit large-pool remainder (<= 1 MiB) that
    # another block keeps when placement shifts
    workspace = cublas_workspace_bytes(get_gpu("H200"))
    diff = ref["allocated_bytes"] - _python_replay(t, 0)["allocated_bytes"]
    assert abs(diff - workspace) <= 2**20
    assert p.resident_bytes == sum(n for _s, n, d in t._raw["externals"] if d == META)


def test_training_step_memory_holds_weights_grads_and_adam_state():
    p = blink.predict("hf:gpt2", batch_size=1, seq_len=64, mode="train", optimizer="adamw")
    params = 124_439_808  # GPT-2 small, tied embeddings: counted by hand from the config
    weights = params * 4
    # weights + grads + two AdamW moments, all fp32, must be live together at the step
    assert p.peak_allocated_bytes >= 4 * weights
    assert p.peak_allocated_bytes < 4 * weights + 600 * 2**20
    assert p.peak_reserved_bytes >= p.peak_allocated_bytes


def test_roofline_moves_the_right_way_across_gpus():
    t = blink.trace_model("hf:llama-1b", batch_size=4, seq_len=512, dtype="bf16")
    h100 = predict_trace(t, "H100-SXM")
    h200 = predict_trace(t, "H200")
    a100 = predict_trace(t, "A100-80GB")
    by_id = {u.op_id: u for u in h200.units}
    memory_bound = compute_bound = 0
    for u in h100.units:
        v = by_id[u.op_id]
        if u.kind == "elementwise" and u.bytes > 64 * 2**20:
            assert v.roofline_ms < u.roofline_ms  # 4.8 vs 3.35 TB/s
            memory_bound += 1
        if u.kind == "gemm" and u.flops > 1e11:
            assert v.roofline_ms == pytest.approx(u.roofline_ms, rel=1e-9)  # same peaks
            compute_bound += 1
    assert memory_bound > 0 and compute_bound > 0
    assert h200.time_ms <= h100.time_ms < a100.time_ms


def test_sdpa_costed_as_fused_kernel_and_score_matrix_not_charged():
    kw = {"batch_size": 4, "seq_len": 1024, "dtype": "bf16", "mode": "train"}
    fused = blink.predict("hf:gpt2", **kw)
    kinds = {u.op: u.kind for u in fused.units}
    attn = [op for op, k in kinds.items() if k == "attention"]
    assert attn and all("_scaled_dot_product_" in op for op in attn)
    # no softmax inside the attention modules (the LM loss's log_softmax is outside them)
    assert not any("softmax" in u.op and u.module and ".attn" in u.module for u in fused.units)
    from blink.dryrun import execute, prepare

    # the unfused (math) path, for comparison
    p = prepare("hf:gpt2", **kw)
    with blink.trace(p.net, sdpa="math", meta=p.meta) as tm:
        execute(p)
    unfused = predict_trace(tm, "H200")
    score = 4 * 12 * 1024 * 1024 * 2  # one layer's L x L bf16 scores
    assert unfused.peak_allocated_bytes - fused.peak_allocated_bytes >= score
    assert any("softmax" in u.op and u.module and ".attn" in u.module for u in unfused.units)


def test_small_batch_is_launch_bound_large_batch_gpu_bound():
    small = blink.predict("torchvision:resnet18", batch_size=1)
    large = blink.predict("torchvision:resnet18", batch_size=256)
    assert small.host_ms > small.gpu_busy_ms
    assert small.time_ms == pytest.approx(small.host_ms, rel=0.05)
    assert large.gpu_busy_ms > large.host_ms
    assert large.time_ms >= large.gpu_busy_ms
    assert small.lower_ms <= small.time_ms <= small.upper_ms


def test_exports(tmp_path):
    p = blink.predict("torchvision:resnet18", batch_size=4, mode="train", predictor="analytic")
    doc = json.loads(p.to_json())
    for key in ("time_ms", "lower_ms", "upper_ms", "peak_allocated_bytes",
                "peak_reserved_bytes", "units", "timeline"):
        assert key in doc
    assert doc["units"][0]["source"] == "analytic"
    trace = p.to_chrome_trace(tmp_path / "t.json")
    loaded = json.loads((tmp_path / "t.json").read_text())
    assert loaded == trace
    xs = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    gpu = [e for e in xs if e["tid"] == 2]
    assert gpu and all(e["dur"] >= 0 for e in xs)
    ends = [e["ts"] + e["dur"] for e in xs]
    assert max(ends) == pytest.approx(p.time_ms * 1e3, rel=1e-9)  # end to end = last event
    assert sum(u.time_ms for u in p.units) == pytest.approx(p.gpu_busy_ms, rel=1e-6)


def test_prediction_from_a_saved_trace(tmp_path):
    t = blink.trace_model("hf:bert-base", batch_size=2, seq_len=64)
    path = tmp_path / "bert.json"
    t.to_json(path)
    direct = predict_trace(t, "A100-40GB")
    loaded = predict_trace(blink.Trace.from_json(path), "A100-40GB")
    assert loaded.time_ms == direct.time_ms
    assert loaded.peak_reserved_bytes == direct.peak_reserved_bytes


def test_errors():
    with pytest.raises(blink.UnknownGPUError, match="H200"):
        blink.predict("torchvision:resnet18", batch_size=1, gpu="B9000")
    with pytest.raises(blink.ConfigError, match="unsupported dtype"):
        blink.predict("torchvision:resnet18", batch_size=1, dtype="fp12")


def test_cli_predict(tmp_path, capsys):
    out = tmp_path / "p.json"
    tl = tmp_path / "tl.json"
    assert main(["predict", "hf:gpt2", "-b", "1", "--seq-len", "32", "--gpu", "L4", "--out",
                 str(out), "--chrome-trace", str(tl)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gpu"] == "L4" and doc["format"] == "blink.prediction"
    assert json.loads(tl.read_text())["traceEvents"]
    assert main(["predict", "torchvision:resnet18", "-b", "2"]) == 0
    text = capsys.readouterr().out
    assert "peak allocated" in text and "aten::convolution" in text


def test_trace_features_are_the_units_predict_costs():
    from blink.cost import trace_features

    t = blink.trace_model("torchvision:resnet18", batch_size=8, mode="train")
    rows = trace_features(t, "A100-40GB", allow_tf32_cudnn=True)
    p = predict_trace(t, "A100-40GB", allow_tf32_matmul=False, allow_tf32_cudnn=True,
                      predictor="analytic")
    assert [r["op_id"] for r in rows] == [u.op_id for u in p.units]
    for r, u in zip(rows, p.units, strict=True):
        assert r["analytic_time_s"] * 1e3 == pytest.approx(u.time_ms, rel=1e-12, abs=1e-15)
        assert r["flops"] == u.flops
    convs = [r for r in rows if r["kind"] == "conv" and not r["backward"]]
    assert len(convs) == 20 and all(r["math_mode"] == "tf32" for r in convs)


@pytest.mark.parametrize("name, kw", [("torchvision:resnet50", {"batch_size": 2}),
                                      ("hf:llama-1b", {"batch_size": 1, "seq_len": 64}),
                                      ("timm:efficientnet_b0", {"batch_size": 2})])
def test_every_kernel_unit_has_a_rule(name, kw):
    # A unit that launches kernels but falls back to the generic rule is a gap in the table.
    for mode in ("inference", "train"):
        p = blink.predict(name, mode=mode, dtype="amp-bf16", **kw)
        gaps = {u.op for u in p.units if u.kind == "other" and u.kernels > 0}
        assert gaps == set()
        assert not any(u.error for u in p.units)


def test_autocast_casts_are_costed_copies():
    # copy_ has no CUDA registration (a DispatchStub kernel), but every cast launches one.
    amp = blink.predict("hf:llama-1b", batch_size=2, seq_len=128, dtype="amp-bf16")
    casts = [u for u in amp.units if u.op == "aten::copy_"]
    assert casts and all(u.time_ms > 0 and u.bytes > 0 for u in casts)
    # the cast weights: 2 + 4 bytes moved per fp32 weight element of every Linear
    assert sum(u.bytes for u in casts) >= 6 * 0.9e9


def test_channels_last_runs_nhwc_convolutions_without_layout_transposes():
    """--channels-last: the model's convolutions see NHWC tensors (a real torchvision resnet18
    traced on meta), so cuDNN's fp16 tensor-core kernels need none of the nchwToNhwc /
    nhwcToNchw transposes an NCHW run pays; the caller's model is left as it was."""
    import torch
    import torchvision

    from blink.cost import trace_features

    with torch.device("meta"):
        net = torchvision.models.resnet18()
    runs = {}
    for cl in (False, True):
        t = blink.trace_model(net, input_shape=(32, 3, 224, 224), dtype="amp-fp16",
                              gpu="A100-40GB", channels_last=cl)
        assert t.meta["channels_last"] is cl
        convs = [r for r in trace_features(t, "A100-40GB")
                 if r["kind"] == "conv" and r["analytic_time_s"] > 0]
        assert len(convs) == 20
        runs[cl] = convs
        first = next(o for o in t.ops if o.name == "aten::convolution")
        x = first.tensors("inputs")[0]
        want = (3 * 224 * 224, 1, 3 * 224, 3) if cl else (3 * 224 * 224, 224 * 224, 224, 1)
        assert tuple(x.stride) == want
    assert all(r["channels_last"] == 1 for r in runs[True])
    assert all(r["channels_last"] == 0 for r in runs[False])
    # NCHW fp16 convolutions carry the transposes (aux bytes); NHWC ones do not (the deep
    # 7x7 layers keep a split-K reduce in both layouts).
    big = [i for i, r in enumerate(runs[False]) if r["conv_h"] >= 28]
    assert len(big) >= 10
    assert all(runs[False][i]["aux_bytes"] > 0 for i in big)
    assert all(runs[True][i]["aux_bytes"] == 0 for i in big)
    assert all(a["aux_bytes"] <= b["aux_bytes"] for a, b in zip(runs[True], runs[False],
                                                                strict=True))
    nchw = sum(r["analytic_time_s"] for r in runs[False])
    nhwc = sum(r["analytic_time_s"] for r in runs[True])
    assert nhwc < 0.95 * nchw
    # the caller's module is untouched (blink converts its meta copy)
    w = net.conv1.weight
    assert w.is_contiguous() and not w.is_contiguous(memory_format=torch.channels_last)


def test_convolutions_of_channels_last_like_views_trace_channels_last():
    """A channel slice of a channels-last tensor (FocalNet's torch.split of its 1x1 projection)
    and a permuted NHWC view are not channels-last *contiguous*, but their strides order like
    it, and CUDA's cudnn_conv_suggest_memory_format (suggest_memory_format) gives their
    convolutions channels-last outputs. The trace must carry the same layout: the output
    strides are those of a dense NHWC tensor, and an NCHW input still gives NCHW."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = torch.nn.Conv2d(32, 2 * 32 + 4, 1)
            self.dw = torch.nn.Conv2d(32, 32, 9, padding=4, groups=32, bias=False)
            self.pw = torch.nn.Conv2d(32, 32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, ctx, _ = torch.split(self.f(x), [32, 32, 4], 1)  # slices of a CL output
            nhwc = q.permute(0, 2, 3, 1).contiguous()
            return self.dw(ctx) + self.pw(nhwc.permute(0, 3, 1, 2))

    with torch.device("meta"):
        net = Net()
    n, h, w = 4, 16, 16
    dense_cl = torch.empty(n, 32, h, w, device="meta").to(memory_format=torch.channels_last)
    for cl in (True, False):
        t = blink.trace_model(net, input_shape=(n, 32, h, w), dtype="amp-fp16",
                              gpu="A100-40GB", channels_last=cl)
        convs = [o for o in t.ops if o.name == "aten::convolution"]
        assert len(convs) == 3
        f_out, dw_in, dw_out, pw_out = (convs[0].tensors("outputs")[0],
                                        convs[1].tensors("inputs")[0],
                                        convs[1].tensors("outputs")[0],
                                        convs[2].tensors("outputs")[0])
        if cl:
            assert tuple(f_out.stride) == (68 * h * w, 1, w * 68, 68)
            assert tuple(dw_in.stride) == (68 * h * w, 1, w * 68, 68)  # the slice, as it is
            assert tuple(dw_out.stride) == dense_cl.stride()
        else:
            assert tuple(dw_out.stride) == (32 * h * w, h * w, w, 1)
        # the permuted NHWC view is channels-last contiguous in both runs
        assert tuple(pw_out.stride) == dense_cl.stride()


def test_channels_last_needs_an_image_input(capsys):
    with pytest.raises(blink.ConfigError, match="4-D floating input"):
        blink.predict("hf:gpt2", batch_size=1, seq_len=16, channels_last=True)
    assert main(["predict", "torchvision:resnet18", "-b", "2", "--dtype", "amp-bf16",
                 "--gpu", "H100-SXM", "--channels-last", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"] == "H100-SXM" and doc["time_ms"] > 0 and doc["channels_last"] is True
    p = blink.Prediction.from_json(json.dumps(doc))
    assert p.channels_last and "channels-last" in p.table()


def test_permuted_views_in_real_models_are_costed_as_gathering_kernels():
    """CaiT's talking-heads attention permutes (B, H, N, N) scores around two Linears over the
    heads: those copies run PyTorch's gathering kernel. A ResNet-50 has no permuted view, and
    XCiT's NCHW <-> token reshapes mostly vanish when the model runs channels-last."""
    import timm
    import torch

    from blink.cost import trace_features

    def permuted(name: str, cl: bool = False) -> tuple[int, float]:
        with torch.device("meta"):
            net = timm.create_model(name)
        t = blink.trace_model(net, input_shape=(8, 3, 224, 224), dtype="amp-fp16",
                              gpu="RTX3090", channels_last=cl)
        rows = trace_features(t, "RTX3090")
        return (sum(1 for r in rows if r["permuted"]),
                sum(r["analytic_time_s"] for r in rows if r["permuted"]))

    n, secs = permuted("cait_xxs24_224")
    assert n >= 2 * 24 and secs > 0  # at least the two head mixes of each of the 24 blocks
    assert permuted("resnet50") == (0, 0.0)
    assert permuted("xcit_nano_12_p16_224", cl=True)[0] < permuted("xcit_nano_12_p16_224")[0]


def test_nchw_bilinear_upsampling_is_costed_as_its_serial_per_pixel_loop():
    """PyTorch's NCHW bilinear upsampling kernel runs one thread per output pixel, each looping
    over every image and channel, so its time follows N x C, not the bytes; the channels-last
    kernel (>= 16 channels) is one thread per element and streams like an element-wise op."""
    import torch
    from torch import nn

    from blink.cost import trace_features

    class Up(nn.Module):
        def __init__(self, c: int, scale: int) -> None:
            super().__init__()
            self.proj = nn.Conv2d(c, c, 1)
            self.up = nn.Upsample(scale_factor=scale, mode="bilinear")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.up(self.proj(x))

    def up(n: int, c: int, hw: int, scale: int = 2, cl: bool = False) -> dict:
        with torch.device("meta"):
            net = Up(c, scale)
        t = blink.trace_model(net, input_shape=(n, c, hw, hw), dtype="amp-fp16",
                              gpu="RTX3090", channels_last=cl)
        rows = [r for r in trace_features(t, "RTX3090") if r["op"] == "aten::upsample_bilinear2d"]
        assert len(rows) == 1
        return rows[0]

    # EfficientFormerV2's stride-2 attention: 7x7 -> 14x14 over 1024 images x 1024 channels
    nchw = up(1024, 1024, 7)
    assert nchw["parallelism"] == 14 * 14  # threads: output pixels, not elements
    assert nchw["analytic_time_s"] > 50 * nchw["memory_time_s"]  # far from streaming its bytes
    assert 0.1 < nchw["analytic_time_s"] < 1.0  # seconds: a million dependent steps per thread
    # doubling the images doubles every thread's loop; 4x the output pixels adds threads that
    # run side by side in the same wave, so the time barely moves
    twice = up(2048, 1024, 7)
    assert twice["analytic_time_s"] == pytest.approx(2 * nchw["analytic_time_s"], rel=0.02)
    wider = up(1024, 1024, 7, scale=4)
    assert wider["analytic_time_s"] == pytest.approx(nchw["analytic_time_s"], rel=0.1)
    # channels-last with >= 16 channels: the per-element NHWC kernel, bandwidth-bound
    nhwc = up(1024, 1024, 7, cl=True)
    assert nhwc["channels_last"]
    assert nhwc["parallelism"] > 1000 * nchw["parallelism"]
    assert nhwc["analytic_time_s"] < 1.5 * nhwc["memory_time_s"] + 1e-5
    assert nchw["analytic_time_s"] > 50 * nhwc["analytic_time_s"]
    # fewer than 16 channels keep the looping kernel even when channels-last
    assert up(1024, 8, 7, cl=True)["parallelism"] == 14 * 14


def test_bilinear_upsampling_backward_zero_fills_then_scatters_atomically():
    """upsample_bilinear2d_backward has its own rule (UpSampleBilinear2d.cu): grad_input is
    zero-filled by one kernel, then a second scatters four atomic adds per grad_output element,
    so grad_input's bytes cross DRAM three times (fill, line reads, write-back)."""
    import torch
    from torch import nn

    from blink.cost import trace_features

    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Conv2d(64, 64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.interpolate(self.proj(x), scale_factor=2, mode="bilinear")

    def backward_row(loss_fn) -> dict:
        with torch.device("meta"):
            net = Up()
        t = blink.trace_model(net, input_shape=(8, 64, 32, 32), mode="train", gpu="A100-80GB",
                              loss_fn=loss_fn)
        rows = [r for r in trace_features(t, "A100-80GB")
                if r["op"] == "aten::upsample_bilinear2d_backward"]
        assert len(rows) == 1
        return rows[0]

    grad_in, grad_out = 8 * 64 * 32 * 32 * 4, 8 * 64 * 64 * 64 * 4
    row = backward_row(lambda out: (out * out).sum())  # a dense grad_output
    assert row["matched"] and row["kernels"] == 2
    assert row["bytes_read"] == pytest.approx(grad_out + grad_in)
    assert row["bytes_written"] == pytest.approx(2 * grad_in)
    # a sum's gradient is one value broadcast: .contiguous() copies it out first
    broadcast = backward_row(lambda out: out.sum())
    assert broadcast["kernels"] == 3
    assert broadcast["bytes_written"] == pytest.approx(2 * grad_in + grad_out)


def test_unfold_and_fold_launch_one_kernel_per_image():
    """F.unfold / F.fold (im2col / col2im) loop over the batch on the host, one kernel per image
    (VOLO's outlook attention, TNT's pixel embedding): N launch floors, so a batch of tiny images
    costs far more than the bytes it moves."""
    import torch
    from torch import nn

    from blink.cost import trace_features

    class UnfoldFold(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            cols = nn.functional.unfold(x, kernel_size=3, padding=1)
            return nn.functional.fold(cols, output_size=x.shape[-2:], kernel_size=3, padding=1)

    def units(shape: tuple[int, ...]) -> dict[str, dict]:
        with torch.device("meta"):
            net = UnfoldFold()
        t = blink.trace_model(net, input_shape=shape, gpu="RTX3090")
        rows = trace_features(t, "RTX3090")
        return {r["op"]: r for r in rows if r["op"] in ("aten::im2col", "aten::col2im")}

    batched = units((256, 8, 14, 14))
    assert set(batched) == {"aten::im2col", "aten::col2im"}
    for r in batched.values():
        assert r["kernels"] == 256
        # 256 launches of a few-KB kernel: bound by launches, not by bytes
        assert r["analytic_time_s"] > 20 * r["memory_time_s"]
    one = units((1, 8, 14, 14))
    assert all(r["kernels"] == 1 for r in one.values())
    assert one["aten::im2col"]["analytic_time_s"] < batched["aten::im2col"]["analytic_time_s"] / 50


def test_amp_group_norm_inference_says_where_the_time_goes():
    # AMP inference with float32 group norms gets a note with their share of the unit time and
    # how to avoid the fp32 path; batch norm, fp32 and training steps do not.
    from blink.collect.models import ConvNet, GNNet

    def predict(net, dtype, gpu, predictor="auto"):
        with torch.device("meta"):
            m = net()
        t = blink.trace_model(m, input_shape=(64, 3, 128, 128), dtype=dtype)
        return predict_trace(t, gpu, predictor=predictor)

    def notes(*args):
        return [n for n in predict(*args).notes if "group norm" in n]

    p = predict(GNNet, "amp-fp16", "H200")
    (note,) = [n for n in p.notes if "group norm" in n]
    gn = sum(u.time_ms for u in p.units if u.op == "aten::native_group_norm")
    share = int(note.split("%")[0])
    assert 5 <= share <= 60 and abs(share - 100 * gn / sum(u.time_ms for u in p.units)) <= 0.5
    assert "set_fast_norm" in note and "timm_group_norm.py" in note
    assert notes(GNNet, "amp-bf16", "A100-80GB", "analytic")
    assert not notes(ConvNet, "amp-fp16", "H200")
    assert not notes(GNNet, "fp32", "H200")
    with torch.device("meta"):
        m = GNNet()
    t = blink.trace_model(m, input_shape=(8, 3, 128, 128), dtype="amp-fp16", mode="train")
    assert not [n for n in predict_trace(t, "H200").notes if "group norm" in n]


class _PermutedSoftmaxNorm(torch.nn.Module):
    """CaiT's talking-heads softmax over attn.permute(0, 3, 1, 2) and timm's LayerNorm2d over
    x.permute(0, 2, 3, 1); `explicit` writes the .contiguous() the CUDA kernels make."""

    def __init__(self, explicit: bool) -> None:
        super().__init__()
        self.explicit = explicit
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, attn: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = attn.permute(0, 3, 1, 2)
        y = x.permute(0, 2, 3, 1)
        if self.explicit:
            a, y = a.contiguous(), y.contiguous()
        return a.softmax(dim=-1), self.norm(y)


def test_softmax_and_layer_norm_over_permuted_views_cost_the_copy_the_cuda_code_makes():
    """On meta the softmax and layer norm kernels never run, so the .contiguous() inside their
    CUDA host code (SoftMax.cu host_softmax, layer_norm_kernel.cu layer_norm_cuda) is not in the
    trace: the units carry it. A model that writes the copy itself costs the same GPU time."""
    from blink.cost import trace_features

    with torch.device("meta"):
        attn = torch.empty(16, 256, 256, 8)
        x = torch.empty(16, 64, 112, 112)
    units = {}
    for explicit in (False, True):
        with torch.device("meta"):
            net = _PermutedSoftmaxNorm(explicit)
        t = blink.trace_model(net, inputs=(attn, x), gpu="H200")
        units[explicit] = [r for r in trace_features(t, "H200") if r["analytic_time_s"] > 0]
    soft = [r for r in units[False] if r["kind"] == "softmax"]
    norm = [r for r in units[False] if r["kind"] == "norm"]
    assert len(soft) == len(norm) == 1 and soft[0]["kernels"] == norm[0]["kernels"] == 2
    copies = [r for r in units[True] if r["kind"] == "copy"]
    assert len(copies) == 2 and all(r["permuted"] for r in copies)
    assert not any(r["kind"] == "copy" for r in units[False])
    implicit = sum(r["analytic_time_s"] for r in units[False])
    written = sum(r["analytic_time_s"] for r in units[True])
    assert implicit == pytest.approx(written, rel=0.02)


class _TalkingHeadsSoftmax(torch.nn.Module):
    def __init__(self, explicit: bool) -> None:
        super().__init__()
        self.explicit = explicit

    def forward(self, attn: torch.Tensor) -> torch.Tensor:
        a = attn.permute(0, 3, 1, 2)
        return (a.contiguous() if self.explicit else a).softmax(dim=-1)


def test_the_copy_inside_softmax_holds_its_buffer_while_the_kernel_runs():
    """host_softmax's input.contiguous() allocates a row-major copy that lives until the kernel
    returns, beside the output: the peak is the one of a model that writes the copy itself
    (input + copy + output), not input + output."""
    with torch.device("meta"):
        attn = torch.empty(8, 512, 512, 16, dtype=torch.float16)
    runs = {explicit: blink.predict(_TalkingHeadsSoftmax(explicit), inputs=(attn,), gpu="H200",
                                    predictor="analytic")
            for explicit in (False, True)}
    copy = attn.numel() * attn.element_size()
    implicit = runs[False]
    assert implicit.peak_allocated_bytes == runs[True].peak_allocated_bytes
    # the resident input, its copy and the fp16 output
    assert implicit.peak_allocated_bytes >= implicit.resident_bytes + 2 * copy
