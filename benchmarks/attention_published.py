"""Blink's fused-attention times against published kernel throughputs, roofline beside.

    .venv/bin/python benchmarks/attention_published.py        (~10 s)

Published: the FlashAttention-3 paper (Shah et al. 2024, figs. 5-6), H100 SXM5, FP16, 16k
tokens per batch, hidden 2048, TFLOP/s = 4·B·H·L²·d forward (2.5x backward, half causal), for
FlashAttention-2 (PyTorch's flash kernel, run with TORCH_CUDNN_SDPA_DEPRIORITIZED=1) and cuDNN
(what torch >= 2.11 runs first on sm_90). Blink: the analytic time of the attention unit alone
(blink.predict, predictor="analytic"), as TFLOP/s in the same convention. "fit" marks the
series whose long-sequence plateau or ramp set a constant in csrc/include/blink/roofline.h;
the others were not used. Roofline: the same FLOPs at the dense FP16 tensor-core peak. Then
the memory-efficient kernel on an A100 beside xformers' CUTLASS kernel (PR 587; FP16 and FP32,
both among the constants' sources) and FA2 on an A100 beside the FA2 paper's 73% bound.
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402
from test_attention_cost import _Attention, _tflops  # noqa: E402

import blink  # noqa: E402

SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# (kernel, direction, head dim, causal, used for the constants) -> TFLOP/s at SEQS
PUBLISHED = {
    ("cudnn", "fwd", 64, False, "fit"): (335, 373, 395, 408, 412, 413),
    ("cudnn", "fwd", 128, False, "fit"): (497, 574, 617, 609, 600, 595),
    ("cudnn", "fwd", 256, False, "fit"): (470, 546, 580, 581, 580, 581),
    ("cudnn", "fwd", 64, True, ""): (225, 288, 334, 363, 379, 388),
    ("cudnn", "fwd", 128, True, "fit"): (315, 410, 484, 518, 529, 539),
    ("cudnn", "fwd", 256, True, ""): (308, 391, 450, 483, 497, 509),
    ("cudnn", "bwd", 128, False, "fit"): (305, 408, 465, 499, 518, 516),
    ("flash", "fwd", 64, False, "fit"): (282, 306, 318, 321, 322, 324),
    ("flash", "fwd", 128, False, "fit"): (309, 350, 362, 368, 370, 370),
    ("flash", "fwd", 256, False, "fit"): (275, 313, 321, 323, 324, 326),
    ("flash", "fwd", 64, True, ""): (180, 229, 262, 284, 295, 299),
    ("flash", "fwd", 128, True, "fit"): (191, 260, 298, 319, 333, 335),
    ("flash", "fwd", 256, True, ""): (208, 251, 278, 293, 297, 298),
    ("flash", "bwd", 128, False, "fit"): (214, 260, 291, 310, 318, 322),
}
PEAK_H100_FP16 = 989.4
# xformers PR 587 (facebookresearch/xformers), A100, forward microseconds; the FP32 / FP16 ratio
# set kTf32x3EfficiencyGain and the FP16 rows are among kEfficientVsFlashFwd's sources
XFORMERS_A100 = {(torch.float16, 32): 1471.9, (torch.float16, 64): 1679.2,
                 (torch.float16, 128): 3090.0, (torch.float16, 256): 7031.8,
                 (torch.float32, 32): 4836.4, (torch.float32, 64): 5843.4,
                 (torch.float32, 128): 13157.7, (torch.float32, 256): 27170.5}


def _former_rule(seq: int, causal: bool, direction: str) -> float:
    """TFLOP/s of the rule before 2026-12-06 (flat 0.5 forward / 0.35 backward of peak, causal
    work (b + 1) / 2b of b x b blocks; wave quantisation left out)."""
    eff = (0.35 if direction == "bwd" else 0.5) * PEAK_H100_FP16
    blocks = seq / 128
    return eff * blocks / (blocks + 1) if causal else eff


def main() -> int:
    print("H100-SXM, TFLOP/s: published / Blink (Blink / published); roofline = "
          f"{PEAK_H100_FP16:.0f} for every row")
    head = f"{'kernel':6} {'dir':3} {'d':>3} {'causal':6} {'':3} | " + " | ".join(
        f"{s:>17}" for s in SEQS) + " | time MdAPE"
    print(head)
    print("-" * len(head))
    errs: dict[str, list[float]] = {"fit": [], "": []}
    roof_errs: list[float] = []
    old_errs: list[float] = []
    for (kernel, direction, d, causal, used), pub in PUBLISHED.items():
        if kernel == "flash":
            os.environ["TORCH_CUDNN_SDPA_DEPRIORITIZED"] = "1"
        else:
            os.environ.pop("TORCH_CUDNN_SDPA_DEPRIORITIZED", None)
        cells, row_errs = [], []
        for seq, p in zip(SEQS, pub, strict=True):
            got = _tflops("H100-SXM", d, seq, causal=causal, backward=direction == "bwd")
            row_errs.append(abs(p / got - 1))  # time APE
            roof_errs.append(abs(p / PEAK_H100_FP16 - 1))
            old_errs.append(abs(p / _former_rule(seq, causal, direction) - 1))
            cells.append(f"{p:4.0f}/{got:4.0f} ({got / p:4.2f})")
        errs[used].extend(row_errs)
        print(f"{kernel:6} {direction:3} {d:>3} {str(causal):6} {used:3} | " + " | ".join(
            f"{c:>17}" for c in cells) + f" | {100 * statistics.median(row_errs):5.1f}%")
    os.environ.pop("TORCH_CUDNN_SDPA_DEPRIORITIZED", None)
    print()
    print(f"time APE, Blink: median {100 * statistics.median(errs['fit']):.1f}% on the fitted "
          f"series, {100 * statistics.median(errs['']):.1f}% on the others; the former flat rule "
          f"{100 * statistics.median(old_errs):.1f}%; roofline (time at peak) "
          f"{100 * statistics.median(roof_errs):.1f}%")
    print()
    print("A100-80GB memory-efficient kernel, forward, B=64 M=1024 H=16 (xformers PR 587, its "
          "CUTLASS kernel; FP32 as 3xTF32): published us / Blink us (Blink / published)")
    for (dtype, d), us in XFORMERS_A100.items():
        q = torch.empty(64, 16, 1024, d, dtype=dtype, device="meta")
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):
            p = blink.predict(_Attention(False), (q, q.clone(), q.clone()), gpu="A100-80GB",
                              predictor="analytic")
        got = next(u.time_ms for u in p.units if u.kind == "attention") * 1e3
        print(f"  {str(dtype).removeprefix('torch.'):8} d {d:>3}: {us:7.0f} / {got:7.0f} "
              f"({got / us:4.2f})")
    a100 = [_tflops("A100-80GB", 128, s) for s in SEQS]
    print("A100-80GB FA2 forward, head dim 128 (FA2 paper: up to 73% of 312 TFLOP/s): "
          + ", ".join(f"{s}: {t:.0f} ({t / 312:.2f})" for s, t in zip(SEQS, a100, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
