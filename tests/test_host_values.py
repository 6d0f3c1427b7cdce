"""Values the host knows in a dry run: tensors copied to the device from host memory (numpy
masks, cpu_tensor.to(device)) size the data-dependent shapes CUDA sizes from them (nonzero,
boolean-mask indexing), a model's host-side random draws come from a fixed seed, and boolean-mask
indexing is costed as the nonzero + index kernels and the host sync CUDA runs."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from hf_helpers import hf_config

import blink
from blink import dryrun
from blink.known_values import KnownValues

# Every speech model of the wav2vec2 line draws a SpecAugment mask with numpy in training
# (transformers' _compute_mask_indices) and indexes with it: x[mask] = embedding.
TINY_W2V = {"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"], "vocab_size": 32,
            "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "conv_dim": [32] * 7, "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 4, "mask_time_prob": 0.3, "mask_time_length": 5,
            "layerdrop": 0.0}


@pytest.fixture(scope="module")
def w2v(tmp_path_factory) -> str:
    return hf_config(tmp_path_factory.mktemp("w2v"), TINY_W2V)


def _meta(cpu: torch.Tensor) -> torch.Tensor:
    return cpu.to("meta")


@pytest.mark.parametrize("case", ["nonzero", "index", "masked_select", "repeat_interleave",
                                  "unique", "item"])
def test_shapes_from_host_copies_match_the_cpu(case):
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(6, 7, generator=gen) > 0.6
    counts = torch.randint(0, 4, (9,), generator=gen)
    x = torch.randn(6, 7, 5, generator=gen)

    def run(m: torch.Tensor, c: torch.Tensor, data: torch.Tensor) -> torch.Tensor | float:
        if case == "nonzero":
            return m.nonzero()
        if case == "index":
            return data[m]
        if case == "masked_select":
            return torch.masked_select(data, m[..., None])
        if case == "repeat_interleave":
            return torch.repeat_interleave(c)
        if case == "unique":
            return torch.unique(c * 2 + 1)
        return (m.sum() + c.max()).item()

    want = run(mask, counts, x)
    with KnownValues():
        # the data tensor is a meta tensor of unknown values; only the mask / counts are known
        got = run(_meta(mask), _meta(counts), torch.empty(6, 7, 5, device="meta"))
    if isinstance(want, torch.Tensor):
        assert got.device.type == "meta"
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    else:
        assert got == want


def test_unknown_masks_still_need_values():
    with KnownValues():
        m = torch.empty(4, 4, device="meta") > 0  # values never known
        with pytest.raises(RuntimeError):
            m.nonzero()
        known = _meta(torch.tensor([True, False, True, True]))
        known[1:3] = m[0, :2]  # a write of unknown values: no longer known
        with pytest.raises(RuntimeError):
            known.nonzero()


def test_cpu_tensors_are_written_once():
    # In-place ops on real CPU tensors (an optimizer's step count) run once, as without the mode
    step = torch.zeros(())
    with KnownValues():
        step.add_(1)
        _meta(step).add_(1)
    assert step.item() == 1.0


def test_speech_training_traces_with_its_specaugment_mask(w2v):
    t = blink.trace_model(w2v, mode="train", batch_size=3, gpu="H100-SXM")
    assert t.meta["shapes_sized"] >= 1
    # The mask CUDA indexes with is the one the model draws (numpy, from blink's fixed seed).
    from transformers import Wav2Vec2Config
    from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2ForCTC, _compute_mask_indices

    cfg = Wav2Vec2Config(**{k: v for k, v in TINY_W2V.items() if k != "model_type"})
    with torch.device("meta"):
        frames = int(Wav2Vec2ForCTC(cfg)._get_feat_extract_output_lengths(16000))
    state = np.random.get_state()
    np.random.seed(dryrun.HOST_SEED)
    mask = _compute_mask_indices((3, frames), mask_prob=cfg.mask_time_prob,
                                 mask_length=cfg.mask_time_length,
                                 min_masks=cfg.mask_time_min_masks)
    np.random.set_state(state)
    count = int(mask.sum())
    assert 0 < count < 3 * frames
    gathers = [op for op in t.ops if op.name == "aten::index" and op.phase == "backward"]
    assert [g.tensors("outputs")[0].shape for g in gathers] == [(count, TINY_W2V["hidden_size"])]

    p = blink.predict_trace(t, gpu="H100-SXM")
    masked = [e for e in p.timeline if e["op"].startswith(("aten::index", "aten::_index_put"))
              and e["syncs"]]
    assert {e["phase"] for e in masked} == {"forward", "backward"}
    assert any("data-dependent shape(s)" in n and "sized" in n for n in p.notes)


def test_a_mask_index_costs_the_nonzero_kernels_and_a_sync():
    mask = torch.zeros(64, 512, dtype=torch.bool)
    mask[:, ::2] = True  # half of the rows
    idx = mask.nonzero().unbind(1)
    x = torch.empty(64, 512, 256, device="meta")

    class Both(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # the same gather, from a host mask and from its coordinates
            return x[mask.to(x.device)], x[idx[0].to(x.device), idx[1].to(x.device)]

    t = blink.trace_model(Both(), (x,), gpu="H100-SXM")
    p = blink.predict_trace(t, gpu="H100-SXM", predictor="analytic")
    by_mask, by_coords = [u for u in p.units if u.op.startswith("aten::index")]
    rows = 64 * 256
    assert [op.tensors("outputs")[0].shape for op in t.ops if op.name == "aten::index"] == [
        (rows, 256), (rows, 256)]
    assert by_mask.kernels == by_coords.kernels + 2  # nonzero's count and select passes
    # reads the mask twice and writes its int64 coordinates, then the same gather reads them
    mask_bytes = 64 * 512
    assert by_mask.bytes == pytest.approx(by_coords.bytes + 2 * mask_bytes + 8 * 2 * rows)
    syncs = [e["op"] for e in p.timeline if e["syncs"]]
    # the mask's nonzero, and the three blocking copies from host memory
    assert [op for op in syncs if op.startswith("aten::index")] == ["aten::index.Tensor"]
    assert len(syncs) == 4


def test_host_random_draws_are_fixed_and_the_callers_generators_kept(tmp_path):
    cfg = dict(TINY_W2V, layerdrop=0.5, num_hidden_layers=6)  # LayerDrop: torch.rand([]) a layer
    name = hf_config(tmp_path, cfg)
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    before = (torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    a = blink.predict(name, mode="train", batch_size=2, gpu="H100-SXM")
    b = blink.predict(name, mode="train", batch_size=2, gpu="H100-SXM")
    assert a.time_ms == b.time_ms and a.flops == b.flops
    assert torch.equal(torch.random.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])
    # LayerDrop skipped some of the 6 layers, the same ones both times
    c = blink.predict(hf_config(tmp_path, dict(cfg, layerdrop=0.0)), mode="train",
                      batch_size=2, gpu="H100-SXM")
    assert a.flops < c.flops


def test_masked_fill_with_a_cpu_value_traces():
    # SEW-D's XSoftmax: x.masked_fill(mask, torch.tensor(finfo.min)), a 0-dim CPU value, which
    # CUDA reads as a scalar
    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = x.masked_fill(x > 0, torch.tensor(torch.finfo(x.dtype).min))
            return out.masked_fill_(out < -1, torch.tensor(0.0))

    x = torch.empty(8, 16, device="meta")
    t = blink.trace_model(Net(), (x,), gpu="H100-SXM")
    fills = [op for op in t.ops if op.name.startswith("aten::masked_fill")]
    assert [op.full_name for op in fills] == [
        "aten::masked_fill.Tensor", "aten::masked_fill_.Tensor", "aten::masked_fill_.Tensor"]
    assert all(op.tensors("outputs")[0].shape == (8, 16) for op in fills)
    # out of place: ATen's composite, a contiguous clone then the in-place kernel
    assert [t.ops[c].name for c in fills[0].children] == [
        "aten::expand", "aten::clone", "aten::masked_fill_"]
    with pytest.raises(blink.TraceError, match="0-dimensional"):
        blink.trace_model(lambda_module(lambda x: x.masked_fill(x > 0, torch.zeros(2))), (x,))


def lambda_module(fn):  # noqa: ANN001, ANN201 - a test helper
    class Wrap(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(x)

    return Wrap()


def test_zoo_models_keep_no_tensor_off_the_meta_device(w2v):
    net = blink.zoo.build(w2v)
    assert all(t.device.type == "meta" for t in [*net.parameters(), *net.buffers()])


@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_host_to_device_copy_waits_unless_non_blocking(non_blocking):
    # copy_kernel_cuda (cuda/Copy.cu): memcpy_and_sync, a cudaStreamSynchronize, unless
    # non_blocking; the copy waits for the GEMMs queued before it
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(2048, 2048)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(self.fc(x))
            offsets = torch.arange(2048, dtype=x.dtype)  # made on the host
            return y + offsets.to(y.device, non_blocking=non_blocking)

    p = blink.predict(Net(), (torch.empty(4096, 2048, device="meta"),), gpu="H100-SXM")
    waits = [e for e in p.timeline if e["syncs"]]
    if non_blocking:
        assert waits == []
    else:
        assert len(waits) == 1 and waits[0]["op"].startswith(("aten::to", "aten::copy_"))
        gpu_done = max(e["gpu_end_s"] for e in p.timeline if e["op"].startswith("aten::linear"))
        assert waits[0]["host_end_s"] >= gpu_done


ACTIVATION_MASK = '''
import torch


class Keep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = self.fc(x)
        return y[y > 0]  # a mask of activations: its count is data no dry run has


def build():
    return Keep()
'''


def test_cli_sizes_unknown_masks_only_when_asked(tmp_path, capsys):
    from blink.cli import main

    path = tmp_path / "keep.py"
    path.write_text(ACTIVATION_MASK)
    argv = ["predict", f"{path}:build", "--input-shape", "64", "-b", "8", "--gpu", "H100-SXM"]
    assert main(argv) == 2
    assert "--nonzero assume_all" in capsys.readouterr().err
    assert main([*argv, "--nonzero", "assume_all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (gather,) = [u for u in doc["units"] if u["op"].startswith("aten::index")]
    assert gather["bytes"] >= 8 * 64 * 4  # every element taken as kept
    assert any("upper bound" in n for n in doc["notes"])
