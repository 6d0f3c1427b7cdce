"""Blink's cuDNN RNN rule beside a compute roofline, on DeepBench's measured RNN layers.

    .venv/bin/python benchmarks/deepbench_rnn.py [--data DIR] [--csv preds.csv]

shared/data/public/deepbench/rnn.csv.gz (see its README): one cuDNN RNN layer (vanilla ReLU,
LSTM, GRU; single layer, unidirectional, input size = hidden) timed forward, backward data and
backward weights on 2016-2019 GPUs with cuDNN 5-7. Only the GPUs in blink's hardware table are
used (P100, V100, T4), at fp32 (CUDA cores on all three) and fp16 on tensor cores (V100, T4).

DeepBench sets CUDNN_SKIP_INPUT, so the input projection W.x (and its gradients) is not timed.
Blink's rule costs a whole _cudnn_rnn call; the input GEMMs it adds (one per layer, as a
standalone GEMM unit of the same shape would cost) are subtracted here:
  fwd          = _cudnn_rnn                                   - GEMM(T*N, gates*H, H)
  bwd_data     = _cudnn_rnn_backward(no weight grads)         - GEMM(T*N, H, gates*H)
  bwd_weights  = _cudnn_rnn_backward - the same without weights - GEMM(gates*H, H, T*N)
"roofline" is the recurrent FLOPs (g*H^2*N*T, the workbooks' own count) at the GPU's peak for
the math mode. No constant is fitted to these rows; this is a sanity check of an old software
stack (cuDNN 5-7), not an accuracy claim for current cuDNN.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import math
import os
from collections import defaultdict
from pathlib import Path

from blink import cost
from blink.hardware import get_gpu

GPUS = {"Tesla P100": "P100", "Tesla V100": "V100", "Tesla T4": "T4"}
PRECISION = {"fp32": 6, "fp16_tc": 5}
MODES = {"vanilla": 0, "lstm": 2, "gru": 3}
GATES = {0: 1, 2: 4, 3: 3}
_NONE = (0, None)


def _t(shape: tuple[int, ...], dtype: int) -> tuple[int, tuple]:
    return cost.tensor_arg(shape, dtype)


def _rnn_args(mode: int, hidden: int, batch: int, steps: int, dtype: int,
              backward: bool, weights: bool) -> tuple[list, list]:
    g = GATES[mode]
    w = [_t((g * hidden, hidden), dtype), _t((g * hidden, hidden), dtype),
         _t((g * hidden,), dtype), _t((g * hidden,), dtype)]
    wbuf = _t((sum(math.prod(a[1][0]) for a in w),), dtype)
    x = _t((steps, batch, hidden), dtype)
    h = _t((1, batch, hidden), dtype)
    c = h if mode == 2 else _NONE
    scalars = [(3, mode), (3, hidden), (3, 0), (3, 1), (5, False), (4, 0.0), (5, True),
               (5, False), (7, []), _NONE]
    reserve = _t((6 * steps * batch * hidden * 4,), 0)
    out = _t((steps, batch, hidden), dtype)
    if not backward:
        inputs = [x, (2, [a[1] for a in w]), (3, 4), wbuf, h, c, *scalars]
        return inputs, [out, h, c, reserve, wbuf]
    inputs = [x, (2, [a[1] for a in w]), (3, 4), wbuf, h, c, out, out, h, c, *scalars, reserve,
              (7, [1, 1, 1, 1 if weights else 0])]
    outputs = [x, h, c, (2, [a[1] for a in w]) if weights else (2, [])]
    return inputs, outputs


def _gemm_s(m: int, n: int, k: int, dtype: int, gpu: str) -> float:
    f = cost.unit_features("aten::mm", [_t((m, k), dtype), _t((k, n), dtype)],
                           [_t((m, n), dtype)], gpu, allow_tf32_cudnn=True)
    return f["analytic_time_s"]


def predict_row(row: dict[str, str]) -> tuple[float, float]:
    gpu = GPUS[row["gpu"]]
    dtype = PRECISION[row["precision"]]
    mode = MODES[row["rnn_type"]]
    h, n, t = int(row["hidden"]), int(row["batch"]), int(row["timesteps"])
    g = GATES[mode]

    def unit(backward: bool, weights: bool) -> float:
        op = "aten::_cudnn_rnn_backward" if backward else "aten::_cudnn_rnn"
        ins, outs = _rnn_args(mode, h, n, t, dtype, backward, weights)
        return cost.unit_features(op, ins, outs, gpu, allow_tf32_cudnn=True)["analytic_time_s"]

    d = row["direction"]
    if d == "fwd":
        pred = unit(False, True) - _gemm_s(t * n, g * h, h, dtype, gpu)
    elif d == "bwd_data":
        pred = unit(True, False) - _gemm_s(t * n, h, g * h, dtype, gpu)
    else:
        pred = unit(True, True) - unit(True, False) - _gemm_s(g * h, h, t * n, dtype, gpu)
    spec = get_gpu(gpu)
    peak = spec.peak_flops["fp32"] if dtype == 6 else spec.peak_flops["fp16"]
    roof = 2.0 * g * h * h * n * t / peak
    return pred, roof


def _median(v: list[float]) -> float:
    s = sorted(v)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def _per_step_overhead_logo(per_row: list[dict]) -> None:
    """Diagnostic, not used by blink: the extra time per timestep (on top of blink's step) that
    best fits these cuDNN 5-7 measurements, fitted on one GPU and scored on the held-out one
    (leave-one-GPU-out), for the directions with a per-step loop (fwd, bwd_data)."""
    loop = [r for r in per_row if r["direction"] in ("fwd", "bwd_data")]
    gpus = sorted({r["gpu"] for r in loop})
    grid = [i * 1e-6 for i in range(0, 121)]

    def med_ape(rows: list[dict], c: float) -> float:
        return _median([abs(float(r["blink_us"]) * 1e-6 + c * int(r["timesteps"])
                            - float(r["time_us"]) * 1e-6) / (float(r["time_us"]) * 1e-6)
                        for r in rows])

    print("\nper-step overhead fitted leave-one-GPU-out (fwd + bwd_data; diagnostic only):")
    for held in gpus:
        train = [r for r in loop if r["gpu"] != held]
        test = [r for r in loop if r["gpu"] == held]
        if not train or not test:
            continue
        c = min(grid, key=lambda x: med_ape(train, x))
        print(f"  fit on {', '.join(sorted({r['gpu'] for r in train}))}: {c * 1e6:.0f} us/step;"
              f" held-out {held}: medAPE {100 * med_ape(test, 0.0):.1f}% -> "
              f"{100 * med_ape(test, c):.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "data" / "public" / "deepbench"
    ap.add_argument("--data", default=os.environ.get("BLINK_DEEPBENCH", str(default)))
    ap.add_argument("--csv", help="write per-row predictions here")
    args = ap.parse_args()
    path = Path(args.data) / "rnn.csv.gz"
    with gzip.open(path, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r["gpu"] in GPUS and r["precision"] in PRECISION and r["time_us"]
                and r["rnn_type"] in MODES]
    groups: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    per_row = []
    for r in rows:
        meas = float(r["time_us"]) * 1e-6
        if meas <= 0:
            continue
        pred, roof = predict_row(r)
        ape_b, ape_r = abs(pred - meas) / meas, abs(roof - meas) / meas
        groups[(GPUS[r["gpu"]], r["precision"], r["direction"])].append((ape_b, ape_r))
        groups[("all", "", "")].append((ape_b, ape_r))
        per_row.append({**r, "blink_us": pred * 1e6, "roofline_us": roof * 1e6})
    print(f"{'gpu':<6} {'precision':<8} {'direction':<12} {'rows':>5} "
          f"{'blink medAPE':>13} {'roofline medAPE':>16} {'ratio':>6}")
    for key in sorted(groups):
        v = groups[key]
        b, r = _median([x[0] for x in v]) * 100, _median([x[1] for x in v]) * 100
        print(f"{key[0]:<6} {key[1]:<8} {key[2]:<12} {len(v):>5} {b:>12.1f}% {r:>15.1f}% "
              f"{b / r if r else float('nan'):>6.2f}")
    _per_step_overhead_logo(per_row)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(per_row[0]))
            w.writeheader()
            w.writerows(per_row)


if __name__ == "__main__":
    main()
