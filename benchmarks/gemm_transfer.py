"""Does what one GPU's GEMMs teach transfer to another? A forest per GPU chip, scored on each
other chip.

    .venv/bin/python benchmarks/gemm_transfer.py [--rows-per-file N]      (~3 minutes)

Data: NeuSight's FP32 bmm + nn.Linear rows of the five GPUs it measured (P4, P100, T4,
V100-PCIe, A100-PCIe-40GB), as `blink train` builds them (kernel times, the C++ features of
this tree). For each chip, one forest (blink.train's parameters and rounds) learns
log(measured / analytic) from that chip's rows alone; every other chip's rows are then
predicted as analytic x exp(forest). The table prints each held-out chip's MAPE under the
forest of every other chip, beside the analytic time and beside one forest fitted on the other
four chips' rows (like `blink evaluate`'s unshrunk leave-one-GPU-out forest, "trees x1", which
also learns DeepBench's GEMMs).

A residual that is a property of the kernels (a tile shape cuBLAS favours, a wave
quantisation the model misses) would transfer between chips, most of all between chips of one
architecture (P4 and P100 are both Pascal). What the table shows instead is why the GEMM forest
does not ship and why per-op GEMM accuracy on unseen GPUs stays at the analytic model's: of
the twenty pairs, two gain 0.2-0.3 points (the T4 under the A100's or the V100's forest) and
eighteen lose 0.4-43 points, the P100's forest on its fellow Pascal P4 included (+9); the
four-chip forest helps only the P100 (benchmarks/results/gemm_transfer.txt).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from blink.train import data as td  # noqa: E402
from blink.train import fit  # noqa: E402


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-per-file", type=int, default=6000,
                    help="NeuSight rows per file, as `blink train` (default 6000)")
    a = ap.parse_args(argv)
    fit.set_threads(2)
    rows = td.load_units(td.public_root(), neusight_rows_per_file=a.rows_per_file)
    t = td.tables_by_kind([r for r in rows if r.dataset == "neusight-train"
                           and r.family in ("bmm", "linear")])["gemm"]
    chips = sorted(set(t.chip))
    own = {c: fit.fit_forest(t.subset(t.chip == c)) for c in chips}
    rest = {c: fit.fit_forest(t.subset(t.chip != c)) for c in chips}
    w = max(len(c) for c in chips) + 2
    print("NeuSight FP32 GEMMs (bmm + nn.Linear): MAPE % of each held-out chip (rows) under a")
    print("forest fitted on one other chip (columns), the analytic time, and the forest fitted")
    print("on all four other chips")
    print(f"{'held out':{w}s}{'n':>7s}" + "".join(f"{c:>{w}s}" for c in chips)
          + f"{'analytic':>10s}{'other 4':>9s}")
    print("-" * (w + 7 + w * len(chips) + 19))
    for h in chips:
        s = t.subset(t.chip == h)
        cells = "".join(
            f"{'-':>{w}s}" if c == h else
            f"{_mape(s.analytic_s * np.exp(own[c].raw_log_ratio(s.X)), s.measured_s):{w}.1f}"
            for c in chips)
        print(f"{h:{w}s}{len(s):7d}{cells}{_mape(s.analytic_s, s.measured_s):10.1f}"
              f"{_mape(s.analytic_s * np.exp(rest[h].raw_log_ratio(s.X)), s.measured_s):9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
