"""DRAM_EFFICIENCY (blink/hardware.py): each GPU's streaming rate, and the rule held out by chip.

    .venv/bin/python benchmarks/dram_efficiency_logo.py [--data DIR]

Data: NeuSight's element-wise, layer-norm and softmax rows on P4, P100, T4, V100-PCIe and
A100-PCIe-40GB (shared/data/public/neusight-train; PyTorch 2.1, CUDA 12.1, FP32), as kernel
times: blink.train's event floors taken off (each element-wise op's own line intercept; layer
norm and softmax the median of the GPU's), the floor-dominated rows dropped.

First table: per GPU chip and element-wise op, the measured time is a line in the bytes the op
moves; its slope is the streaming rate, printed over the datasheet bandwidth (min / median /
max over the 11 ops, and the worst line's RMS relative residual). Second table: per chip, the
rule's value (the mean of its group's chips), the value its group's other chips give with it
held out, and the analytic time's MAPE on the chip's element-wise, layer-norm and softmax rows
at 0.85 (every GPU's value before), at the held-out value and at the shipped rule, side by side
with their ratios. Every row is costed by the C++ engine with the GpuSpec's dram_efficiency set.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from blink import data_public as dp
from blink import hardware
from blink.cost import _C, core_gpu_fields
from blink.train import data as td

OLD = 0.85  # every GPU's streaming rate until 2026-12-05
FAMILIES = ("elem", "ln", "softmax")


def _group(gpu: hardware.GPUSpec) -> str:
    return ("Pascal/Turing" if hardware.dram_efficiency_rule(gpu.compute_capability)
            == hardware.DRAM_EFFICIENCY_PASCAL_TURING else "Volta+")


def _kernel_rows(root: Path) -> list[tuple[td.UnitSample, tuple]]:
    """(floor-free sample, (op, inputs, outputs)) of every element-wise / norm / softmax row."""
    rows = [r for r in td.load_neusight(root, 0, 0, None) if td._usable(r)
            and r.family in FAMILIES]
    kept = td.remove_neusight_floor(rows, td.neusight_floors(rows))
    ops: dict[tuple[str, str], tuple] = {}
    canonical = {a: hardware.get_gpu(a).name for a in dp.DEVICES.values()}
    for fam in FAMILIES:
        for r in dp.load_family(root / "neusight-train", fam):
            m = dp.map_row(r)
            ops[(canonical[r.gpu], f"{fam}:{r.op}:{'x'.join(map(str, r.dims))}")] = (
                m.op_name, m.inputs, m.outputs)
    return [(r, ops[(r.gpu, r.shape)]) for r in kept]


def _analytic(op: tuple, gpu: str, eff: float, cache: dict) -> float:
    key = (gpu, eff)
    if key not in cache:
        cache[key] = _C.GpuSpec(**{**core_gpu_fields(gpu), "dram_efficiency": eff})
    f = _C.features_for(op[0], op[1], op[2], cache[key], False, True, False)
    return float(f["analytic_time_s"])


def _mape(pred: list[float], meas: list[float]) -> float:
    p, m = np.asarray(pred), np.asarray(meas)
    return float(100 * np.mean(np.abs(p - m) / m))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="the public data folder (default: shared)")
    a = ap.parse_args(argv)
    rows = _kernel_rows(td.public_root(a.data))
    chips = sorted({td.chip_of(r.gpu) for r, _ in rows})
    spec = {c: hardware.get_gpu(next(r.gpu for r, _ in rows if td.chip_of(r.gpu) == c))
            for c in chips}

    print("Streaming rate per chip: slope of each element-wise op's kernel time against its "
          "bytes, over the datasheet bandwidth")
    hdr = (f"{'chip':16s} {'group':14s} {'ops':>4s} {'min':>6s} {'median':>7s} {'max':>6s} "
           f"{'worst RMS':>10s}")
    print(hdr)
    print("-" * len(hdr))
    measured: dict[str, float] = {}
    for c in chips:
        lines = defaultdict(list)
        for r, _ in rows:
            if td.chip_of(r.gpu) == c and r.family == "elem":
                b = float(r.feats["bytes_read"]) + float(r.feats["bytes_written"])
                lines[td.neusight_op(r)].append((b, r.measured_s))
        effs, worst = [], 0.0
        for pts in lines.values():
            x, y = np.array(pts).T
            A = np.c_[np.ones_like(x), x]
            coef = np.linalg.lstsq(A, y, rcond=None)[0]
            worst = max(worst, float(np.sqrt(np.mean(((y - A @ coef) / y) ** 2))))
            effs.append(1.0 / coef[1] / spec[c].memory_bandwidth_bytes_per_s)
        measured[c] = float(np.median(effs))
        print(f"{c:16s} {_group(spec[c]):14s} {len(effs):4d} {100 * min(effs):5.1f}% "
              f"{100 * measured[c]:6.1f}% {100 * max(effs):5.1f}% {100 * worst:9.2f}%")

    print()
    print("Analytic MAPE on each chip's element-wise + layer-norm + softmax kernels: 0.85 for "
          "all (before), its group's value from the other chips (held out), the shipped rule")
    hdr = (f"{'chip':16s} {'n':>5s} {'rule':>5s} {'held':>5s} | {'0.85':>6s} {'held-out':>9s} "
           f"{'ratio':>6s} {'rule':>6s} {'ratio':>6s}")
    print(hdr)
    print("-" * len(hdr))
    cache: dict = {}
    allm: dict[str, list[float]] = defaultdict(list)
    for c in chips:
        g = _group(spec[c])
        others = [measured[o] for o in chips if o != c and _group(spec[o]) == g]
        held = round(float(np.mean(others)), 2) if others else OLD
        rule = spec[c].dram_efficiency
        sel = [(r, op) for r, op in rows if td.chip_of(r.gpu) == c]
        meas = [r.measured_s for r, _ in sel]
        res = {}
        for name, e in (("old", OLD), ("held", held), ("rule", rule)):
            pred = [_analytic(op, r.gpu, e, cache) for r, op in sel]
            res[name] = _mape(pred, meas)
            allm[name] += list(np.abs(np.array(pred) - meas) / np.array(meas))
        print(f"{c:16s} {len(sel):5d} {rule:5.2f} {held:5.2f} | {res['old']:5.1f}% "
              f"{res['held']:8.1f}% {res['held'] / res['old']:5.2f}x {res['rule']:5.1f}% "
              f"{res['rule'] / res['old']:5.2f}x")
    tot = {k: 100 * float(np.mean(v)) for k, v in allm.items()}
    print(f"{'all':16s} {len(rows):5d} {'':5s} {'':5s} | {tot['old']:5.1f}% {tot['held']:8.1f}% "
          f"{tot['held'] / tot['old']:5.2f}x {tot['rule']:5.1f}% {tot['rule'] / tot['old']:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
