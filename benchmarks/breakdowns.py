"""The breakdown tables and memory-over-time plots for the issue-11 closing note.

    .venv/bin/python benchmarks/breakdowns.py [--out DIR]

Prints, for torchvision:resnet50 (training step, amp-bf16, batch 64) and hf:llama-7b
(inference, bf16, batch 1, seq 2048) on H100-SXM and A100-80GB: the prediction table, time by
phase and by module (depth 2), eager vs compiled time, and writes one SVG per case with the
predicted allocated / reserved memory over the step and the GPU's capacity. No plotting library
is needed (the SVG is written directly).
"""
from __future__ import annotations

import argparse
import os
import time

import blink
from blink.hardware import get_gpu

CASES = [
    ("torchvision:resnet50", {"batch_size": 64, "dtype": "amp-bf16", "mode": "train"}),
    ("hf:llama-7b", {"batch_size": 1, "seq_len": 2048, "dtype": "bf16"}),
]
GPUS = ("H100-SXM", "A100-80GB")


def memory_svg(p: blink.Prediction, path: str, width: int = 720, height: int = 300) -> None:
    pad = 50
    curve = p.memory_curve
    t_max = max(p.time_ms, 1e-9)
    cap = get_gpu(p.gpu).memory_bytes
    y_max = max(max(c["reserved_bytes"] for c in curve), 1) * 1.1
    y_max = max(y_max, min(cap * 1.05, y_max * 2))

    def xy(t: float, b: float) -> str:
        x = pad + (width - 2 * pad) * t / t_max
        y = height - pad - (height - 2 * pad) * b / y_max
        return f"{x:.1f},{y:.1f}"

    alloc = " ".join(xy(c["t_ms"], c["allocated_bytes"]) for c in curve)
    res = " ".join(xy(c["t_ms"], c["reserved_bytes"]) for c in curve)
    gib = 2**30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{pad}" y="20" font-size="13">{p.model} on {p.gpu} ({p.mode}, {p.dtype}, '
        f'batch {p.batch_size}): predicted memory over the step</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="{res}"/>',
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{alloc}"/>',
        f'<text x="{width - pad}" y="{height - pad + 30}" text-anchor="end">time (ms), step '
        f'{p.time_ms:.1f} ms</text>',
        f'<text x="{pad + 5}" y="{pad + 12}">{y_max / gib:.1f} GiB</text>',
        f'<text x="{width - pad - 170}" y="{pad + 12}" fill="#1f77b4">allocated (peak '
        f'{p.peak_allocated_bytes / gib:.2f} GiB)</text>',
        f'<text x="{width - pad - 170}" y="{pad + 26}" fill="#d62728">reserved (peak '
        f'{p.peak_reserved_bytes / gib:.2f} GiB)</text>',
    ]
    if cap <= y_max:
        y = height - pad - (height - 2 * pad) * cap / y_max
        parts.append(f'<line x1="{pad}" y1="{y:.1f}" x2="{width - pad}" y2="{y:.1f}" '
                     'stroke="gray" stroke-dasharray="4"/>')
        parts.append(f'<text x="{pad + 5}" y="{y - 4:.1f}" fill="gray">{p.gpu} capacity</text>')
    parts.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/breakdowns")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    summary = []
    for name, kw in CASES:
        for gpu in GPUS:
            t0 = time.perf_counter()
            p = blink.predict(name, gpu=gpu, **kw)
            c = blink.predict(name, gpu=gpu, compiled=True, **kw)
            took = time.perf_counter() - t0
            print(f"\n## {name} on {gpu} (predicted in {took:.1f} s, both modes)\n")
            print(p.table(max_rows=8))
            print()
            print(p.table(max_rows=8, by="module", depth=2).split("\n\n", 1)[1])
            svg = os.path.join(a.out, f"{name.replace(':', '_')}_{gpu}.svg")
            memory_svg(p, svg)
            print(f"\nmemory plot: {svg}")
            summary.append(f"| {name} | {gpu} | {p.time_ms:.2f} | {c.time_ms:.2f} | "
                           f"{c.time_ms / p.time_ms:.2f} | {p.peak_reserved_bytes / 2**30:.2f} | "
                           f"{100 * p.mfu:.1f}% |")
    print("\n| model | GPU | eager ms | compiled ms | compiled/eager | peak reserved GiB | MFU |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
