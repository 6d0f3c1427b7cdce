"""Blink's analytic kernel time beside the pure roofline, on the public NeuSight training set.

    .venv/bin/python benchmarks/accuracy_public.py [--gpu T4] [--max-rows-per-file N]
                                                   [--csv preds.csv] [--data DIR]

Every row of the set (bmm, linear, element-wise, layer norm and softmax on P4, P100, T4, V100
and A100, FP32 with TF32 off; see shared/data/public/neusight-train/README.md) is mapped to the
ATen op PyTorch ran (blink/data_public.py says how) and costed by the C++ engine
(blink.cost.unit_features) for that GPU. "roofline" is roofline_time_s (max of compute and
memory time at spec peaks); "blink analytic" is analytic_time_s (the roofline with launch
floor, DRAM efficiency and latency, GEMM waves, tiles and K ramp). APE = |pred - meas| / meas.

The measured latencies are CUDA events around one eager call: they include the host launch of
the op, so the smallest rows sit at ~30-90 us, far above a kernel's own few-us launch floor.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from blink import data_public as dp
from blink.hardware import get_gpu


@dataclass
class Result:
    row: dp.Row
    roofline_s: float
    analytic_s: float
    kernels_pred: int
    tiles: int
    flops: float
    bytes: float

    def ape(self, pred: float) -> float:
        return abs(pred - self.row.latency_s) / self.row.latency_s


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an ascending list."""
    if not sorted_vals:
        return math.nan
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _ape_stats(apes: list[float]) -> tuple[float, float, float]:
    """MAPE, median APE and p90 APE, in percent."""
    s = sorted(apes)
    return (100.0 * sum(s) / len(s), 100.0 * _quantile(s, 0.5), 100.0 * _quantile(s, 0.9))


def _resolve_device(name: str) -> str:
    """The CSV Device string for a GPU name or alias (e.g. T4, "Tesla T4", v100)."""
    if name in dp.DEVICES:
        return name
    want = get_gpu(name).name
    for dev, alias in dp.DEVICES.items():
        if get_gpu(alias).name == want:
            return dev
    raise SystemExit(f"--gpu {name!r} ({want}) is not in the data set; it has "
                     f"{', '.join(dp.DEVICES)}")


HEADER = (f"{'family':<8} {'gpu':<15} {'rows':>6} {'meas min':>9} {'meas med':>9} | "
          f"{'roof MAPE':>9} {'med':>6} {'p90':>6} | "
          f"{'blink MAPE':>10} {'med':>6} {'p90':>6} {'pred/meas':>9} | {'blink/roof':>10}")


def _line(family: str, gpu: str, results: list[Result]) -> str:
    meas = sorted(r.row.latency_s * 1e6 for r in results)
    rm, rmed, rp90 = _ape_stats([r.ape(r.roofline_s) for r in results])
    bm, bmed, bp90 = _ape_stats([r.ape(r.analytic_s) for r in results])
    ratio = sorted(r.analytic_s / r.row.latency_s for r in results)
    return (f"{family:<8} {gpu:<15} {len(results):>6} {meas[0]:>9.1f} {_quantile(meas, 0.5):>9.1f}"
            f" | {rm:>8.1f}% {rmed:>5.1f}% {rp90:>5.1f}% | {bm:>9.1f}% {bmed:>5.1f}% {bp90:>5.1f}%"
            f" {_quantile(ratio, 0.5):>9.3f} | {bm / rm if rm > 0 else math.nan:>10.3f}")


def _write_csv(path: str, results: list[Result]) -> None:
    cols = ["family", "op", "device", "gpu", "dims", "kernel", "n_kernels_meas", "n_kernels_pred",
            "tiles_pred", "grid_meas", "flops", "bytes", "meas_us", "roofline_us", "analytic_us",
            "ape_roofline", "ape_analytic"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in results:
            row = r.row
            w.writerow([row.family, row.op, row.device, row.gpu, "x".join(map(str, row.dims)),
                        row.kernel, len(row.kernels), r.kernels_pred, r.tiles,
                        "x".join(map(str, row.grid)),
                        f"{r.flops:.6g}", f"{r.bytes:.6g}", f"{row.latency_s * 1e6:.4f}",
                        f"{r.roofline_s * 1e6:.4f}", f"{r.analytic_s * 1e6:.4f}",
                        f"{r.ape(r.roofline_s):.5f}", f"{r.ape(r.analytic_s):.5f}"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="the neusight-train folder (default: found)")
    ap.add_argument("--gpu", default=None, help="only this GPU (CSV Device name or any alias)")
    ap.add_argument("--max-rows-per-file", type=int, default=None,
                    help="sample each CSV file (after the --gpu filter) down to N rows")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ap.add_argument("--csv", default=None, help="write per-row predictions to this CSV")
    ap.add_argument("--min-meas-us", type=float, default=0.0,
                    help="only rows measured at >= this many us (drops launch-bound rows)")
    a = ap.parse_args(argv)

    root = dp.data_dir(a.data)
    if root is None:
        print("NeuSight data set not found (looked for ../shared/data/public/neusight-train "
              "beside the repository and /work/shared/...); pass --data DIR", file=sys.stderr)
        return 2
    device = _resolve_device(a.gpu) if a.gpu else None

    t0 = time.perf_counter()
    rows: list[dp.Row] = []
    for family in dp.FAMILIES:
        rows.extend(r for r in dp.load_family(root, family, device, a.max_rows_per_file, a.seed)
                    if r.latency_s * 1e6 >= a.min_meas_us)
    t1 = time.perf_counter()
    results: list[Result] = []
    unmatched: dict[str, int] = {}
    for row in rows:
        f = dp.predict(row)
        if not f["matched"]:
            unmatched[row.op] = unmatched.get(row.op, 0) + 1
        results.append(Result(row, f["roofline_time_s"], f["analytic_time_s"],
                              int(f["kernels"]), int(f["tiles"]), f["flops"],
                              f["bytes_read"] + f["bytes_written"]))
    t2 = time.perf_counter()

    sample = (f"sampled: at most {a.max_rows_per_file} rows per file, random.Random({a.seed})"
              if a.max_rows_per_file is not None else "all rows")
    print(f"NeuSight public training set ({root}); {len(results)} rows, {sample}"
          + (f"; GPU {device}" if device else "")
          + (f"; only rows measured >= {a.min_meas_us:g} us" if a.min_meas_us > 0 else ""))
    print(f"predicted with blink.cost.unit_features (FP32, TF32 off); load {t1 - t0:.1f} s, "
          f"predict {t2 - t1:.1f} s")
    print("APE = |pred - meas| / meas; MAPE, median (med) and p90 APE in %; meas in us; "
          "pred/meas = median of blink analytic / measured; blink/roof = ratio of MAPEs")
    print()
    print(HEADER)
    print("-" * len(HEADER))
    devices = [device] if device else list(dp.DEVICES)
    short = {d: get_gpu(dp.DEVICES[d]).name for d in devices}
    for family in dp.FAMILIES:
        for d in devices:
            group = [r for r in results if r.row.family == family and r.row.device == d]
            if group:
                print(_line(family, short[d], group))
    print("-" * len(HEADER))
    for d in devices:
        group = [r for r in results if r.row.device == d]
        if group:
            print(_line("all", short[d], group))
    print("-" * len(HEADER))
    if results:
        print(_line("all", "all", results))
    print()
    print("coverage: n/a (no intervals before a trained model)")
    if unmatched:
        print(f"unmatched (generic fallback) ops: {unmatched}")
    if a.csv:
        _write_csv(a.csv, results)
        print(f"per-row predictions: {a.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
