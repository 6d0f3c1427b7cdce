"""CUDA paths the meta dry run does not take (issue 9, item 5): the trace records what CUDA runs.

Each test traces real torch modules on meta and checks the ops, shapes, dtypes and memory the
trace holds against what PyTorch's CUDA dispatch does (RNN.cpp -> _cudnn_rnn, Dropout.cpp ->
native_dropout, Normalization.cpp -> cudnn_batch_norm, autocast, device="cuda").
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import blink
from blink import cost
from blink.errors import TraceError
from blink.predict import predict_trace
from blink.trace import trace

GPU = "H100"


def _meta(*shape: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def _names(t) -> list[str]:
    return [op.name for op in t.ops]


def _unit_ops(t) -> list[str]:
    return [u.op for u in predict_trace(t, GPU).units if u.kernels > 0]


def _rnn_time_ms(module: torch.nn.Module, x: torch.Tensor, train: bool = False) -> float:
    module.train(train)
    with trace(module, gpu=GPU) as t:
        out = module(x)[0]
        if train:
            out.sum().backward()
    return sum(u.time_ms for u in predict_trace(t, GPU).units if "cudnn_rnn" in u.op)


# ---- RNNs ---------------------------------------------------------------------------------------

def test_lstm_forward_is_one_cudnn_rnn_call() -> None:
    with torch.device("meta"):
        lstm = torch.nn.LSTM(128, 256, num_layers=2).eval()
    x = _meta(30, 8, 128)
    with trace(lstm, gpu=GPU) as t:
        out, (h, c) = lstm(x)
    assert (out.shape, h.shape, c.shape) == ((30, 8, 256), (2, 8, 256), (2, 8, 256))
    rnn = [op for op in t.ops if op.name == "aten::_cudnn_rnn"]
    assert len(rnn) == 1
    assert rnn[0].inputs[6] == 2  # CUDNN_LSTM
    # No per-timestep cell: the native path would run 2 GEMMs per step and layer.
    units = _unit_ops(t)
    assert not any(u.startswith(("aten::addmm", "aten::mm", "aten::sigmoid")) for u in units)
    # Inference keeps no reserve space.
    assert rnn[0].outputs[3].numel == 0


def test_lstm_training_records_the_cudnn_backward_and_the_reserve_space() -> None:
    with torch.device("meta"):
        lstm = torch.nn.LSTM(64, 128, num_layers=2, bidirectional=True)
    x = _meta(20, 4, 64, grad=True)
    with trace(lstm, gpu=GPU) as t:
        out, _ = lstm(x)
        out.sum().backward()
    names = _names(t)
    assert names.count("aten::_cudnn_rnn") == 1
    assert names.count("aten::_cudnn_rnn_backward") == 1
    fwd = next(op for op in t.ops if op.name == "aten::_cudnn_rnn")
    reserve = fwd.outputs[3]
    # The backward needs at least the 4 gate activations of every (layer, direction, step).
    gate_bytes = 4 * 128 * 20 * 4 * 2 * 2 * 4
    assert reserve.dtype == "uint8" and reserve.numel >= gate_bytes
    # It lives until the backward has used it: freed only after the backward allocated dx.
    bwd = next(op for op in t.ops if op.name == "aten::_cudnn_rnn_backward")
    events = t.allocations
    first_bwd = next(i for i, ev in enumerate(events) if ev.op == bwd.id and not ev.is_free)
    free_at = [i for i, ev in enumerate(events) if ev.storage == reserve.storage and ev.is_free]
    assert len(free_at) == 1 and free_at[0] > first_bwd
    # Every weight got a gradient of its own shape.
    for p in lstm.parameters():
        assert p.grad is not None and p.grad.shape == p.shape
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("cls, mode", [(torch.nn.GRU, 3), (torch.nn.RNN, 1)])
def test_gru_and_rnn_take_cudnn_too(cls: type, mode: int) -> None:
    with torch.device("meta"):
        net = cls(32, 64, batch_first=True)
    with trace(net, gpu=GPU) as t:
        out, h = net(_meta(4, 10, 32))
    assert out.shape == (4, 10, 64) and h.shape == (1, 4, 64)
    rnn = [op for op in t.ops if op.name == "aten::_cudnn_rnn"]
    assert len(rnn) == 1 and rnn[0].inputs[6] == mode


def test_bf16_lstm_runs_the_native_cuda_cells() -> None:
    # at::cudnn_is_acceptable accepts float, half and double only: bf16 runs RNN.cpp's native
    # loop, which on CUDA is two matmuls and one fused cell kernel per step and layer.
    with torch.device("meta"):
        lstm = torch.nn.LSTM(32, 48, num_layers=2, bidirectional=True).to(torch.bfloat16)
    x = _meta(5, 2, 32, dtype=torch.bfloat16, grad=True)
    with trace(lstm, gpu=GPU) as t:
        out, (h, c) = lstm(x)
        out.float().sum().backward()
    assert (out.shape, h.shape, c.shape) == ((5, 2, 96), (4, 2, 48), (4, 2, 48))
    names = _names(t)
    assert "aten::_cudnn_rnn" not in names
    steps = 5 * 2 * 2  # timesteps x layers x directions
    assert names.count("aten::_thnn_fused_lstm_cell") == steps
    assert names.count("aten::_thnn_fused_lstm_cell_backward_impl") == steps
    units = _unit_ops(t)
    assert sum(u.startswith("aten::mm") for u in units) >= 2 * steps
    assert not any(u.startswith(("aten::sigmoid", "aten::tanh")) for u in units)
    assert x.grad is not None and all(p.grad is not None for p in lstm.parameters())


def test_cudnn_disabled_stays_off_cudnn() -> None:
    with torch.device("meta"):
        lstm = torch.nn.LSTM(32, 32)
    with torch.backends.cudnn.flags(enabled=False), trace(lstm, gpu=GPU) as t:
        lstm(_meta(5, 2, 32))
    assert "aten::_cudnn_rnn" not in _names(t)


def test_packed_sequence_lstm_uses_cudnn_with_batch_sizes() -> None:
    with torch.device("meta"):
        lstm = torch.nn.LSTM(8, 16)
    packed = torch.nn.utils.rnn.pack_padded_sequence(_meta(5, 3, 8), torch.tensor([5, 4, 2]))
    with trace(lstm, gpu=GPU) as t:
        out, _ = lstm(packed)
    assert out.data.shape == (11, 16)
    rnn = next(op for op in t.ops if op.name == "aten::_cudnn_rnn")
    assert rnn.inputs[14] == [3, 3, 2, 2, 1]


def test_lstm_time_grows_linearly_with_timesteps_and_with_hidden_size() -> None:
    with torch.device("meta"):
        small, big = torch.nn.LSTM(256, 256), torch.nn.LSTM(256, 2048)
    t40 = _rnn_time_ms(small, _meta(40, 16, 256))
    t80 = _rnn_time_ms(small, _meta(80, 16, 256))
    t160 = _rnn_time_ms(small, _meta(160, 16, 256))
    # T dependent steps: doubling T about doubles the time (the input GEMM is a small share).
    assert 1.6 < t80 / t40 < 2.2 and 1.6 < t160 / t80 < 2.2
    # A hidden size 8x larger: 64x the recurrent FLOPs; it must cost clearly more.
    assert _rnn_time_ms(big, _meta(80, 16, 256)) > 2 * t80
    # Each step is at least a launch of the recurrent GEMM and of the gate kernel.
    assert t80 * 1e-3 >= 80 * 2 * 2e-6


def test_lstm_backward_costs_more_than_forward() -> None:
    with torch.device("meta"):
        lstm = torch.nn.LSTM(512, 512)
    fwd = _rnn_time_ms(lstm, _meta(50, 32, 512))
    both = _rnn_time_ms(lstm, _meta(50, 32, 512, grad=True), train=True)
    assert both > 2 * fwd  # backward data + weights: about twice the forward's FLOPs


def test_dry_run_flattens_rnn_weights_as_cuda_does() -> None:
    # blink.predict's meta copy gets flat weights (flatten_parameters on .cuda()): _cudnn_rnn
    # reads them in place and allocates no weight copy.
    t = blink.trace_model(torch.nn.LSTM(64, 64, num_layers=2), input_shape=(10, 4, 64))
    rnn = next(op for op in t.ops if op.name == "aten::_cudnn_rnn")
    assert rnn.inputs[3] is not None and rnn.inputs[3].storage < 0  # the resident weights
    weights = sum(p.numel() for p in torch.nn.LSTM(64, 64, num_layers=2).parameters()) * 4
    made = [ev.nbytes for ev in t.allocations if not ev.is_free and ev.op == rnn.id]
    assert weights not in made


def test_unflattened_weights_are_copied_on_every_call() -> None:
    with torch.device("meta"):
        lstm = torch.nn.LSTM(64, 64)
    with trace(lstm, gpu=GPU) as t:
        lstm(_meta(10, 4, 64))
    rnn = next(op for op in t.ops if op.name == "aten::_cudnn_rnn")
    assert rnn.inputs[3] is None
    weights = sum(p.numel() for p in lstm.parameters()) * 4
    assert rnn.outputs[4].storage > 0 and rnn.outputs[4].nbytes == weights


# ---- dropout ----------------------------------------------------------------------------------

def test_training_dropout_is_one_fused_kernel_with_a_bool_mask() -> None:
    x = _meta(64, 1024, grad=True)
    with trace(None, gpu=GPU) as t:
        y = F.dropout(x, 0.1, training=True)
        y.sum().backward()
    fwd = [op for op in t.ops if op.name == "aten::native_dropout"]
    assert len(fwd) == 1
    out, mask = fwd[0].outputs
    assert mask.dtype == "bool" and mask.shape == (64, 1024) and out.dtype == "float32"
    assert "aten::native_dropout_backward" in _names(t)
    units = _unit_ops(t)
    assert not any(u.startswith(("aten::bernoulli", "aten::div", "aten::mul")) for u in units)
    # The mask kept for backward is 1 byte per element, not a float.
    assert mask.nbytes == 64 * 1024


def test_eval_dropout_launches_nothing() -> None:
    x = _meta(64, 1024)
    with trace(None, gpu=GPU) as t:
        F.dropout(x, 0.1, training=False)
    assert _unit_ops(t) == []


def test_nn_dropout_module_in_a_training_step() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Dropout(0.5))
    t = blink.trace_model(net, input_shape=(8, 32), mode="train", optimizer="none")
    assert "aten::native_dropout" in _names(t)
    assert "aten::native_dropout_backward" in _names(t)


# ---- batch norm -------------------------------------------------------------------------------

def test_training_batch_norm_runs_cudnn() -> None:
    with torch.device("meta"):
        bn = torch.nn.BatchNorm2d(16)
    x = _meta(8, 16, 32, 32, grad=True)
    with trace(bn, gpu=GPU) as t:
        bn(x).sum().backward()
    names = _names(t)
    assert "aten::cudnn_batch_norm" in names and "aten::cudnn_batch_norm_backward" in names
    assert "aten::native_batch_norm" not in names


@pytest.mark.parametrize("make, shape, dtype", [
    (lambda: torch.nn.BatchNorm1d(16), (8, 16), torch.float32),        # input.dim() < 3
    (lambda: torch.nn.BatchNorm2d(16).double(), (8, 16, 4, 4), torch.float64),  # double
])
def test_batch_norm_outside_cudnns_conditions_stays_native(make, shape, dtype) -> None:
    with torch.device("meta"):
        bn = make()
    with trace(bn, gpu=GPU) as t:
        bn(_meta(*shape, dtype=dtype))
    names = _names(t)
    assert "aten::cudnn_batch_norm" not in names and "aten::native_batch_norm" in names


# ---- autocast and device="cuda" in user code ---------------------------------------------------

def test_user_autocast_cuda_is_honoured() -> None:
    a, b = _meta(64, 64), _meta(64, 64)
    with trace(None, gpu=GPU) as t, torch.autocast("cuda", dtype=torch.bfloat16):
        y = a @ b
    assert y.dtype == torch.bfloat16
    mm = next(op for op in t.ops if op.name == "aten::mm")
    assert {x.dtype for x in mm.tensors()} == {"bfloat16"}


def test_user_autocast_with_the_tensors_device_type() -> None:
    x = _meta(16, 16)
    with trace(None, gpu=GPU):
        assert not torch.is_autocast_enabled(x.device.type)
        with torch.autocast(x.device.type, dtype=torch.float16):
            assert torch.is_autocast_enabled(x.device.type)
            assert torch.is_autocast_enabled(device_type=x.device.type)
            assert torch.get_autocast_dtype(x.device.type) == torch.float16
            assert (x @ x).dtype == torch.float16
        assert not torch.is_autocast_enabled(x.device.type)


def test_autocast_decorator_and_disabled_region() -> None:
    lin = torch.nn.Linear(8, 8, device="meta")

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cuda", enabled=False):
            inner = lin(x)
        return lin(x), inner

    with trace(None, gpu=GPU):
        cast, plain = torch.autocast("cuda", dtype=torch.bfloat16)(f)(_meta(4, 8))
    assert cast.dtype == torch.bfloat16 and plain.dtype == torch.float32


def test_autocast_made_before_the_trace_warns_instead_of_silently_running_fp32() -> None:
    if torch.cuda.is_available():
        pytest.skip("with CUDA present torch keeps the region enabled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        early = torch.autocast("cuda", dtype=torch.bfloat16)  # torch disables it here
    with trace(None, gpu=GPU), pytest.warns(UserWarning, match="inside the traced code"):
        with early:
            pass


def test_autocast_is_restored_after_the_trace() -> None:
    from torch.amp.autocast_mode import autocast

    before = autocast.__init__
    with trace(None, gpu=GPU):
        pass
    assert autocast.__init__ is before
    with pytest.raises(RuntimeError):
        torch.is_autocast_enabled("meta")  # unpatched torch refuses the meta device again


def test_device_cuda_in_user_code_traces_on_meta() -> None:
    with trace(None, gpu=GPU) as t:
        z = torch.zeros(4, 4, device="cuda")
        w = torch.ones(4, 4, device=torch.device("cuda:0"))
        x = _meta(4, 4).cuda() + z.to("cuda") + w.to(device="cuda")
        lin = torch.nn.Linear(4, 4, device="meta").cuda()
        y = lin(x)
    assert y.device.type == "meta" and z.device.type == "meta"
    assert "aten::zeros" in _unit_ops(t)


def test_cuda_runtime_calls_get_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: torch.cuda.synchronize() succeeds")
    with pytest.raises(TraceError, match=r"torch\.cuda\.\*"):
        with warnings.catch_warnings(), trace(None, gpu=GPU):
            warnings.simplefilter("ignore")
            torch.cuda.synchronize()


# ---- fp32 attention math ----------------------------------------------------------------------

def _efficient_attention(gpu: str) -> dict:
    q = cost.tensor_arg((2, 8, 1024, 64), 6)
    lse = cost.tensor_arg((2, 8, 1024), 6)
    inputs = [q, q, q, (0, None), (0, None), (0, None), (0, None), (0, None)]
    inputs[4] = (5, True)  # compute_log_sumexp (ArgKind kBool)
    outputs = [q, lse, cost.tensor_arg((), 4), cost.tensor_arg((), 4)]
    return cost.unit_features("aten::_scaled_dot_product_efficient_attention", inputs, outputs,
                              gpu)


def test_fp32_efficient_attention_runs_3xtf32_on_sm80_and_simt_before() -> None:
    # mem-efficient attention's CUTLASS GEMMs: TensorOp + OpMultiplyAddFastF32 on sm_80+.
    h100 = _efficient_attention("H100")
    assert h100["math_mode"] == "3xtf32"
    spec = blink.hardware.get_gpu("H100")
    assert h100["compute_time_s"] == pytest.approx(h100["flops"] / (spec.peak_flops["tf32"] / 3))
    assert _efficient_attention("V100")["math_mode"] == "fp32_simt"


def test_cudnn_rnn_math_follows_cudnns_tf32_flag() -> None:
    # cudnn/RNN.cpp asks cuDNN for FMA math only when torch.backends.cudnn.allow_tf32 is off.
    with torch.device("meta"):
        lstm = torch.nn.LSTM(64, 64)
    with trace(lstm, gpu=GPU) as t:
        lstm(_meta(10, 4, 64))
    on = {u.op: u.math_mode for u in predict_trace(t, GPU, allow_tf32_cudnn=True).units}
    off = {u.op: u.math_mode for u in predict_trace(t, GPU, allow_tf32_cudnn=False).units}
    assert on["aten::_cudnn_rnn"] == "tf32" and off["aten::_cudnn_rnn"] == "fp32_simt"
    assert predict_trace(t, "V100").units[-1].math_mode == "fp32_simt"  # no TF32 before sm_80


def test_disabled_keeps_the_meta_paths_for_non_cuda_comparisons() -> None:
    from blink import cuda_paths

    with cuda_paths.disabled(), trace(None, gpu=GPU) as t:
        F.dropout(_meta(8, 8), 0.5, training=True)
    assert "aten::native_dropout" not in _names(t)
    with trace(None, gpu=GPU) as t:  # and it switches back on
        F.dropout(_meta(8, 8), 0.5, training=True)
    assert "aten::native_dropout" in _names(t)


# -- nn.MultiheadAttention's inference fast path (attention.cu native_multi_head_attention_cuda) --
def _encoder(need_weights: bool = False) -> torch.nn.Module:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, need_weights=need_weights)[0]

    return Block()


def _bmm_inputs(t) -> list[tuple[int, ...]]:
    return [tuple(op.tensors("inputs")[0].shape) for op in t.ops if op.name == "aten::bmm"]


def test_eval_multihead_attention_takes_the_fused_fast_path_cuda_takes() -> None:
    """In inference CUDA runs torch._native_multi_head_attention: one in-projection GEMM, the
    fused SDPA kernel, the out-projection. Meta used to take the slow path, whose in-projection
    of the transposed input is a bmm over the 32 tokens of 2-row GEMMs."""
    m = _encoder().to("meta").eval().requires_grad_(False)
    with torch.no_grad(), trace(m, gpu=GPU) as t:
        m(_meta(2, 32, 64))
    names = _names(t)
    assert "aten::_scaled_dot_product_efficient_attention" in names  # fp32 on sm_90
    assert _bmm_inputs(t) == []
    assert names.count("aten::addmm") == 2
    # In training the module takes the slow path on CUDA too.
    m = _encoder().to("meta").train()
    with trace(m, gpu=GPU) as tt:
        m(_meta(2, 32, 64, grad=True)).sum().backward()
    assert "aten::_scaled_dot_product_efficient_attention_backward" in _names(tt)
    # Nothing stays patched after a trace.
    assert torch.nn.MultiheadAttention.forward.__module__ == "torch.nn.modules.activation"


def test_eval_multihead_attention_with_weights_runs_the_batched_gemm_path() -> None:
    """need_weights (MultiheadAttention's default) keeps native MHA off SDPA: two bmms over
    batch x heads, and the averaged weights as the second output."""
    m = _encoder(need_weights=True).to("meta").eval().requires_grad_(False)
    x = _meta(2, 32, 64)
    with torch.no_grad(), trace(m, gpu=GPU) as t:
        out = m.attn(x, x, x)
    assert _bmm_inputs(t) == [(8, 32, 16), (8, 32, 32)]
    assert out[0].shape == (2, 32, 64) and out[1].shape == (2, 32, 32)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_native_mha_mirror_matches_torchs_kernel(need_weights: bool, average: bool) -> None:
    """The mirror computes what torch._native_multi_head_attention returns (on the CPU, real
    values): exactly on its SDPA branch, the same shapes on the batched-GEMM one (whose costed
    stand-ins skip the q scaling and the mask)."""
    from blink.cuda_paths import _native_mha_cuda

    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    x = torch.randn(2, 32, 64)
    args = (64, 4, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, None,
            need_weights, average)
    with torch.no_grad():
        want = torch._native_multi_head_attention(x, x, x, *args)
        got = _native_mha_cuda((9, 0), x, x, x, *args)
    assert got[0].shape == want[0].shape
    if not need_weights:
        assert got[1] is None
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    else:
        assert got[1].shape == want[1].shape
