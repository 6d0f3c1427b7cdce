"""Blink's analytic kernel time beside the pure roofline, on the public DeepBench set.

    .venv/bin/python benchmarks/accuracy_deepbench.py [--family conv|gemm] [--csv preds.csv]
                                                      [--benchmark-off] [--data DIR]

Every training-mode GEMM and convolution row of DeepBench's NVIDIA workbooks on a GPU the
hardware table has (P100, V100, T4, GTX 1080 Ti, TITAN Xp, TITAN X Pascal; fp32, P100
"pseudo fp16", fp16 on tensor cores; see shared/data/public/deepbench/README.md) is mapped to
the ATen op PyTorch would run (blink/data_deepbench.py) and costed by the C++ engine as a lone
unit. "roofline" is roofline_time_s (direct FLOPs, or a quarter of them where Winograd
applies, at spec peaks); "blink" is analytic_time_s (the planned cuBLAS / cuDNN kernels: tiles,
split-K, Winograd, layout transposes). Rows are grouped per family, direction, GPU and
precision, with the algorithm Blink chose. Nothing here was fitted to these rows. DeepBench
forced IMPLICIT_PRECOMP_GEMM / ALGO_1 with tensor cores, so fp16_tc backward rows measure
kernels cuDNN's own choice would avoid.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter, defaultdict

from accuracy_public import _quantile

from blink import data_deepbench as db
from blink.cost import conv_algo_name


def _q(vals: list[float], q: float) -> float:
    return _quantile(sorted(vals), q)


def _stats(apes: list[float]) -> str:
    return (f"{100 * sum(apes) / len(apes):>8.1f}% {100 * _q(apes, .5):>5.1f}% "
            f"{100 * _q(apes, .9):>5.1f}%")


HEADER = (f"{'family':<6} {'dir':<10} {'gpu':<5} {'prec':<8} {'rows':>5} | {'roof MAPE':>9} "
          f"{'med':>6} {'p90':>6} | {'blink MAPE':>10} {'med':>6} {'p90':>6} {'pred/meas':>9} "
          f"| {'blink/roof':>10} | algorithms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="the deepbench folder (default: found)")
    ap.add_argument("--family", choices=db.FAMILIES, default=None)
    ap.add_argument("--benchmark-off", action="store_true",
                    help="cost with cudnn.benchmark off (cuDNN heuristics) instead of on")
    ap.add_argument("--csv", default=None, help="write per-row predictions to this CSV")
    a = ap.parse_args(argv)
    root = db.data_dir(a.data)
    if root is None:
        print("DeepBench data set not found; pass --data DIR", file=sys.stderr)
        return 2
    groups: dict[tuple, list] = defaultdict(list)
    rows_out = []
    for family in ([a.family] if a.family else db.FAMILIES):
        for row in db.load(root, family):
            f = db.predict(row, cudnn_benchmark=not a.benchmark_off)
            key = (family, row.direction, row.gpu, row.precision)
            groups[key].append((row, f))
            rows_out.append((row, f))
    print(f"DeepBench public set ({root}); {len(rows_out)} rows; cudnn.benchmark "
          f"{'off' if a.benchmark_off else 'on'}; APE = |pred - meas| / meas, in %")
    print()
    print(HEADER)
    print("-" * len(HEADER))
    every_roof, every_blink = [], []
    per_family: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for key in sorted(groups):
        g = groups[key]
        roof = [abs(f["roofline_time_s"] - r.time_s) / r.time_s for r, f in g]
        ours = [abs(f["analytic_time_s"] - r.time_s) / r.time_s for r, f in g]
        ratio = _q([f["analytic_time_s"] / r.time_s for r, f in g], .5)
        algos = Counter(conv_algo_name(f) for _, f in g if conv_algo_name(f) != "none")
        every_roof += roof
        every_blink += ours
        per_family[key[0]][0].extend(roof)
        per_family[key[0]][1].extend(ours)
        print(f"{key[0]:<6} {key[1]:<10} {key[2]:<5} {key[3]:<8} {len(g):>5} | {_stats(roof)} | "
              f" {_stats(ours)} {ratio:>9.3f} | {sum(ours) / max(sum(roof), 1e-12):>10.3f} | "
              + ", ".join(f"{k} {v}" for k, v in algos.most_common()))
    print("-" * len(HEADER))
    for fam, (roof, ours) in sorted(per_family.items()):
        print(f"{fam:<6} {'all':<10} {'all':<5} {'all':<8} {len(ours):>5} | {_stats(roof)} | "
              f" {_stats(ours)} {'':>9} | {sum(ours) / max(sum(roof), 1e-12):>10.3f} |")
    if every_blink:
        print(f"{'all':<6} {'all':<10} {'all':<5} {'all':<8} {len(every_blink):>5} | "
              f"{_stats(every_roof)} |  {_stats(every_blink)} {'':>9} | "
              f"{sum(every_blink) / max(sum(every_roof), 1e-12):>10.3f} |")
    if a.csv:
        with open(a.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["family", "direction", "gpu", "precision", "shape", "meas_us",
                        "roofline_us", "analytic_us", "algo", "math_mode", "tile", "split_k"])
            for r, f in rows_out:
                w.writerow([r.family, r.direction, r.gpu, r.precision,
                            ";".join(f"{k}={v}" for k, v in r.shape.items()),
                            f"{r.time_s * 1e6:.3f}", f"{f['roofline_time_s'] * 1e6:.3f}",
                            f"{f['analytic_time_s'] * 1e6:.3f}", conv_algo_name(f), f["math_mode"],
                            f"{f['tile_m']:.0f}x{f['tile_n']:.0f}", f"{f['split_k']:.0f}"])
        print(f"per-row predictions: {a.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
