"""blink.sdpa: the CUDA SDPA kernel choice for a target GPU, and calling the kernel on meta.

The choice is checked two ways: hand-written cases that follow the documented rules, and a
golden file (tests/data/sdpa_oracle_golden.json.gz) holding the answers of torch's own C++
``select_sdp_backend`` / ``can_use_*_attention`` from the cu130 wheels of torch 2.11, 2.12, 2.13
and 2.14.1, run on faked GPUs by scripts/sdpa_oracle/ (see make_golden.py there).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blink.errors import ConfigError, TraceError
from blink.sdpa import (
    SDPA_BACKENDS,
    call_fused_sdpa,
    choose_sdpa_backend,
    choose_sdpa_backend_for_tensors,
    explain_sdpa_choice,
    target_scaled_dot_product_attention,
    torch24_math_sdpa,
)

# The golden file's codes, from the scripts that write it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "sdpa_oracle"))
from golden_format import DTYPE_NAMES, SELECTED_CODES, USABLE_BITS  # noqa: E402
from test_autocast import OpLog  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "sdpa_oracle_golden.json.gz"
ALL_ON = {"flash": True, "efficient": True, "cudnn": True, "math": True}
DTYPES = {code: getattr(torch, name) for code, name in DTYPE_NAMES.items()}

H100 = (9, 0)  # also H200
B200 = (10, 0)
A100 = (8, 0)
RTX4090 = (8, 9)
RTX3090 = (8, 6)
RTX5090 = (12, 0)
T4 = (7, 5)
V100 = (7, 0)
P100 = (6, 0)


def choose(cc, dtype=torch.bfloat16, q=(2, 16, 1024, 64), k=None, v=None, **kw):
    """choose_sdpa_backend with defaults: no mask, no dropout, inference, all backends on."""
    args = {
        "compute_capability": cc,
        "dtype": dtype,
        "q_shape": q,
        "k_shape": k or q,
        "v_shape": v or k or q,
        "has_attn_mask": False,
        "attn_mask_dtype": None,
        "dropout_p": 0.0,
        "is_causal": False,
        "enable_gqa": False,
        "requires_grad": False,
        "enabled": ALL_ON,
        "deterministic": False,
        "fa3_enabled": False,
        "cuda_version": "13.0",
    }
    args.update(kw)
    return choose_sdpa_backend(**args)


@pytest.fixture(autouse=True)
def _no_cudnn_deprioritized(monkeypatch):
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)


# ------------------------------------------------------------------------------------------
# priority order


def test_backend_names():
    assert SDPA_BACKENDS == ("flash", "efficient", "cudnn", "math")


@pytest.mark.parametrize("version", ["2.11", "2.12", "2.13", "2.14"])
def test_h100_bf16_prefers_cudnn_with_the_wheel_cudnn(version):
    # Each cu130 wheel ships cuDNN > 9.15.0 (9.19, 9.20, 9.20, 9.24): cuDNN goes first on sm90.
    assert choose(H100, torch_version=version) == "cudnn"
    assert choose(H100, torch_version=version, is_causal=True) == "cudnn"


def test_h100_with_old_cudnn_or_deprioritized_uses_flash(monkeypatch):
    assert choose(H100, torch_version="2.11", cudnn_version=91500) == "flash"
    assert choose(H100, torch_version="2.11", cudnn_version=91501) == "cudnn"
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert choose(H100, torch_version="2.11") == "flash"


def test_cudnn_is_preferred_only_on_sm90_and_sm10x():
    assert choose(A100, torch_version="2.11") == "flash"
    assert choose(RTX4090, torch_version="2.14") == "flash"
    assert choose(RTX5090, torch_version="2.14") == "flash"
    assert choose(B200, torch_version="2.11") == "cudnn"
    assert choose((10, 3), torch_version="2.11") == "cudnn"
    # 2.11 and 2.12 need minor 0 or 3; 2.13+ CUDA 13 builds take any sm10x.
    assert choose((10, 1), torch_version="2.12") == "flash"
    assert choose((10, 1), torch_version="2.13") == "cudnn"
    assert choose((10, 1), torch_version="2.13", cuda_version="12.8") == "flash"


def test_cudnn_not_reached_by_default_order():
    # Default order flash, efficient, math, cudnn: on A100 an fp16 mask case goes to efficient.
    kw = {"has_attn_mask": True, "attn_mask_dtype": torch.bool, "attn_mask_shape": (1024, 1024)}
    assert choose(A100, **kw) == "efficient"
    assert choose(A100, enabled={"flash": False, "efficient": False}, **kw) == "math"
    kw["enabled"] = {"flash": False, "efficient": False, "math": False}
    assert choose(A100, **kw) == "cudnn"


def test_explicit_priority():
    assert choose(A100, priority=["cudnn", "flash"]) == "cudnn"
    with pytest.raises(ConfigError):
        choose(A100, priority=["nope"])


# ------------------------------------------------------------------------------------------
# dtypes, hardware, head dims


def test_fp32_goes_to_mem_efficient():
    for cc in (H100, A100, T4, V100, P100):
        assert choose(cc, dtype=torch.float32) == "efficient", cc
    assert choose(H100, dtype=torch.float64) == "math"


def test_older_gpus():
    assert choose(T4, dtype=torch.float16) == "efficient"
    assert choose(V100, dtype=torch.float16) == "efficient"
    assert choose(T4, dtype=torch.bfloat16) == "math"  # no bf16 below sm80
    # fp16 needs head dims divisible by 8 (tensor cores); fp32 below sm80 needs nothing.
    assert choose(T4, dtype=torch.float16, q=(2, 8, 128, 60)) == "math"
    assert choose(T4, dtype=torch.float32, q=(2, 8, 128, 60)) == "efficient"
    assert choose(P100, dtype=torch.float16, q=(2, 8, 128, 60)) == "efficient"
    assert choose((3, 7), dtype=torch.float16) == "math"  # K80: below sm50


def test_head_dim_limits():
    # flash <= 256; cuDNN 2.11-2.13 on sm90 <= 256; above that only mem-efficient.
    assert choose(H100, q=(2, 16, 1024, 512), torch_version="2.11") == "efficient"
    assert choose(A100, q=(2, 16, 1024, 256)) == "flash"
    assert choose(A100, q=(2, 16, 1024, 264)) == "efficient"
    assert choose(H100, q=(2, 16, 1024, 256), torch_version="2.11") == "cudnn"
    # 2.14: cuDNN 256 only with cuDNN > 9.22, else 128 (and the (192, 128) DeepSeek shape).
    assert choose(H100, q=(2, 16, 1024, 256), torch_version="2.14") == "cudnn"
    assert choose(H100, q=(2, 16, 1024, 256), torch_version="2.14", cudnn_version=92000) == "flash"
    qk, v = (2, 16, 1024, 192), (2, 16, 1024, 128)
    assert choose(H100, q=qk, v=v, torch_version="2.14", cudnn_version=92000) == "cudnn"
    assert choose(H100, q=qk, v=v, torch_version="2.11") == "cudnn"
    assert choose(B200, q=qk, v=v, torch_version="2.11") == "cudnn"
    assert choose(A100, q=qk, v=v) == "efficient"  # flash needs equal head dims
    # odd head dims: flash pads them, cuDNN needs multiples of 8
    assert choose(H100, q=(2, 16, 1024, 60), torch_version="2.11") == "flash"
    assert choose(A100, q=(2, 16, 1024, 1)) == "flash"


def test_training_head_dim_rules():
    # flash backward on sm86-sm89 / sm120: head_dim in (192, 224], or > 224 with dropout, fails.
    q = (2, 16, 1024, 256)
    assert choose(RTX3090, q=q, requires_grad=True) == "flash"
    assert choose(RTX3090, q=q, requires_grad=True, dropout_p=0.1) == "efficient"
    assert choose(RTX4090, q=(2, 16, 1024, 200), requires_grad=True) == "efficient"
    assert choose(RTX4090, q=(2, 16, 1024, 200), requires_grad=False) == "flash"
    assert choose(A100, q=(2, 16, 1024, 200), requires_grad=True) == "flash"
    # 2.14 cuDNN backward with d256 support: (<=128, <=128), (192, 128) or (256, 256) only.
    assert choose(H100, q=(2, 16, 1024, 256), requires_grad=True, torch_version="2.14") == "cudnn"
    assert choose(H100, q=(2, 16, 1024, 160), requires_grad=True, torch_version="2.14") == "flash"
    assert choose(H100, q=(2, 16, 1024, 160), requires_grad=False, torch_version="2.14") == "cudnn"
    assert choose(H100, q=(2, 16, 1024, 160), requires_grad=True, torch_version="2.13") == "cudnn"


# ------------------------------------------------------------------------------------------
# masks, dropout, causal, GQA


def test_masks():
    mask = {"has_attn_mask": True, "attn_mask_dtype": torch.bfloat16}
    # flash takes no mask: mem-efficient on A100; cuDNN (2-D or 4-D masks) on H100.
    assert choose(A100, **mask, attn_mask_shape=(2, 1, 1024, 1024)) == "efficient"
    assert choose(H100, **mask, attn_mask_shape=(2, 1, 1024, 1024), torch_version="2.11") == "cudnn"
    assert choose(H100, **mask, attn_mask_shape=(1024, 1024), torch_version="2.11") == "cudnn"
    # a 3-D mask, a mask with grad or an expanded mask (last stride 0) is not for cuDNN
    assert (
        choose(H100, **mask, attn_mask_shape=(2, 1024, 1024), torch_version="2.11") == "efficient"
    )
    assert (
        choose(
            H100,
            **mask,
            attn_mask_shape=(2, 1, 1024, 1024),
            attn_mask_requires_grad=True,
            torch_version="2.11",
        )
        == "efficient"
    )
    expanded = {"attn_mask_shape": (2, 1, 1024, 1024), "attn_mask_stride": (0, 0, 1, 0)}
    assert choose(H100, **mask, **expanded, torch_version="2.11") == "math"
    assert choose(A100, **mask, **expanded) == "math"
    # validate_sdpa_input: the mask is bool, float32 or the query dtype
    with pytest.raises(ConfigError):
        choose(A100, has_attn_mask=True, attn_mask_dtype=torch.float16)


def test_dropout():
    # 2.12+: cuDNN dropout must be a multiple of 1/16; 2.11 has no such rule.
    assert choose(H100, dropout_p=0.1, torch_version="2.11") == "cudnn"
    assert choose(H100, dropout_p=0.1, torch_version="2.12") == "flash"
    assert choose(H100, dropout_p=0.125, torch_version="2.14") == "cudnn"
    assert choose(A100, dropout_p=0.1) == "flash"
    # cuDNN 9.11-9.13 has no dropout at all
    assert choose(H100, dropout_p=0.125, torch_version="2.14", cudnn_version=91600) == "cudnn"
    assert choose(H100, dropout_p=0.125, torch_version="2.11", cudnn_version=91200) == "flash"


def test_causal_with_non_square_sequences():
    q, k = (2, 16, 128, 64), (2, 16, 1024, 64)
    assert choose(A100, q=q, k=k, is_causal=True) == "efficient"
    assert choose(A100, q=q, k=k, is_causal=False) == "flash"
    assert choose(H100, q=q, k=k, is_causal=True, torch_version="2.11") == "cudnn"


def test_grouped_query_attention():
    q, kv = (2, 32, 1024, 128), (2, 8, 1024, 128)
    assert choose(A100, q=q, k=kv, enable_gqa=True) == "flash"
    assert choose(A100, q=q, k=kv, enable_gqa=False) == "math"
    assert choose(H100, q=q, k=kv, enable_gqa=True, torch_version="2.11") == "cudnn"
    # fp32 GQA: mem-efficient supports it only from 2.14
    assert choose(A100, dtype=torch.float32, q=q, k=kv, enable_gqa=True, torch_version="2.13") == (
        "math"
    )
    assert choose(A100, dtype=torch.float32, q=q, k=kv, enable_gqa=True, torch_version="2.14") == (
        "efficient"
    )
    # MQA (key/value with one head) without enable_gqa: fused from 2.14 on
    mqa = (2, 1, 1024, 128)
    assert choose(A100, q=q, k=mqa, torch_version="2.13") == "math"
    assert choose(A100, q=q, k=mqa, torch_version="2.14") == "flash"
    # batch sizes must match
    assert choose(A100, q=q, k=(1, 32, 1024, 128)) == "math"


def test_decode_on_blackwell_2_14():
    q, kv = (4, 32, 1, 128), (4, 8, 4096, 128)
    kw = {"q": q, "k": kv, "enable_gqa": True, "torch_version": "2.14"}
    assert choose(B200, cudnn_version=92000, **kw) == "flash"
    assert choose(B200, cudnn_version=92401, **kw) == "cudnn"
    assert choose(B200, cudnn_version=92600, **kw) == "cudnn"
    assert choose(H100, cudnn_version=92000, **kw) == "cudnn"
    assert choose(B200, cudnn_version=92000, **{**kw, "torch_version": "2.13"}) == "cudnn"


def test_batch_and_heads_limit_for_cudnn():
    big = (70000, 8, 128, 64)
    assert choose(H100, q=big, torch_version="2.12") == "cudnn"
    assert choose(H100, q=big, torch_version="2.13") == "flash"


# ------------------------------------------------------------------------------------------
# strides, offsets, flags


def test_strides_and_offsets():
    q = (2, 16, 1024, 64)
    blhe = (1024 * 16 * 64, 64, 16 * 64, 1)  # the usual transposed projection output
    assert choose(A100, q=q, q_stride=blhe, k_stride=blhe, v_stride=blhe) == "flash"
    bad = (2 * 1024 * 16 * 64, 2 * 1024 * 64, 2 * 64, 2)
    assert choose(A100, q=q, q_stride=bad) == "math"
    assert choose(A100, q=(2, 16, 1024, 1), q_stride=(16384, 1024, 1, 7)) == "flash"
    # mem-efficient on sm80+ wants 16-byte aligned storage offsets from 2.13
    f32 = {"dtype": torch.float32, "q": q, "storage_offsets": (2, 0, 0)}
    assert choose(A100, torch_version="2.12", **f32) == "efficient"
    assert choose(A100, torch_version="2.13", **f32) == "math"
    assert choose(V100, torch_version="2.13", **f32) == "efficient"


def test_enable_flags_and_determinism():
    assert choose(A100, enabled={"flash": False}) == "efficient"
    assert choose(A100, enabled={"flash": False, "efficient": False}) == "math"
    assert choose(H100, torch_version="2.11", enabled={"cudnn": False}) == "flash"
    assert choose(H100, torch_version="2.11", deterministic=True) == "flash"
    with pytest.raises(TraceError, match="No available SDPA kernel"):
        choose(A100, dtype=torch.float64, enabled={"math": False})
    with pytest.raises(ConfigError):
        choose(A100, enabled={"fast": True})


def test_enable_flags_default_to_torch(monkeypatch):
    base = {k: v for k, v in ALL_ON.items()}
    monkeypatch.setattr("torch.backends.cuda.flash_sdp_enabled", lambda: False)
    monkeypatch.setattr("torch.backends.cuda.mem_efficient_sdp_enabled", lambda: base["efficient"])
    assert choose(A100, enabled=None) == "efficient"


def test_explain_gives_reasons():
    choice = explain_sdpa_choice(
        compute_capability=A100,
        dtype=torch.float32,
        q_shape=(2, 8, 128, 64),
        k_shape=(2, 8, 128, 64),
        v_shape=(2, 8, 128, 64),
        has_attn_mask=False,
        attn_mask_dtype=None,
        dropout_p=0.0,
        is_causal=False,
        enable_gqa=False,
        requires_grad=False,
        enabled=ALL_ON,
        deterministic=False,
    )
    assert choice.backend == "efficient"
    assert choice.order == ("flash", "efficient", "math", "cudnn")
    assert "float32" in choice.reasons["flash"]
    assert choice.reasons["efficient"] is None


# ------------------------------------------------------------------------------------------
# the golden file: torch's own select_sdp_backend, per torch version


def _golden():
    if not GOLDEN.exists():
        pytest.skip(f"{GOLDEN} is missing (make it with scripts/sdpa_oracle/make_golden.py)")
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


def _case_kwargs(case, config):
    major, minor = (int(x) for x in config["sm"].split("."))
    mask = case.get("mask")
    return {
        "compute_capability": (major, minor),
        "dtype": DTYPES[case["dtype"]],
        "q_shape": case["q"],
        "k_shape": case["k"],
        "v_shape": case["v"],
        "has_attn_mask": mask is not None,
        "attn_mask_dtype": DTYPES[case.get("mask_dtype", case["dtype"])] if mask else None,
        "dropout_p": case.get("dropout", 0.0),
        "is_causal": case.get("is_causal", False),
        "enable_gqa": case.get("enable_gqa", False),
        "requires_grad": case.get("requires_grad", False),
        "q_stride": case.get("q_stride"),
        "k_stride": case.get("k_stride"),
        "v_stride": case.get("v_stride"),
        "enabled": {**ALL_ON, **(case.get("enabled") or {})},
        "attn_mask_shape": mask,
        "attn_mask_stride": case.get("mask_stride"),
        "attn_mask_requires_grad": case.get("mask_requires_grad", False),
        "storage_offsets": (case.get("q_offset", 0), case.get("k_offset", 0), 0),
        "torch_version": config["torch"],
        "cudnn_version": config["cudnn"],
        "cuda_version": "13.0",
        "deterministic": bool(case.get("deterministic")) and not case.get("warn_only", False),
        "fa3_enabled": False,
    }


@pytest.mark.parametrize("version", ["2.11", "2.12", "2.13", "2.14"])
def test_matches_torch_select_sdp_backend(version):
    golden = _golden()
    codes = {code: name for name, code in SELECTED_CODES.items()}
    configs = [c for c in golden["configs"] if c["torch"] == version]
    assert configs, f"no golden data for torch {version}"
    mismatches = []
    for config in configs:
        for i, case in enumerate(golden["cases"]):
            try:
                choice = explain_sdpa_choice(**_case_kwargs(case, config))
                got, usable = choice.backend, choice.reasons
            except TraceError:
                got, usable = "error", None
            want = codes[config["selected"][i]]
            bits = int(config["usable"][i], 16)
            ok = got == want
            if usable is not None:
                ok = ok and all(
                    (usable[name] is None) == bool(bits & bit) for name, bit in USABLE_BITS.items()
                )
            if not ok:
                mismatches.append((config["sm"], config["cudnn"], case, got, want, bits))
    assert not mismatches, f"{len(mismatches)} mismatches, e.g. {mismatches[:3]}"


# ------------------------------------------------------------------------------------------
# tensors in, and calling the kernels on meta


def _meta(shape, dtype, requires_grad=False, blhe=False):
    if blhe:
        b, h, s, e = shape
        t = torch.empty(b, s, h, e, device="meta", dtype=dtype).transpose(1, 2)
        return t.requires_grad_(requires_grad)
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=requires_grad)


def test_choose_for_tensors():
    q = _meta((2, 8, 128, 64), torch.bfloat16, blhe=True)
    kw = {"compute_capability": A100, "enabled": ALL_ON}
    assert choose_sdpa_backend_for_tensors(q, q, q, **kw) == "flash"
    mask = torch.empty(128, 128, device="meta", dtype=torch.bool)
    assert choose_sdpa_backend_for_tensors(q, q, q, mask, **kw) == "efficient"
    # 3-D (unbatched) inputs run fused from 2.14 on
    q3 = _meta((8, 128, 64), torch.bfloat16)
    assert choose_sdpa_backend_for_tensors(q3, q3, q3, torch_version="2.14", **kw) == "flash"
    assert choose_sdpa_backend_for_tensors(q3, q3, q3, torch_version="2.13", **kw) == "math"
    # a misaligned view (storage offset 1 element) blocks mem-efficient from 2.13
    base = torch.empty(2 * 8 * 128 * 64 + 1, device="meta", dtype=torch.float32)
    odd = base[1:].view(2, 8, 128, 64)
    assert choose_sdpa_backend_for_tensors(odd, odd, odd, torch_version="2.13", **kw) == "math"
    assert choose_sdpa_backend_for_tensors(odd, odd, odd, torch_version="2.12", **kw) == (
        "efficient"
    )
    # requires_grad is read from the tensors and grad mode
    g = _meta((2, 8, 128, 256), torch.bfloat16, requires_grad=True)
    kw86 = {"compute_capability": RTX3090, "enabled": ALL_ON}
    assert choose_sdpa_backend_for_tensors(g, g, g, dropout_p=0.1, **kw86) == "efficient"
    with torch.no_grad():
        assert choose_sdpa_backend_for_tensors(g, g, g, dropout_p=0.1, **kw86) == "flash"


HALF = (torch.float16, torch.bfloat16)
# the dtypes each backend's aten op takes
BACKEND_DTYPES = {
    "flash": HALF,
    "efficient": (*HALF, torch.float32),
    "cudnn": HALF,
    "math": (*HALF, torch.float32),
}


@pytest.mark.parametrize("backend,dtype", [(b, d) for b, ds in BACKEND_DTYPES.items() for d in ds])
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("blhe", [False, True])
def test_call_fused_sdpa_on_meta(backend, dtype, requires_grad, blhe):
    q = _meta((2, 8, 16, 64), dtype, requires_grad, blhe)
    k = _meta((2, 8, 24, 64), dtype, requires_grad, blhe)
    v = _meta((2, 8, 24, 64), dtype, requires_grad, blhe)
    out = call_fused_sdpa(backend, q, k, v, None, 0.0, False, None, False)
    assert out.shape == (2, 8, 16, 64)
    assert out.dtype == dtype and out.device.type == "meta"
    if backend == "efficient":
        # the CUDA kernel writes a (B, L, H, E) buffer and returns it transposed
        assert out.stride() == (16 * 8 * 64, 64, 8 * 64, 1)
    elif backend in ("flash", "cudnn"):
        assert out.stride() == q.stride()  # same layout as the query
    if requires_grad:
        out.sum().backward()
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape


@pytest.mark.parametrize("backend", ["efficient", "cudnn", "math"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.bfloat16])
def test_call_fused_sdpa_with_mask(backend, mask_dtype):
    q = _meta((2, 8, 16, 64), torch.bfloat16, True)
    k = _meta((2, 8, 20, 64), torch.bfloat16, True)
    mask = torch.empty(2, 1, 16, 20, device="meta", dtype=mask_dtype)
    out = call_fused_sdpa(backend, q, k, k, mask, 0.0, False, 0.125, False)
    assert out.shape == (2, 8, 16, 64)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_call_flash_pads_odd_head_dims():
    q = _meta((2, 8, 16, 60), torch.float16, True)
    out = call_fused_sdpa("flash", q, q, q, None, 0.1, True, None, False)
    assert out.shape == (2, 8, 16, 60)
    assert out.stride() == (8 * 16 * 64, 16 * 64, 64, 1)  # a slice of the padded output
    out.sum().backward()
    assert q.grad.shape == q.shape
    with pytest.raises(ConfigError):
        call_fused_sdpa("flash", q, q, q, torch.empty(16, 16, device="meta"))
    with pytest.raises(ConfigError):
        call_fused_sdpa("fast", q, q, q)


def _torch_before(major: int, minor: int) -> bool:
    got = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return got < (major, minor)


@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn", "math"])
def test_call_fused_sdpa_gqa(backend):
    # flash/cuDNN/mem-efficient take key/value with fewer heads as they are; math repeats them.
    if backend == "efficient" and _torch_before(2, 14):
        pytest.skip("mem-efficient attention takes GQA only from torch 2.14")
    q = _meta((2, 8, 16, 64), torch.float16, True)
    kv = _meta((2, 2, 16, 64), torch.float16, True)
    out = call_fused_sdpa(backend, q, kv, kv, None, 0.0, True, None, True)
    assert out.shape == (2, 8, 16, 64)
    out.sum().backward()
    assert kv.grad.shape == kv.shape


def test_target_sdpa_empty_and_unbatched():
    kw = {"compute_capability": H100, "enabled": ALL_ON}
    q = _meta((2, 8, 16, 64), torch.bfloat16, True)
    empty = _meta((2, 8, 0, 64), torch.bfloat16, True)
    out = target_scaled_dot_product_attention(q, empty, empty, torch_version="2.14", **kw)
    assert out.shape == (2, 8, 16, 64)
    out.sum().backward()
    q3 = _meta((8, 16, 64), torch.bfloat16)
    assert target_scaled_dot_product_attention(q3, q3, q3, **kw).shape == (8, 16, 64)
    with pytest.raises(ConfigError):
        target_scaled_dot_product_attention(q, q.float(), q, **kw)


def test_override_scaled_dot_product_attention():
    # What Blink's tracer does: replace aten::scaled_dot_product_attention while tracing.
    seen = []

    target = {"compute_capability": H100, "torch_version": "2.11", "enabled": ALL_ON}

    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        args = (q, k, v, attn_mask, dropout_p, is_causal)
        if q.device.type != "meta":
            math_sdpa = torch.ops.aten._scaled_dot_product_attention_math
            return math_sdpa(*args, None, scale=scale, enable_gqa=enable_gqa)[0]
        backend = choose_sdpa_backend_for_tensors(*args, enable_gqa, **target, deterministic=False)
        seen.append(backend)
        return call_fused_sdpa(backend, *args, scale, enable_gqa)

    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("scaled_dot_product_attention", fn, "CompositeImplicitAutograd")
        q = _meta((2, 8, 128, 64), torch.bfloat16, True, blhe=True)
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        out.sum().backward()
        assert out.shape == q.shape and q.grad.shape == q.shape
        x = torch.randn(1, 2, 4, 8)
        assert F.scaled_dot_product_attention(x, x, x).shape == x.shape
    finally:
        lib._destroy()
    assert seen == ["cudnn"]


# ------------------------------------------------------------------------------------------
# the math backend as torch 2.4 ran it (replaying timm's 2024 measurements)


@pytest.mark.parametrize("case", ["plain", "mask", "causal", "negative scale"])
def test_torch24_math_matches_torch(case):
    """The 2.4 composite computes what torch's own math SDPA computes (float32 on the CPU)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 7, 16, generator=g) for _ in range(3))  # 5-D, as NesT
    mask = torch.randn(7, 7, generator=g) if case == "mask" else None
    causal = case == "causal"
    scale = -0.3 if case == "negative scale" else None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    with torch24_math_sdpa():
        got = call_fused_sdpa("math", q, k, v, mask, 0.0, causal, scale, False)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_torch24_math_program_on_meta():
    """Inside the context, fp16 math SDPA runs in fp16 with a plain softmax (2.4); outside, the
    installed torch's path (2.5+: float32 upcast and _safe_softmax's extra passes)."""
    q = torch.empty(8, 4, 16, 49, 32, dtype=torch.float16, device="meta")
    with OpLog() as old, torch24_math_sdpa():
        out = call_fused_sdpa("math", q, q, q, None, 0.0, False, None, False)
    assert out.dtype == torch.float16
    assert [dt for name, _, dt in old.ops if name == "aten._softmax"] == [torch.float16]
    assert not {"aten._to_copy", "aten.eq", "aten.all", "aten.where"} & set(old.names())
    assert old.names().count("aten.bmm") == 2
    with OpLog() as new:
        call_fused_sdpa("math", q, q, q, None, 0.0, False, None, False)
    upcast = new.casts() > 0
    safe = {"aten.eq", "aten.all", "aten.where"} <= set(new.names())
    assert upcast or safe, new.ops
    # the flag is scoped: nested contexts restore it
    with torch24_math_sdpa(), torch24_math_sdpa(False), OpLog() as inner:
        call_fused_sdpa("math", q, q, q, None, 0.0, False, None, False)
    assert inner.names() == new.names()


def test_torch24_math_rejects_gqa():
    q = torch.empty(1, 4, 8, 16, device="meta")
    kv = torch.empty(1, 2, 8, 16, device="meta")
    with torch24_math_sdpa(), pytest.raises(ConfigError, match="enable_gqa"):
        call_fused_sdpa("math", q, kv, kv, None, 0.0, False, None, True)


def test_timm_cache_traces_the_inference_rows_as_torch_2_4():
    """timm's 2024 inference rows (torch 2.4) are traced with 2.4's math SDPA: NesT's 5-D
    attention softmaxes in fp16 with no _safe_softmax passes; a plain trace of the same model
    (what blink.predict runs for a user of today's torch) keeps the installed torch's path."""
    pytest.importorskip("timm")
    from blink.dryrun import trace_model
    from blink.train import timm_cache

    t, _ = timm_cache.build_model("nest_tiny", 2, 224, mode="inference")
    softmax = [op for op in t.ops if op.name == "aten::_softmax"]
    assert softmax and all(op.inputs[0].dtype == "float16" for op in softmax)
    assert not any(op.name in ("aten::eq", "aten::where") for op in t.ops)

    import timm

    with torch.device("meta"):
        model = timm.create_model("nest_tiny")
    plain = trace_model(model, input_shape=(2, 3, 224, 224), batch_size=2, gpu="RTX 3090",
                        dtype="amp-fp16")
    names = {op.name for op in plain.ops}
    upcast = any(op.name == "aten::_softmax" and op.inputs[0].dtype == "float32"
                 for op in plain.ops)
    assert upcast or {"aten::eq", "aten::where"} <= names
