"""The sustained-throughput power rule (blink/hardware.py), fitted and reported leave-one-GPU-out.

    .venv/bin/python benchmarks/sustained_logo.py [--max-rows-per-file N] [--data DIR]

Data: the public NeuSight FP32 GEMM rows (bmm + linear, TF32 off) on P4, P100, T4, V100-PCIe and
A100-PCIe-40GB (shared/data/public/neusight-train; blink/data_public.py maps them to ATen ops).

1. Observed ratio per GPU: among the rows of at least MIN_FLOP FLOPs (compute-bound at every
   size the set holds), the 95th percentile of measured FLOP/s / datasheet FP32 peak, divided by
   the SIMT GEMM efficiency Blink's analytic model already applies (kSimtGemmEfficiency, 0.85,
   csrc/include/blink/roofline.h), clipped to 1: what the board's clock sustains.
2. For each GPU held out: SUSTAINED_W_PER_TFLOP_16NM is fitted on the other four (grid search of
   the squared log error of the clamped rule; where the error is flat over an interval, its
   centre), and the held-out GPU's ratio is predicted from its own table entry (board power,
   FP32 peak, clocks, process) with that constant.
3. BOOST_WINDOW_S (how long an isolated kernel holds boost before the ratio applies) is then
   fitted on the same four GPUs: the grid value with the lowest median APE of the analytic
   time over their bmm + linear rows (only the power-limited ones move).
4. The held-out GPU's GEMM rows are costed by the C++ engine with ratio 1 (before) and with the
   fold's ratio and window (after): MAPE and median APE of blink's analytic time, per family.

The constants shipped in blink/hardware.py are the fit on all five GPUs (printed last).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from blink import data_public as dp
from blink import hardware
from blink.cost import _C, core_gpu_spec

MIN_FLOP = 2e10
SIMT_GEMM_EFFICIENCY = 0.85  # = kSimtGemmEfficiency in csrc/include/blink/roofline.h
GRID = [10.0 + 0.05 * i for i in range(601)]  # W per 16 nm-class TFLOP/s, 10 .. 40
WINDOWS = [0.0, 0.25e-3, 0.5e-3, 1e-3, 2e-3, 4e-3, 8e-3]  # s


def _flops(row: dp.Row) -> float:
    b, m, n, k = row.dims
    return 2.0 * b * m * n * k


def observed_ratio(rows: list[dp.Row], gpu: hardware.GPUSpec) -> float:
    fracs = sorted(_flops(r) / r.latency_s / gpu.peak_flops["fp32"]
                   for r in rows if _flops(r) >= MIN_FLOP)
    p95 = fracs[min(len(fracs) - 1, int(0.95 * (len(fracs) - 1) + 0.5))]
    return min(1.0, p95 / SIMT_GEMM_EFFICIENCY)


def rule(gpu: hardware.GPUSpec, c: float) -> float:
    return hardware.power_rule_ratio(gpu.peak_flops["fp32"] or 0.0, gpu.tdp_w, gpu.process, c)


def fit(gpus: list[hardware.GPUSpec], observed: dict[str, float]) -> float:
    errs = [sum((math.log(rule(g, c)) - math.log(observed[g.name])) ** 2 for g in gpus)
            for c in GRID]
    best = min(errs)
    flat = [c for c, e in zip(GRID, errs, strict=True) if e <= best + 1e-9]
    return 0.5 * (flat[0] + flat[-1])


_MAPPED: dict[int, dp.MappedOp] = {}


def apes(rows: list[dp.Row], spec: hardware.GPUSpec, window_s: float) -> list[float]:
    core = core_gpu_spec(spec, boost_window_s=window_s)
    out = []
    for r in rows:
        m = _MAPPED.get(id(r))
        if m is None:
            m = _MAPPED[id(r)] = dp.map_row(r)
        t = _C.features_for(m.op_name, m.inputs, m.outputs, core, False, True)["analytic_time_s"]
        out.append(abs(t - r.latency_s) / r.latency_s)
    return out


def with_ratio(spec: hardware.GPUSpec, ratio: float) -> hardware.GPUSpec:
    return dataclasses.replace(spec, sustained_fp32_ratio=ratio, sustained_tc_ratio=ratio)


def fit_window(train: list[tuple[hardware.GPUSpec, list[dp.Row]]], c: float) -> float:
    capped = [(with_ratio(g, rule(g, c)), rs) for g, rs in train if rule(g, c) < 1.0]
    if not capped:
        return 0.0
    def med(w: float) -> float:
        v = sorted(a for g, rs in capped for a in apes(rs, g, w))
        return v[len(v) // 2]
    return min(WINDOWS, key=med)


def _stats(v: list[float]) -> str:
    s = sorted(v)
    return f"{100 * sum(s) / len(s):6.1f}% {100 * s[len(s) // 2]:6.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--max-rows-per-file", type=int, default=None)
    args = ap.parse_args(argv)
    root = dp.data_dir(args.data)
    if root is None:
        print("NeuSight data not found (shared/data/public/neusight-train)", file=sys.stderr)
        return 2
    specs = {dev: hardware.get_gpu(alias) for dev, alias in dp.DEVICES.items()}
    rows = {dev: {fam: dp.load_family(root, fam, dev, args.max_rows_per_file)
                  for fam in ("bmm", "linear")} for dev in dp.DEVICES}
    observed = {specs[d].name: observed_ratio(rows[d]["bmm"] + rows[d]["linear"], specs[d])
                for d in dp.DEVICES}
    print(f"rows: bmm + linear, FP32; observed ratio = p95(FLOP/s / peak) / "
          f"{SIMT_GEMM_EFFICIENCY} over rows >= {MIN_FLOP:.0e} FLOP, clipped to 1")
    print(f"{'held out':<16} {'W/TF':>6} {'window':>7} {'obs':>6} {'pred':>6} | "
          f"{'family':<7} {'rows':>5} {'before MAPE':>11} {'med':>7} | "
          f"{'after MAPE':>10} {'med':>7}")
    print("-" * 97)
    for dev in dp.DEVICES:
        held = specs[dev]
        train_devs = [d for d in dp.DEVICES if d != dev]
        c = fit([specs[d] for d in train_devs], observed)
        window = fit_window([(specs[d], rows[d]["bmm"] + rows[d]["linear"]) for d in train_devs],
                            c)
        ratio = rule(held, c)
        before, after = with_ratio(held, 1.0), with_ratio(held, ratio)
        for i, fam in enumerate(("bmm", "linear")):
            head = (f"{held.name:<16} {c:>6.2f} {window * 1e3:>5.2f}ms "
                    f"{observed[held.name]:>6.3f} {ratio:>6.3f}" if i == 0 else " " * 44)
            rs = rows[dev][fam]
            print(f"{head} | {fam:<7} {len(rs):>5} {_stats(apes(rs, before, 0.0)):>19} | "
                  f"{_stats(apes(rs, after, window)):>18}")
    c_all = fit(list(specs.values()), observed)
    w_all = fit_window([(specs[d], rows[d]["bmm"] + rows[d]["linear"]) for d in dp.DEVICES],
                       c_all)
    print("-" * 97)
    print(f"fit on all five GPUs: SUSTAINED_W_PER_TFLOP_16NM = {c_all:.2f} (shipped: "
          f"{hardware.SUSTAINED_W_PER_TFLOP_16NM}), BOOST_WINDOW_S = {w_all * 1e3:.2f} ms "
          f"(shipped: {hardware.BOOST_WINDOW_S * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
