"""torch._grouped_mm (the MoE experts of transformers' Mixtral-style models): GEMM FLOPs from
the shapes, the kernel path the target GPU takes (one CUTLASS grouped kernel for bf16 on
sm_90 / sm_100, else one cuBLAS call per group after a device-to-host copy of the offsets), and
host-device syncs on the eager timeline."""
from __future__ import annotations

import pytest
import torch
from hf_helpers import hf_config

import blink
from blink.cost import trace_features
from blink.flops import trace_flops

TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000,
                "max_position_embeddings": 512}


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> str:
    return hf_config(tmp_path_factory.mktemp("moe"), TINY_MIXTRAL)


def _grouped(p: blink.Prediction) -> list:
    return [u for u in p.units if u.op.startswith("aten::_grouped_mm")]


def _experts_flops(batch: int, seq: int) -> float:
    """Each routed token runs gate, up (hidden x inter each) and down (inter x hidden)."""
    c = TINY_MIXTRAL
    routed = batch * seq * c["num_experts_per_tok"]
    return (c["num_hidden_layers"] * 2.0 * routed * 3 * c["hidden_size"]
            * c["intermediate_size"])


def test_experts_flops_and_path_follow_the_config_and_the_gpu(mixtral):
    run = dict(batch_size=2, seq_len=32, dtype="bf16")
    t = blink.trace_model(mixtral, gpu="H200", **run)
    hopper = blink.predict_trace(t, gpu="H200")
    ampere = blink.predict_trace(t, gpu="A100-80GB")
    for p in (hopper, ampere):
        units = _grouped(p)
        assert units and all(u.kind == "gemm" for u in units)
        assert sum(u.flops for u in units) == pytest.approx(_experts_flops(2, 32))
    # sm_90 bf16: CUTLASS's grouped kernel, one launch, no sync
    assert all(u.kernels == 1 for u in _grouped(hopper))
    assert not any(e["syncs"] for e in hopper.timeline)
    # sm_80: _grouped_mm_fallback, a GEMM per expert that got tokens, after offs.cpu()
    assert all(u.kernels >= TINY_MIXTRAL["num_local_experts"] for u in _grouped(ampere))
    waits = [i for i, e in enumerate(ampere.timeline) if e["syncs"]]
    assert len(waits) == len(_grouped(ampere))
    for i in waits:
        # the host's copy returns only once the stream has run everything enqueued before it
        done = max(e["gpu_end_s"] for e in ampere.timeline[:i])
        assert ampere.timeline[i]["host_end_s"] >= done
    assert any("copy a GPU value to the host" in n for n in ampere.notes)
    # the whole step's matmul FLOPs include the experts' (blink.flops uses the same rules)
    assert trace_flops(t) > _experts_flops(2, 32)
    # every kernel of the layer has a rule (the router's histc and floor_divide included)
    assert [r["op"] for r in trace_features(t, "H200") if not r["matched"]] == []


def test_training_runs_each_expert_gemm_three_times(mixtral):
    t = blink.trace_model(mixtral, gpu="H200", batch_size=2, seq_len=32, dtype="bf16",
                          mode="train")
    p = blink.predict_trace(t, gpu="H200")
    by_phase: dict[str, float] = {}
    for u in _grouped(p):
        by_phase[u.phase] = by_phase.get(u.phase, 0.0) + u.flops
    # backward: the input gradient (2-D x 3-D) and the weight gradient (2-D x 2-D, grouped
    # along K), each as many FLOPs as the forward
    assert by_phase["forward"] == pytest.approx(_experts_flops(2, 32))
    assert by_phase["backward"] == pytest.approx(2 * _experts_flops(2, 32))


class _Experts(torch.nn.Module):
    def __init__(self, experts: int, k: int, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(experts, k, n, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.w, offs=offs)


@pytest.mark.parametrize("gpu", ["H200", "A100-80GB"])
def test_a_few_tokens_read_only_the_experts_they_reach(gpu):
    net = _Experts(64, 512, 1024)
    expert_bytes = 512 * 1024 * 2
    offs = torch.empty(64, dtype=torch.int32, device="meta")

    def unit(rows: int):
        x = torch.empty(rows, 512, dtype=torch.bfloat16, device="meta")
        (u,) = _grouped(blink.predict(net, (x, offs), gpu=gpu))
        assert u.flops == 2 * rows * 512 * 1024
        return u

    decode, prefill = unit(2), unit(8192)
    # two routed rows reach at most two experts: their weights, not all 64
    assert expert_bytes <= decode.bytes <= 2 * expert_bytes + 2 * 512 * 2 + 2 * 1024 * 2 + 256
    assert prefill.bytes >= 64 * expert_bytes
    assert decode.time_ms < prefill.time_ms


def test_a_sync_waits_for_the_gpu():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4096, 4096)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(self.fc(x))
            keep = torch.nonzero(y[:, 0] > 0)  # a device-to-host copy of the count on a GPU
            return y[keep[:, 0]]

    x = torch.empty(8192, 4096, device="meta")
    p = blink.predict(Net(), (x,), gpu="H100-SXM", nonzero="assume_all")
    (i,) = [i for i, e in enumerate(p.timeline) if e["syncs"]]
    assert p.timeline[i]["op"].startswith("aten::nonzero")
    gpu_done = max(e["gpu_end_s"] for e in p.timeline[:i])
    assert p.timeline[i]["host_end_s"] >= gpu_done > p.timeline[i - 1]["host_end_s"]
    assert any("1 op(s) copy a GPU value to the host" in n for n in p.notes)


def test_fp32_experts_trace_with_the_layout_the_real_kernel_gives(mixtral):
    # CUDA (and CPU) take fp32 grouped GEMMs through the per-group fallback; torch's own meta
    # kernel refuses them, Blink's (during a trace) checks what CUDA checks.
    x = torch.randn(10, 24)
    w = torch.randn(4, 38, 24).transpose(-2, -1)  # (4, 24, 38), K contiguous as nn.Linear's
    offs = torch.tensor([2, 5, 5, 10], dtype=torch.int32)
    real = torch._grouped_mm(x, w, offs=offs)  # the real kernel, on the CPU
    seen = {}

    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            out = torch._grouped_mm(x, w, offs=offs)
            seen["meta"] = (tuple(out.shape), out.stride(), out.dtype)
            return out

    with blink.trace(Net()):
        Net()(x.to("meta"), w.to("meta"), offs.to("meta"))
    assert seen["meta"] == (tuple(real.shape), real.stride(), real.dtype)  # rows padded to 40
    with blink.trace(Net()), pytest.raises(RuntimeError, match="Float32, BFloat16 or Float16"):
        Net()(x.double().to("meta"), w.double().to("meta"), offs.to("meta"))

    p = blink.predict(mixtral, batch_size=2, seq_len=32, gpu="A100-80GB")  # fp32
    units = _grouped(p)
    assert units and all(u.math_mode == "fp32_simt" for u in units)  # TF32 off by default
    assert sum(u.flops for u in units) == pytest.approx(_experts_flops(2, 32))
