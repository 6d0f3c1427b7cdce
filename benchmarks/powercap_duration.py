"""Compute-bound SGEMM time against kernel length on the power-capped boards (a finding, no rule).

    .venv/bin/python benchmarks/powercap_duration.py [--data DIR]

Data: the public NeuSight FP32 GEMM rows (bmm + nn.Linear, shared/data/public/neusight-train) as
kernel times (blink.train.data.load_units takes the event-timing floor off), costed by Blink's
analytic model. Rows whose analytic compute time exceeds their memory time are compute-bound;
for those, the sustained-clock rule (blink/hardware.py) sets the time on the power-capped T4 and
P4.

1. Median measured / analytic per board, op family and analytic kernel length: on the T4 and P4
   short kernels run faster than the sustained clock allows and long ones slower; the boards that
   hold boost show no trend.
2. A duty-cycle rule fitted per board and family on its own rows (in sample): the clock is
   min(1, scale x sustained ratio / duty), duty = T / (T + gap), where T is the analytic time and
   gap an idle gap between NeuSight's repeats. The grid's best (scale, gap) and the MAPE before
   and after. The scales disagree between the boards and families, so no rule ships: fitted on
   one board it would move the other the wrong way.
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from blink.hardware import get_gpu
from blink.train.data import load_units, public_root, tables_by_kind
from blink.train.fit import metrics

EDGES_US = [0, 30, 100, 300, 1000, 3000, 10000, 30000, math.inf]
BOARDS = ["P4", "T4", "P100", "V100-PCIe", "A100-PCIe-40GB"]
SCALES = [0.7 + 0.02 * i for i in range(26)]
GAPS_S = [0.0, 1e-5, 3e-5, 1e-4, 2e-4, 3e-4, 5e-4, 1e-3, 2e-3]


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return metrics(pred, meas)["mape"]


def duty_cycle_time(ana: np.ndarray, bound: np.ndarray, ratio: float, scale: float,
                    gap: float) -> np.ndarray:
    """Compute-bound rows rescaled from the sustained ratio to the duty-cycle clock."""
    clock = np.minimum(1.0, scale * ratio * (ana + gap) / ana)
    return np.where(bound, ana * ratio / clock, ana)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="shared/data/public (default: found)")
    a = ap.parse_args(argv)
    t = tables_by_kind(load_units(public_root(a.data)))["gemm"]
    col = {n: t.X[:, j] for j, n in enumerate(t.features)}
    bound = col["compute_time_s"] > col["memory_time_s"]
    r = np.log(t.measured_s / t.analytic_s)
    us = t.analytic_s * 1e6
    heads = [f"{lo:g}-{hi:g}" if math.isfinite(hi) else f">{lo:g}"
             for lo, hi in zip(EDGES_US[:-1], EDGES_US[1:], strict=True)]
    print("1. compute-bound NeuSight SGEMMs: median measured / analytic (rows) by analytic "
          "kernel length (us)")
    print(f"{'board':15s} {'family':7s} {'fp32 ratio':>10s} | " +
          " ".join(f"{h:>12s}" for h in heads))
    for g in BOARDS:
        ratio = get_gpu(g).sustained_fp32_ratio
        for fam in ("bmm", "linear"):
            cells = []
            for lo, hi in zip(EDGES_US[:-1], EDGES_US[1:], strict=True):
                m = (t.gpu == g) & (t.family == fam) & bound & (us >= lo) & (us < hi)
                cells.append(f"{math.exp(float(np.median(r[m]))):5.2f} ({int(m.sum()):4d})"
                             if m.sum() >= 15 else f"{'-':>12s}")
            print(f"{g:15s} {fam:7s} {ratio:10.2f} | " + " ".join(f"{c:>12s}" for c in cells))
    print("\n2. duty-cycle rule fitted in sample per power-capped board and family "
          "(all rows; compute-bound ones rescaled)")
    print(f"{'board':6s} {'family':7s} {'n':>6s} {'analytic MAPE':>14s} {'fitted MAPE':>12s} "
          f"{'scale':>6s} {'gap us':>7s}")
    for g in ("T4", "P4"):
        ratio = get_gpu(g).sustained_fp32_ratio
        for fam in ("bmm", "linear"):
            m = (t.gpu == g) & (t.family == fam)
            ana, meas, b = t.analytic_s[m], t.measured_s[m], bound[m]
            best = min((_mape(duty_cycle_time(ana, b, ratio, s, gap), meas), s, gap)
                       for s in SCALES for gap in GAPS_S)
            print(f"{g:6s} {fam:7s} {int(m.sum()):6d} {_mape(ana, meas):14.1f} {best[0]:12.1f} "
                  f"{best[1]:6.2f} {best[2] * 1e6:7.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
