"""Per-unit features of the C++ cost engine, blink._C.features_for (csrc/core/features.cpp).

Arguments are built in the trace's raw format (the tuples blink._C hands to blink.trace): each
argument is (kind, value) with kind in blink::ArgKind order and a tensor value
(sizes, strides, storage_offset, storage, storage_nbytes, dtype_code, device_type, requires_grad).
Every expected number is derived in the test from the shapes; on whole models the same FLOPs are
checked against torch's FlopCounterMode (tests/test_zoo.py).
"""
from __future__ import annotations

import importlib
import math

import pytest
import torch

from blink import _C, hardware
from blink.errors import BlinkError

if not hasattr(_C, "features_for"):
    pytest.skip("blink._C.features_for is not bound yet", allow_module_level=True)

# blink.trace the module (the package re-exports a function of the same name)
trace = importlib.import_module("blink.trace")  # noqa: E402

# blink::ArgKind
NONE, TENSOR, TENSOR_LIST, INT, DOUBLE, BOOL, STRING, INT_LIST = 0, 1, 2, 3, 4, 5, 6, 7
# c10::ScalarType codes (checked against torch in test_dtype_codes_match_torch)
U8, I64, F16, F32, F64, BOOLT, BF16, E4M3 = 0, 4, 5, 6, 7, 11, 15, 24
CUDA = 1

KINDS = ["gemm", "conv", "attention", "norm", "softmax", "reduction", "elementwise",
         "embedding", "copy", "optimizer", "loss", "other"]
MATH = ["fp32_simt", "tf32", "bf16_tc", "fp16_tc", "fp8_tc", "other"]

_next_storage = [0]


def contiguous(sizes):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def tensor(sizes, dtype=F32, strides=None, storage=None):
    """A raw tensor value; each call is a new storage unless one is given."""
    if storage is None:
        _next_storage[0] += 1
        storage = _next_storage[0]
    sizes = tuple(sizes)
    strides = tuple(strides) if strides is not None else contiguous(sizes)
    return (sizes, strides, 0, storage, 0, dtype, CUDA, False)


def t(sizes, dtype=F32, strides=None):
    return (TENSOR, tensor(sizes, dtype, strides))


def tl(values):
    return (TENSOR_LIST, list(values))


def i(v):
    return (INT, v)


def d(v):
    return (DOUBLE, float(v))


def b(v):
    return (BOOL, bool(v))


def il(v):
    return (INT_LIST, list(v))


none = (NONE, None)


def gpu(name):
    g = hardware.get_gpu(name)
    pk = {k: float(v or 0.0) for k, v in g.peak_flops.items()}
    return _C.GpuSpec(
        name=g.name, sm_count=g.sm_count, clock_hz=g.boost_clock_mhz * 1e6,
        mem_bw=float(g.memory_bandwidth_bytes_per_s), l2_bytes=float(g.l2_bytes),
        peak_fp32=pk["fp32"], peak_tf32=pk.get("tf32", 0.0), peak_bf16=pk.get("bf16", 0.0),
        peak_fp16=pk["fp16"], peak_fp8=pk.get("fp8", 0.0),
        cc_major=g.compute_capability[0], cc_minor=g.compute_capability[1],
        dram_efficiency=g.dram_efficiency,
    )


H100, H200, A100 = gpu("H100-SXM"), gpu("H200"), gpu("A100-80GB")


def feats(name, inputs, outputs, g=H100, **kw):
    return _C.features_for(name, list(inputs), list(outputs), g, **kw)


def kind(f):
    return f["kind"] if isinstance(f["kind"], str) else KINDS[int(f["kind"])]


def math_mode(f):
    m = f["math_mode"]
    return m if isinstance(m, str) else MATH[int(m)]


# ---- dtypes ------------------------------------------------------------------------------


def test_dtype_codes_match_torch():
    for dt, code in [(torch.uint8, U8), (torch.int64, I64), (torch.float16, F16),
                     (torch.float32, F32), (torch.float64, F64), (torch.bool, BOOLT),
                     (torch.bfloat16, BF16), (torch.float8_e4m3fn, E4M3)]:
        assert _C.scalar_type_of(torch.empty(0, dtype=dt, device="meta")) == code


def test_itemsize_of_every_torch_dtype():
    # An unknown op reads its tensors: a one-element tensor reads itemsize bytes.
    for code, name in trace._dtype_table().items():
        dt = getattr(torch, name)
        f = feats("aten::no_such_op", [t((1,), code)], [])
        assert f["bytes_read"] == max(dt.itemsize, 1), name


# ---- GEMM ----------------------------------------------------------------------------------


def test_mm_flops_bytes_layout_and_tiles():
    M, K, N = 4096, 1024, 2048
    a, bm, c = t((M, K), F16), t((K, N), F16), t((M, N), F16)
    f = feats("aten::mm", [a, bm], [c])
    assert kind(f) == "gemm"
    assert f["flops"] == 2 * M * N * K
    assert f["bytes_read"] + f["bytes_written"] == (M * K + K * N + M * N) * 2
    assert (f["m"], f["n"], f["k"], f["batch"]) == (M, N, K, 1)
    assert not f["trans_a"] and not f["trans_b"]
    assert math_mode(f) == "fp16_tc"
    # the planned cuBLAS tile: one output tile per CTA (times any K split), in waves
    assert (f["tile_m"], f["tile_n"]) in {(256, 128), (128, 256), (128, 128), (128, 64),
                                          (64, 128), (64, 64)}
    assert f["tiles"] == (math.ceil(M / f["tile_m"]) * math.ceil(N / f["tile_n"])
                          * f["split_k"])
    assert f["waves"] == math.ceil(f["tiles"] / (132 * f["blocks_per_sm"]))
    assert f["compute_time_s"] == pytest.approx(2 * M * N * K / 989.4e12)
    assert f["memory_time_s"] == pytest.approx((M * K + K * N + M * N) * 2 / 3.35e12)
    assert f["roofline_time_s"] == max(f["compute_time_s"], f["memory_time_s"])
    # the transpose of a contiguous (N, K) weight: last dim not contiguous
    ft = feats("aten::mm", [a, t((K, N), F16, strides=(1, K))], [c])
    assert ft["trans_b"] and not ft["trans_a"]


def test_addmm_reads_bias_and_out_destination_is_not_read():
    M, K, N = 256, 512, 1024
    bias, a, w, c = t((N,), F16), t((M, K), F16), t((K, N), F16), t((M, N), F16)
    f = feats("aten::addmm", [bias, a, w, d(1), d(1)], [c])
    assert f["flops"] == 2 * M * N * K
    assert f["bytes_read"] == (N + M * K + K * N) * 2
    fo = feats("aten::mm.out", [a, w, c], [c])
    assert fo["bytes_read"] == (M * K + K * N) * 2
    assert fo["bytes_written"] == M * N * 2


@pytest.mark.parametrize("name,inputs,outputs,expected", [
    # 2 * M * N * K
    ("aten::mm", [t((64, 32), F16), t((32, 16), F16)], [t((64, 16), F16)], 2 * 64 * 16 * 32),
    ("aten::addmm", [t((16,), F16), t((64, 32), F16), t((32, 16), F16)], [t((64, 16), F16)],
     2 * 64 * 16 * 32),
    # 2 * batch * M * N * K
    ("aten::bmm", [t((12, 128, 64), BF16), t((12, 64, 128), BF16)], [t((12, 128, 128), BF16)],
     2 * 12 * 128 * 128 * 64),
    ("aten::baddbmm", [t((12, 128, 128), F32), t((12, 128, 64), F32), t((12, 64, 128), F32)],
     [t((12, 128, 128), F32)], 2 * 12 * 128 * 128 * 64),
    # 2 * N * Ho * Wo * K * (C / groups) * R * S, groups = 4
    ("aten::convolution",
     [t((8, 64, 56, 56), F16), t((128, 16, 3, 3), F16), none, il((1, 1)), il((1, 1)), il((1, 1)),
      b(False), il((0, 0)), i(4)], [t((8, 128, 56, 56), F16)], 2 * 8 * 56 * 56 * 128 * 16 * 9),
    # transposed: every input point scatters C_in x (C_out / groups) x R x S MACs
    ("aten::convolution",
     [t((8, 64, 28, 28), F16), t((64, 32, 4, 4), F16), none, il((2, 2)), il((1, 1)), il((1, 1)),
      b(True), il((0, 0)), i(1)], [t((8, 32, 56, 56), F16)], 2 * 8 * 28 * 28 * 64 * 32 * 16),
    # attention forward: QK^T and PV, 2 * (batch * query heads) * Lq * Lk * (d + dv)
    ("aten::_scaled_dot_product_flash_attention",
     [t((2, 16, 1024, 64), F16), t((2, 16, 1024, 64), F16), t((2, 16, 1024, 64), F16), d(0),
      b(True), b(False), none], [t((2, 16, 1024, 64), F16), t((2, 16, 1024), F32)],
     2 * 32 * 1024 * 1024 * (64 + 64)),
    ("aten::_scaled_dot_product_efficient_attention",  # GQA: 16 query heads, 4 kv heads
     [t((2, 16, 512, 64), BF16), t((2, 4, 512, 64), BF16), t((2, 4, 512, 128), BF16), none,
      b(True), d(0), b(False), none], [t((2, 16, 512, 128), BF16), t((2, 16, 512), F32)],
     2 * 32 * 512 * 512 * (64 + 128)),
    # backward: recomputed scores, dV, dP, dQ, dK: 2 * bh * Lq * Lk * (3d + 2dv)
    ("aten::_scaled_dot_product_flash_attention_backward",
     [t((2, 8, 256, 64), F16), t((2, 8, 256, 64), F16), t((2, 8, 256, 64), F16),
      t((2, 8, 256, 64), F16), t((2, 8, 256, 64), F16), t((2, 8, 256), F32), none, none, i(256),
      i(256), d(0), b(False), t((2,), I64), t((0,), U8), none],
     [t((2, 8, 256, 64), F16), t((2, 8, 256, 64), F16), t((2, 8, 256, 64), F16)],
     2 * 16 * 256 * 256 * (3 * 64 + 2 * 64)),
])
def test_flops_by_hand(name, inputs, outputs, expected):
    assert feats(name, inputs, outputs)["flops"] == expected


def test_tf32_flags_pick_the_math_mode():
    a, w, c = t((512, 512)), t((512, 512)), t((512, 512))
    assert math_mode(feats("aten::mm", [a, w], [c])) == "fp32_simt"
    assert math_mode(feats("aten::mm", [a, w], [c], allow_tf32_matmul=True)) == "tf32"
    conv_in = [t((8, 64, 32, 32)), t((64, 64, 3, 3)), none, il((1, 1)), il((1, 1)), il((1, 1)),
               b(False), il((0, 0)), i(1)]
    out = [t((8, 64, 32, 32))]
    assert math_mode(feats("aten::convolution", conv_in, out)) == "tf32"  # cuDNN default
    no_tf32 = feats("aten::convolution", conv_in, out, allow_tf32_cudnn=False)
    assert math_mode(no_tf32) == "fp32_simt"


def test_fp8_gemm_on_a100_is_an_error():
    args = [t((64, 64), E4M3), t((64, 64), E4M3, strides=(1, 64)), t((), F32), t((), F32)]
    assert math_mode(feats("aten::_scaled_mm", args, [t((64, 64), BF16)])) == "fp8_tc"
    with pytest.raises(BlinkError, match="A100"):
        feats("aten::_scaled_mm", args, [t((64, 64), BF16)], g=A100)


def test_composite_ops_are_not_units():
    with pytest.raises(BlinkError, match="composite"):
        feats("aten::linear", [t((4, 8)), t((16, 8)), none], [t((4, 16))])


# ---- convolution ---------------------------------------------------------------------------


def test_conv_geometry_groups_and_implicit_gemm():
    x, w, y = t((8, 64, 56, 56), F16), t((128, 16, 3, 3), F16), t((8, 128, 28, 28), F16)
    f = feats("aten::convolution",
              [x, w, none, il((2, 2)), il((1, 1)), il((1, 1)), b(False), il((0, 0)), i(4)], [y])
    assert kind(f) == "conv"
    assert (f["conv_n"], f["conv_c"], f["conv_h"], f["conv_w"]) == (8, 64, 56, 56)
    assert (f["conv_k"], f["conv_r"], f["conv_s"], f["groups"]) == (128, 3, 3, 4)
    assert (f["stride_h"], f["pad_w"], f["out_h"], f["out_w"]) == (2, 1, 28, 28)
    assert f["flops"] == 2 * 8 * 28 * 28 * 128 * 16 * 9
    assert (f["m"], f["n"], f["k"], f["batch"]) == (8 * 28 * 28, 32, 16 * 9, 4)
    assert f["bytes_read"] == (8 * 64 * 56 * 56 + 128 * 16 * 9) * 2


def test_conv_backward_counts_requested_gradients():
    go, x, w = t((8, 128, 56, 56), F16), t((8, 64, 56, 56), F16), t((128, 64, 3, 3), F16)
    one = 2 * 8 * 56 * 56 * 128 * 64 * 9

    def run(mask, outs):
        return feats("aten::convolution_backward",
                     [go, x, w, il((128,)), il((1, 1)), il((1, 1)), il((1, 1)), b(False),
                      il((0, 0)), i(1), il(mask)], outs)

    full = run((1, 1, 1), [t((8, 64, 56, 56), F16), t((128, 64, 3, 3), F16), t((128,), F16)])
    # dgrad, wgrad and the bias reduction, plus (NCHW half on tensor cores) layout transposes
    assert full["flops"] == 2 * one and full["kernels"] >= 3 and full["backward"]
    wgrad = run((0, 1, 0), [none, t((128, 64, 3, 3), F16), none])
    assert wgrad["flops"] == one and wgrad["bytes_written"] == 128 * 64 * 9 * 2


# ---- attention -----------------------------------------------------------------------------


def test_sdpa_bytes_have_no_score_matrix():
    B, H, L, D = 2, 16, 4096, 64
    q = [t((B, H, L, D), F16) for _ in range(3)]
    out, lse = t((B, H, L, D), F16), t((B, H, L), F32)
    f = feats("aten::_scaled_dot_product_flash_attention", [*q, d(0), b(True), b(False), none],
              [out, lse, none, none, i(L), i(L), t((2,), I64), t((0,), U8), t((0,), F16)])
    assert kind(f) == "attention" and f["causal"]
    assert f["bytes_read"] == 3 * B * H * L * D * 2
    assert f["bytes_written"] == B * H * L * D * 2 + B * H * L * 4
    assert f["bytes_read"] + f["bytes_written"] < B * H * L * L  # far below one L x L matrix
    assert (f["m"], f["n"], f["k"], f["batch"]) == (L, L, D, B * H)


# ---- row-wise, element-wise, memory ops ------------------------------------------------------


def test_layer_norm_rows_and_bytes():
    x, w, bb = t((32, 128, 768), F16), t((768,), F16), t((768,), F16)
    outs = [t((32, 128, 768), F16), t((32, 128, 1), F32), t((32, 128, 1), F32)]
    f = feats("aten::native_layer_norm", [x, il((768,)), w, bb, d(1e-5)], outs)
    assert kind(f) == "norm" and (f["outer"], f["inner"]) == (32 * 128, 768)
    assert f["bytes_read"] == (32 * 128 * 768 + 2 * 768) * 2
    assert f["bytes_written"] == 32 * 128 * 768 * 2 + 2 * 32 * 128 * 4


@pytest.mark.parametrize("op", ["aten::cudnn_batch_norm", "aten::native_batch_norm"])
def test_inference_batch_norm_streams_like_an_elementwise_op(op):
    """Eval-mode batch norm is one per-element affine kernel over every element (ATen's
    batch_norm_elementwise, cuDNN's bn_fw_inf_1C11_kernel_NCHW), not a CTA per channel: a
    16-channel layer streams as fast as a 512-channel one of the same size, and as fast as a
    per-channel multiply over the same bytes. Training mode adds the per-channel statistics
    kernel."""
    def bn(c, training):
        x = t((64, c, 8192 // c, 32), F16)
        p = [t((c,), F32) for _ in range(4)]
        outs = [t((64, c, 8192 // c, 32), F16)] + [t((c,), F32)] * 2
        outs += [t((0,), U8)] if op == "aten::cudnn_batch_norm" else []
        args = [x, *p, b(training), d(0.1), d(1e-5)]
        return feats(op, args, outs)

    narrow, wide = bn(16, False), bn(512, False)
    assert kind(narrow) == "norm" and narrow["kernels"] == 1
    assert narrow["numel"] == wide["numel"] == 64 * 8192 * 32
    assert narrow["analytic_time_s"] == pytest.approx(wide["analytic_time_s"], rel=0.02)
    x, y = t((64, 16, 512, 32), F16), t((64, 16, 512, 32), F16)
    mul = feats("aten::mul.Tensor", [x, t((16, 1, 1), F16)], [y])
    assert narrow["analytic_time_s"] == pytest.approx(mul["analytic_time_s"], rel=0.05)
    train = bn(16, True)
    assert train["kernels"] == 2 and train["analytic_time_s"] > 1.5 * narrow["analytic_time_s"]


def test_softmax_rows():
    x = t((8, 12, 512, 256), F16)
    f = feats("aten::_softmax", [x, i(-1), b(False)], [t((8, 12, 512, 256), F16)])
    assert kind(f) == "softmax" and (f["outer"], f["inner"]) == (8 * 12 * 512, 256)


def test_short_row_forward_softmax_streams_at_the_warp_kernels_rate():
    """Rows of <= 1024 elements run the persistent warp softmax (kWarpSoftmaxSlowdown below the
    element-wise rate), forward and backward (softmax_warp_backward loads grad and output the
    same scalar way); a 2048-element row runs the block kernel (two input passes)."""
    rows = 1 << 16

    def softmax(n, op="aten::_softmax"):
        x = t((rows, n))
        if op == "aten::_softmax":
            return feats(op, [x, i(-1), b(False)], [t((rows, n))])
        return feats(op, [t((rows, n)), x, i(-1), i(6)], [t((rows, n))])

    def relu(n):  # the same bytes read and written, streamed by the element-wise kernel
        return feats("aten::relu", [t((rows, n))], [t((rows, n))])

    short, long_ = softmax(1024), softmax(2048)
    assert short["warp_softmax"] and not long_["warp_softmax"]
    assert short["input_passes"] == 1 and long_["input_passes"] == 2
    ratio = short["analytic_time_s"] / relu(1024)["analytic_time_s"]
    assert ratio == pytest.approx(_C.kWarpSoftmaxSlowdown, rel=0.02) and ratio > 1.15
    # the block kernel: input twice and the output once, 3 / 2 of relu's bytes
    assert long_["analytic_time_s"] / relu(2048)["analytic_time_s"] == pytest.approx(1.5, rel=0.02)
    back, back_long = (softmax(n, "aten::_softmax_backward_data") for n in (1024, 2048))
    assert back["warp_softmax"] and not back_long["warp_softmax"]
    # grad and output read, grad_input written: 3 / 2 of relu's bytes, at the warp kernel's rate
    assert back["analytic_time_s"] / relu(1024)["analytic_time_s"] == pytest.approx(
        1.5 * _C.kWarpSoftmaxSlowdown, rel=0.02)


def test_elementwise_broadcast_input_is_read_once():
    x, y = t((64, 1024)), t((64, 1024))
    expect = (64 * 1024 + 1024) * 4
    assert feats("aten::add.Tensor", [x, t((1024,)), d(1)], [y])["bytes_read"] == expect
    # the same bias already expanded to (64, 1024) with a stride-0 dim
    f = feats("aten::add.Tensor", [x, t((64, 1024), strides=(0, 1)), d(1)], [y])
    assert f["bytes_read"] == expect and f["bytes_written"] == 64 * 1024 * 4
    assert kind(f) == "elementwise" and f["numel"] == 64 * 1024 and f["flops"] == 64 * 1024
    same = tensor((64, 1024))
    assert feats("aten::mul", [(TENSOR, same), (TENSOR, same)], [y])["bytes_read"] == 64 * 1024 * 4


def test_copy_and_embedding_bytes():
    dst, src = tensor((64, 1024)), tensor((64, 1024), F16, strides=(1, 64))
    f = feats("aten::copy_", [(TENSOR, dst), (TENSOR, src), b(False)], [(TENSOR, dst)])
    assert kind(f) == "copy" and f["flops"] == 0
    assert (f["bytes_read"], f["bytes_written"]) == (64 * 1024 * 2, 64 * 1024 * 4)
    # contiguous() of a contiguous tensor returns it: no kernel
    f = feats("aten::contiguous", [(TENSOR, dst), i(0)], [(TENSOR, dst)])
    assert f["kernels"] == 0 and f["bytes_read"] == 0
    # embedding reads the looked-up rows, not the table
    table, idx = t((50257, 768), F16), t((8, 512), I64)
    f = feats("aten::embedding", [table, idx, i(-1), b(False), b(False)], [t((8, 512, 768), F16)])
    assert kind(f) == "embedding"
    assert f["bytes_read"] == 8 * 512 * 8 + 8 * 512 * 768 * 2


def test_fused_adamw_sums_over_lists():
    sizes = [768 * 768, 768] * 10
    lists = [[tensor((n,)) for n in sizes] for _ in range(4)]
    steps = [tensor(()) for _ in sizes]
    f = feats("aten::_fused_adamw_",
              [tl(lists[0]), tl(lists[1]), tl(lists[2]), tl(lists[3]), tl([]), tl(steps),
               d(1e-3), d(0.9), d(0.999), d(0.01), d(1e-8), b(False), b(False), none, none], [])
    total = sum(sizes)
    assert kind(f) == "optimizer" and f["numel"] == total
    assert f["bytes_read"] == 4 * total * 4 + len(sizes) * 4
    assert f["bytes_written"] == 3 * total * 4
    assert f["kernels"] >= 1


def test_unknown_op_falls_back_to_tensor_bytes():
    f = feats("aten::no_such_op", [t((1000,))], [t((1000,))])
    assert kind(f) == "other" and not f["matched"] and f["flops"] == 0
    assert f["bytes_read"] + f["bytes_written"] == 8000


# ---- roofline --------------------------------------------------------------------------------


def test_roofline_bandwidth_and_peaks():
    n = 1 << 26
    args = ([t((n,)), t((n,))], [t((n,))])
    h100, h200 = feats("aten::add", *args, g=H100), feats("aten::add", *args, g=H200)
    assert h200["memory_time_s"] < h100["memory_time_s"]  # H200: 4.8 vs 3.35 TB/s
    assert h100["memory_time_s"] / h200["memory_time_s"] == pytest.approx(4.8 / 3.35)
    gemm = ([t((8192, 8192), F16), t((8192, 8192), F16)], [t((8192, 8192), F16)])
    g100, g200 = feats("aten::mm", *gemm, g=H100), feats("aten::mm", *gemm, g=H200)
    assert g100["compute_time_s"] > g100["memory_time_s"]  # compute-bound
    assert g100["roofline_time_s"] == pytest.approx(g200["roofline_time_s"])  # equal peaks
    # 8192^2 outputs in the planned tiles, in full waves of the 132 SMs
    assert g100["tiles"] == (8192 // g100["tile_m"]) * (8192 // g100["tile_n"]) * g100["split_k"]
    assert g100["waves"] == math.ceil(g100["tiles"] / (132 * g100["blocks_per_sm"]))


def test_permuted_copies_and_elementwise_pay_the_gathering_kernel():
    """x.permute(...).contiguous() and an element-wise op over a permuted view run PyTorch's
    non-vectorised, gathering TensorIterator kernel (kPermutedCopySlowdown); a broadcast input
    (stride 0) and tensors in one order do not."""
    shape = (64, 128, 56, 56)  # NCHW
    nhwc = (128 * 56 * 56, 1, 56 * 128, 128)  # the same sizes stored channels-last
    dst = tensor(shape, F16)
    plain = feats("aten::copy_", [(TENSOR, dst), t(shape, F16), b(False)], [(TENSOR, dst)])
    perm = feats("aten::copy_", [(TENSOR, dst), t(shape, F16, nhwc), b(False)], [(TENSOR, dst)])
    assert not plain["permuted"] and perm["permuted"]
    assert perm["bytes_read"] == plain["bytes_read"]  # same bytes, slower kernel
    ratio = perm["analytic_time_s"] / plain["analytic_time_s"]
    assert 1.5 < ratio <= _C.kPermutedCopySlowdown
    # a permuted destination (copy into a channels-last buffer) gathers its writes
    into = tensor(shape, F16, nhwc)
    f = feats("aten::copy_", [(TENSOR, into), t(shape, F16), b(False)], [(TENSOR, into)])
    assert f["permuted"]
    # element-wise: a permuted operand gathers; a broadcast one (stride 0) and a same-order one
    # do not
    out = t(shape, F16)
    f = feats("aten::add.Tensor", [t(shape, F16), t(shape, F16, nhwc), d(1)], [out])
    assert f["permuted"]
    bias = t(shape, F16, (128, 1, 0, 0))
    assert not feats("aten::add.Tensor", [t(shape, F16), bias, d(1)], [out])["permuted"]
    assert not feats("aten::add.Tensor", [t(shape, F16, nhwc), t(shape, F16, nhwc), d(1)],
                     [t(shape, F16, nhwc)])["permuted"]
    # tiny views stay launch-bound: not flagged
    small = tensor((4, 8, 8), F16)
    f = feats("aten::copy_", [(TENSOR, small), t((4, 8, 8), F16, (1, 32, 4)), b(False)],
              [(TENSOR, small)])
    assert not f["permuted"]


def _copy_of(x_raw, dtype):
    """The explicit x.contiguous() a model could write: copy_ into a row-major buffer."""
    dst = tensor(x_raw[1][0], dtype)
    return feats("aten::copy_", [(TENSOR, dst), x_raw, b(False)], [(TENSOR, dst)])


def test_softmax_and_layer_norm_pay_the_copy_their_cuda_code_makes_of_a_permuted_input():
    """SoftMax.cu's host_softmax takes input_.contiguous() and layer_norm_cuda
    input.expect_contiguous() before their kernels: over a permuted view (CaiT's talking-heads
    softmax, timm's LayerNorm2d over x.permute(0, 2, 3, 1)) the op runs one more kernel, the
    same gathering copy as an explicit .contiguous(), then the op on the row-major copy."""
    shape = (32, 8, 196, 196)
    heads_last = (8 * 196 * 196, 1, 196 * 8, 8)  # (B, N, N, H) stored, viewed as (B, H, N, N)
    assert torch.empty(32, 196, 196, 8, device="meta").permute(0, 3, 1, 2).stride() == heads_last
    x_perm, x_rows = t(shape, F16, heads_last), t(shape, F16)
    soft = [i(-1), b(True)]
    perm = feats("aten::_softmax", [x_perm, *soft], [t(shape, F32)])
    rows = feats("aten::_softmax", [x_rows, *soft], [t(shape, F32)])
    copy = _copy_of(x_perm, F16)
    assert copy["permuted"] and (perm["kernels"], rows["kernels"]) == (2, 1)
    assert perm["bytes_read"] == rows["bytes_read"]  # the main kernel's own traffic is unchanged
    assert perm["analytic_time_s"] == pytest.approx(
        rows["analytic_time_s"] + copy["analytic_time_s"], rel=0.01)

    nchw = (64, 96, 56, 56)
    as_nhwc = (64, 56, 56, 96)
    view = (96 * 56 * 56, 56, 1, 56 * 56)  # x.permute(0, 2, 3, 1) of a contiguous NCHW tensor
    x_perm, x_rows = t(as_nhwc, F32, view), t(as_nhwc, F32)
    w, bb = t((96,), F32), t((96,), F32)
    outs = [t(as_nhwc, F32), t((64, 56, 56, 1), F32), t((64, 56, 56, 1), F32)]

    def ln(x):
        return feats("aten::native_layer_norm", [x, il((96,)), w, bb, d(1e-6)], outs)

    perm, rows, copy = ln(x_perm), ln(x_rows), _copy_of(x_perm, F32)
    assert torch.empty(nchw, device="meta").permute(0, 2, 3, 1).stride() == view
    assert copy["permuted"]
    assert (perm["kernels"], rows["kernels"]) == (2, 1)
    assert perm["analytic_time_s"] == pytest.approx(
        rows["analytic_time_s"] + copy["analytic_time_s"], rel=0.01)


def test_backward_softmax_and_layer_norm_copy_each_non_contiguous_operand():
    """host_softmax_backward makes grad and output contiguous; layer_norm_backward_cuda makes X
    contiguous and LayerNormBackwardKernelImpl dY. A strided but in-order operand (a slice of
    rows) is copied by the in-order kernel, not the gathering one."""
    shape = (64, 8, 128, 128)
    perm_strides = (8 * 128 * 128, 1, 128 * 8, 8)
    go_perm, y_perm = t(shape, F16, perm_strides), t(shape, F16, perm_strides)
    go, y = t(shape, F16), t(shape, F16)
    back = "aten::_softmax_backward_data"
    both = feats(back, [go_perm, y_perm, i(-1), i(F16)], [t(shape, F16)])
    one = feats(back, [go_perm, y, i(-1), i(F16)], [t(shape, F16)])
    none_ = feats(back, [go, y, i(-1), i(F16)], [t(shape, F16)])
    assert (both["kernels"], one["kernels"], none_["kernels"]) == (3, 2, 1)
    copy = _copy_of(go_perm, F16)["analytic_time_s"]
    assert one["analytic_time_s"] == pytest.approx(none_["analytic_time_s"] + copy, rel=0.01)
    assert both["analytic_time_s"] == pytest.approx(none_["analytic_time_s"] + 2 * copy, rel=0.01)

    rows, n = 8192, 1024
    sliced = (2 * n, 1)  # every other row of a (2 * rows, n) tensor: in order, not contiguous
    x, go_s = t((rows, n), F32, sliced), t((rows, n), F32, sliced)
    stats = [t((rows, 1), F32), t((rows, 1), F32)]
    w, bb = t((n,), F32), t((n,), F32)
    outs = [t((rows, n), F32), t((n,), F32), t((n,), F32)]

    def ln_back(g, xx):
        return feats("aten::native_layer_norm_backward",
                     [g, xx, il((n,)), *stats, w, bb, (INT_LIST, [True, True, True])], outs)

    strided, plain = ln_back(go_s, x), ln_back(t((rows, n), F32), t((rows, n), F32))
    copy = _copy_of(x, F32)
    assert not copy["permuted"]
    assert (strided["kernels"], plain["kernels"]) == (4, 2)
    assert strided["analytic_time_s"] == pytest.approx(
        plain["analytic_time_s"] + 2 * copy["analytic_time_s"], rel=0.01)


def _nhwc(sizes):
    n, c, h, w = sizes
    return (h * w * c, 1, w * c, c)


def _conv(x, w, out_shape, dtype=F16, out_strides=None):
    y = t(out_shape, dtype, out_strides)
    return feats("aten::convolution",
                 [x, w, none, il((1, 1)), il((1, 1)), il((1, 1)), b(False), il((0, 0)), i(1)], [y])


def test_convolution_copies_operands_not_dense_in_the_format_it_runs_in():
    """cuDNN's convolution makes input and weight .contiguous(memory_format), channels-last when
    either suggests it (cudnn_conv_suggest_memory_format): an NCHW activation meeting
    channels-last weights is copied to NHWC (a gathering copy) and the convolution runs
    channels-last; a channel slice of an NCHW tensor (CSP / Res2Net splits) is copied in order
    first. Each copy costs what the explicit copy unit costs."""
    xs, ws, ys = (32, 64, 56, 56), (64, 64, 3, 3), (32, 64, 56, 56)
    both_nchw = _conv(t(xs, F16), t(ws, F16), ys)
    both_nhwc = _conv(t(xs, F16, _nhwc(xs)), t(ws, F16, _nhwc(ws)), ys, out_strides=_nhwc(ys))
    assert both_nhwc["channels_last"] == 1 and both_nchw["channels_last"] == 0
    mixed_x = t(xs, F16)
    mixed = _conv(mixed_x, t(ws, F16, _nhwc(ws)), ys, out_strides=_nhwc(ys))
    assert mixed["channels_last"] == 1 and mixed["kernels"] == both_nhwc["kernels"] + 1
    dst = tensor(xs, F16, _nhwc(xs))
    to_nhwc = feats("aten::copy_", [(TENSOR, dst), mixed_x, b(False)], [(TENSOR, dst)])
    assert to_nhwc["permuted"]
    assert mixed["analytic_time_s"] == pytest.approx(
        both_nhwc["analytic_time_s"] + to_nhwc["analytic_time_s"], rel=0.01)

    sliced_x = t(xs, F16, (128 * 56 * 56, 56 * 56, 56, 1))  # x[:, :64] of a 128-channel tensor
    sliced = _conv(sliced_x, t(ws, F16), ys)
    copy = _copy_of(sliced_x, F16)
    assert not copy["permuted"] and sliced["kernels"] == both_nchw["kernels"] + 1
    assert sliced["analytic_time_s"] == pytest.approx(
        both_nchw["analytic_time_s"] + copy["analytic_time_s"], rel=0.01)


@pytest.mark.parametrize("x_layout, w_layout", [
    ("nchw", "nchw"), ("nhwc", "nhwc"), ("nchw", "nhwc"), ("nhwc", "nchw"),
    ("n111", "nchw"), ("n111", "nhwc"), ("nchw", "k111"), ("nchw", "k111_nhwc"),
])
def test_convolution_layout_choice_follows_torch_suggest_memory_format(x_layout, w_layout):
    """The convolution's format and its copies agree with torch's own suggest_memory_format on
    each operand (torch._prims_common), including the ambiguous 1x1 filters and N x C x 1 x 1
    activations, which stay NCHW unless channels-last strides say otherwise."""
    from torch._prims_common import suggest_memory_format

    def make(layout, c_in, c_out):
        if layout.startswith("n111"):
            shape = (16, c_in, 1, 1)
        elif layout.startswith("k111"):
            shape = (c_out, c_in, 1, 1)
        elif layout in ("nchw", "nhwc") and c_out is None:
            shape = (16, c_in, 28, 28)
        else:
            shape = (c_out, c_in, 3, 3)
        fmt = torch.channels_last if layout.endswith("nhwc") else torch.contiguous_format
        return torch.empty(shape, device="meta").contiguous(memory_format=fmt)

    x = make(x_layout, 32, None)
    w = make(w_layout, 32, 48)
    cl = torch.channels_last in (suggest_memory_format(x), suggest_memory_format(w))
    fmt = torch.channels_last if cl else torch.contiguous_format
    copies = sum(not a.is_contiguous(memory_format=fmt) for a in (x, w))
    kh = w.shape[2]
    out_hw = x.shape[2] - kh + 1 if kh == 1 else x.shape[2]
    pad = 0 if kh == 1 else 1
    y_shape = (x.shape[0], w.shape[0], out_hw, out_hw)
    y = torch.empty(y_shape, device="meta").contiguous(memory_format=fmt)

    def conv(xx, ww):
        return feats("aten::convolution",
                     [t(xx.shape, F32, xx.stride()), t(ww.shape, F32, ww.stride()), none,
                      il((1, 1)), il((pad, pad)), il((1, 1)), b(False), il((0, 0)), i(1)],
                     [t(y.shape, F32, y.stride())])

    dense = conv(x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt))
    assert conv(x, w)["kernels"] == dense["kernels"] + copies
