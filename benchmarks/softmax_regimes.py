"""Softmax by kernel regime: where the analytic softmax misses on held-out GPUs (a finding).

    .venv/bin/python benchmarks/softmax_regimes.py [--data DIR]

Data: NeuSight's softmax rows (shared/data/public/neusight-train; `torch.softmax(x, 1)` on
(B, H) FP32, H 515-4094; PyTorch 2.1, CUDA 12.1) on P4, P100, T4, V100-PCIe and
A100-PCIe-40GB, as kernel times (blink.train's event floors taken off, floor-dominated rows
dropped), against the analytic time of the shipped cost rules (the default GpuSpec; short
rows include kWarpSoftmaxSlowdown, fitted on these rows: their figures are in sample).

aten/src/ATen/native/cuda/SoftMax.cu runs rows of <= 1024 elements with the persistent warp
softmax (the row in registers: one input pass) and longer rows with the block kernels
(features.cpp f_softmax: two input passes). Per GPU and regime the table prints the rows'
median measured / analytic, the analytic MAPE, and a line fitted to time against bytes for the
measured and the analytic times: the streaming rate each implies (GB/s) and the measured
line's intercept (us). For block rows, "passes" is the input passes the measured rate implies
at the model's rate per pass. Nothing here is fitted into Blink.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from blink import hardware
from blink.train import data as td

PERSISTENT_MAX = 1024  # SoftMax.cu: the persistent warp softmax's longest row


def _rows(root: Path) -> list[td.UnitSample]:
    """Floor-free softmax rows (the element-wise rows come along: their floors set softmax's)."""
    rows = [r for r in td.load_neusight(root, 0, 0, None) if td._usable(r)
            and r.family in ("elem", "softmax")]
    kept = td.remove_neusight_floor(rows, td.neusight_floors(rows))
    return [r for r in kept if r.family == "softmax"]


def _line(bytes_: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(intercept s, slope s/byte) of t against bytes, least squares."""
    a = np.stack([np.ones_like(bytes_), bytes_], 1)
    (c0, c1), *_ = np.linalg.lstsq(a, t, rcond=None)
    return float(c0), float(c1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None,
                    help="shared/data/public (default: found from the checkout)")
    a = ap.parse_args(argv)
    root = td.public_root(a.data)
    rows = _rows(root)
    print("NeuSight softmax (FP32), kernel times, by GPU and SoftMax.cu regime")
    print(f"{'gpu':<16} {'regime':<11} {'n':>4} {'meas/ana':>9} {'MAPE':>6} | "
          f"{'meas GB/s':>9} {'ana GB/s':>8} {'ratio':>6} {'icpt us':>8} {'passes':>6}")
    print("-" * 96)
    for gpu in sorted({r.gpu for r in rows}):
        for regime, keep in (("persistent", lambda h: h <= PERSISTENT_MAX),
                             ("block", lambda h: h > PERSISTENT_MAX)):
            rs = [r for r in rows if r.gpu == gpu and keep(int(r.feats["inner"]))]
            if len(rs) < 10:
                continue
            meas = np.array([r.measured_s for r in rs])
            ana = np.array([float(r.feats["analytic_time_s"]) for r in rs])
            b = np.array([float(r.feats["bytes_read"]) + float(r.feats["bytes_written"])
                          for r in rs])
            c0, c1 = _line(b, meas)
            _, a1 = _line(b, ana)
            passes = float(np.median([float(r.feats["input_passes"]) for r in rs]))
            implied = passes * c1 / a1 if regime == "block" else float("nan")
            ratio = np.median(meas / ana)
            mape = 100 * np.mean(np.abs(ana / meas - 1))
            print(f"{gpu:<16} {regime:<11} {len(rs):>4} {ratio:>9.3f} {mape:>6.1f} | "
                  f"{1e-9 / c1:>9.0f} {1e-9 / a1:>8.0f} {a1 / c1:>6.2f} {c0 * 1e6:>8.1f} "
                  + (f"{implied:>6.2f}" if regime == "block" else f"{'':>6}"))
    print("ratio = measured rate / analytic rate (1: the model streams as fast as the kernel); "
          "passes: the input passes the measured rate implies (block rows)")
    print("DRAM rates per GPU: " + ", ".join(
        f"{hardware.get_gpu(g).name} {hardware.get_gpu(g).dram_efficiency:.2f}"
        for g in sorted({r.gpu for r in rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
