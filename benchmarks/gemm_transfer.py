"""Does what one GPU's GEMMs teach transfer to another? A forest per GPU chip, scored on each
other chip, and the forest of the other four fitted on raw and on chip-centred targets.

    .venv/bin/python benchmarks/gemm_transfer.py [--rows-per-file N]      (~15 s on 2 cores)

Data: NeuSight's FP32 bmm + nn.Linear rows of the five GPUs it measured (P4, P100, T4,
V100-PCIe, A100-PCIe-40GB), as `blink train` builds them (kernel times, the C++ features of
this tree). For each chip, one forest (blink.train's parameters and rounds, its target centred
per chip as `blink train` fits it: blink.train.fit.centred_by_chip) learns log(measured /
analytic) from that chip's rows alone; every other chip's rows are then predicted as analytic x
exp(forest), unshrunk. The table prints each held-out chip's MAPE under the forest of every
other chip, beside the analytic time and beside one forest fitted on the other four chips'
rows, on the raw target (what blink train fitted until 2026-12-07) and centred per chip.

A chip's median log-ratio is that board's own offset (its clocks under NeuSight's timing, its
power cap); a forest on the raw target learns it through the GPU's spec features and hands it
to the next board. Centred, a forest carries only how the ratio moves with the shape.
Measured 2026-12-07 (benchmarks/results/gemm_transfer.txt): single-chip forests still do not
transfer (17 of the 20 pairs lose 0.2-24 points, two gain 0.7-1.1); unshrunk, the four-chip
forest is better centred on the P100 (21.2 -> 14.8%) and the P4 (27.3 -> 25.5%) and worse on the
A100 (11.5 -> 12.4%) and the T4 (20.0 -> 22.0%). What ships is shrunk and also learns
DeepBench's GEMMs (`blink evaluate`: 16.4% analytic, 16.1% trees).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from blink.train import data as td  # noqa: E402
from blink.train import fit  # noqa: E402


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


@contextlib.contextmanager
def _raw_targets() -> Iterator[None]:
    """fit.fit_forest on the raw log-ratio, as before the per-chip centring."""
    saved = fit.centred_by_chip
    fit.centred_by_chip = lambda t: np.asarray(t.y, dtype=np.float64)
    try:
        yield
    finally:
        fit.centred_by_chip = saved


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
    with _raw_targets():
        rest_raw = {c: fit.fit_forest(t.subset(t.chip != c)) for c in chips}
    w = max(len(c) for c in chips) + 2
    print("NeuSight FP32 GEMMs (bmm + nn.Linear): MAPE % of each held-out chip (rows) under a")
    print("forest fitted on one other chip (columns, centred), the analytic time, and the forest")
    print("fitted on all four other chips on the raw target and centred per chip (unshrunk)")
    print(f"{'held out':{w}s}{'n':>7s}" + "".join(f"{c:>{w}s}" for c in chips)
          + f"{'analytic':>10s}{'4 raw':>8s}{'4 centred':>11s}{'centred/raw':>13s}")
    print("-" * (w + 7 + w * len(chips) + 42))
    for h in chips:
        s = t.subset(t.chip == h)
        cells = "".join(
            f"{'-':>{w}s}" if c == h else
            f"{_mape(s.analytic_s * np.exp(own[c].raw_log_ratio(s.X)), s.measured_s):{w}.1f}"
            for c in chips)
        raw = _mape(s.analytic_s * np.exp(rest_raw[h].raw_log_ratio(s.X)), s.measured_s)
        cen = _mape(s.analytic_s * np.exp(rest[h].raw_log_ratio(s.X)), s.measured_s)
        print(f"{h:{w}s}{len(s):7d}{cells}{_mape(s.analytic_s, s.measured_s):10.1f}"
              f"{raw:8.1f}{cen:11.1f}{cen / raw:13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
