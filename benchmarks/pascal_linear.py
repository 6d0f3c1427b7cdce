"""nn.Linear on Pascal: the public NeuSight rows slow down with K and with the GEMM's size.

    .venv/bin/python benchmarks/pascal_linear.py          (~15 s on 2 cores)

Data: the public NeuSight nn.Linear and torch.bmm rows (shared/data/public/neusight-train,
PyTorch 2.1 / CUDA 12.1, FP32 with TF32 off) as kernel times (the event floor taken off, as
`blink train` does: blink.train.data.load_units), the kernel's grid from the same CSV rows.

Two tables of median measured / analytic, per GPU: by K (the reduction, nn.Linear's
in_features) and by the GEMM's operand + output bytes. nn.Linear rows only where the kernel
ran without a K split (gridDim.z = 1) and Blink's plan does not split either, so neither a
split count nor a reduce kernel is in the ratio; torch.bmm beside (cublasGemmStridedBatchedEx,
never split; NeuSight's bmm rows have K <= ~1000, so only the bytes table compares them).
On the P100 and the P4 the
cublasLt kernels nn.Linear ran (maxwell_sgemm_*_tn, both operands K-contiguous) took 1.16x /
1.34x the plan at K <= 1024 and 2.5x / 3.0x at K > 16384 before the panel rule; by bytes,
1.06x / 1.22x under 64 MB and 1.56x / 3.1x over 1 GB, while their torch.bmm
(maxwell_sgemm_128x64_nn) at the same bytes stays at 0.85-1.07x. The V100's and A100's
nn.Linear stay within 0.88-1.06x, the T4's 1.1-1.27x. The P100 holds its boost clock under the
power rule, so this is not the P4's power cap. Capping the plan's K split on sm_6x (at 2-8
ways, or at 1-8 CTAs per SM) does not help (P100 nn.Linear 23.4% -> 22.8-29.5%), nor does a
GEMM forest given the panel-to-L2 ratio as a feature (held-out GEMM MAPE 17.4 -> 17.2%,
DeepBench 20.1 -> 21.8%; both tried 2026-12-05).

What does: the slow-down starts where a CTA's operand panels, (tile_m + tile_n) x K x 4 B of
one split, reach the board's L2 (4 MB on the P100, 2 MB on the P4) and grows about as the
square root beyond it. The third table shows it and the rule Blink ships for these kernels
(kPascalLtPanelExponent, csrc/include/blink/kernel_plan.h): each board's MAPE with the rule
off (the engine given an unbounded L2), at the exponent the *other* board prefers (a grid,
applied to the rule-off plan, so no re-planning: an approximation of the engine) and with the
shipped engine. x0 = 1 (the L2 size) is not fitted.

The fourth table is the other half: below the L2 too, where no panel outgrows it, the *_tn
tiles ran 1.16x (P100) and 1.34x (P4) the plan, when torch.bmm's 128x64_nn and DeepBench's
plain cublasSgemm tiles on the same boards do not. Blink runs these tiles at
kPascalLtTileRate of the tile table's rate; the table gives each board's MAPE at rate 1, at the
rate the other board prefers (a grid; the shipped times scaled by shipped / rate, exact for an
unsplit plan at a fixed clock, so again an approximation of the engine) and shipped. The first
two tables and the third are printed with the rate in place.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import mape_pct as _mape  # noqa: E402
from _common import public_root_or_none  # noqa: E402

from blink import data_public as dp  # noqa: E402
from blink.cost import _C, core_gpu_spec  # noqa: E402
from blink.hardware import get_gpu  # noqa: E402
from blink.train import data as td  # noqa: E402

K_BINS = [(0, 1024), (1024, 4096), (4096, 8192), (8192, 16384), (16384, 10**9)]
MB = 2**20
FOOT_BINS = [(0, 64 * MB), (64 * MB, 256 * MB), (256 * MB, 1024 * MB), (1024 * MB, 10**13)]
GPUS = ["P100", "P4", "T4", "V100-PCIe", "A100-PCIe-40GB"]


def _labels(bins: list[tuple[int, int]], unit: int = 1, suffix: str = "") -> list[str]:
    return [f"{lo // unit}-{hi // unit}{suffix}" for lo, hi in bins[:-1]] + \
        [f">{bins[-1][0] // unit}{suffix}"]


def _bin(x: float, bins: list[tuple[int, int]], labels: list[str]) -> str:
    return next((lab for (lo, hi), lab in zip(bins, labels, strict=True) if lo < x <= hi), "?")


def _print(title: str, ratios: dict[tuple[str, str, str], list[float]], bins: list[str]) -> None:
    head = f"{'GPU':16} {'op':7}" + "".join(f" {b:>13}" for b in bins)
    print(title)
    print(head)
    print("-" * len(head))
    for gpu in GPUS:
        for fam in ("linear", "bmm"):
            cells = []
            for b in bins:
                v = ratios.get((gpu, fam, b), [])
                cells.append(f"{statistics.median(v):6.2f} ({len(v):4d})" if v else "-")
            print(f"{gpu:16} {fam:7}" + "".join(f" {c:>13}" for c in cells))
    print()


def main() -> int:
    root = public_root_or_none()
    if root is None:
        return 1
    # The kernel grid of each nn.Linear row, by (GPU, dims); shapes repeat rarely, first wins.
    grid: dict[tuple[str, str], int] = {}
    names: dict[str, str] = {}
    for r in dp.load_family(root / "neusight-train", "linear"):
        name = names.setdefault(r.gpu, get_gpu(r.gpu).name)
        key = (name, "x".join(str(d) for d in r.dims))
        grid.setdefault(key, r.grid[2])
    k_labels, foot_labels = _labels(K_BINS), _labels(FOOT_BINS, MB, " MB")
    rows = td.load_units(root, neusight_rows_per_file=100000, neusight_mixed_rows=10)
    by_k: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    by_foot: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.dataset != "neusight-train" or r.family not in ("linear", "bmm"):
            continue
        dims = r.shape.split(":")[-1]
        k = int(r.feats["k"])  # the reduction (nn.Linear's in_features; dims are B, M, in, out)
        if r.family == "linear":
            z = grid.get((r.gpu, dims))
            if z != 1 or int(r.feats.get("split_k", 1)) != 1:
                continue
        ratio = r.measured_s / float(r.feats["analytic_time_s"])
        foot = float(r.feats["bytes_read"]) + float(r.feats["bytes_written"])
        by_k[(r.gpu, r.family, _bin(k, K_BINS, k_labels))].append(ratio)
        by_foot[(r.gpu, r.family, _bin(foot, FOOT_BINS, foot_labels))].append(ratio)
    what = ("median measured / analytic (rows); nn.Linear rows with no K split by cuBLAS or "
            "the plan")
    _print(f"{what}, by K", by_k, k_labels)
    _print(f"{what}, by operand + output bytes", by_foot, foot_labels)
    _tile_rate(_panel_rule(root))
    return 0


PASCAL = ("P100", "P4")
EXPONENTS = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7]


RATES = [0.75, 0.8, 0.825, 0.85, 0.875, 0.9, 0.95, 1.0]
Rows = dict[str, list[tuple[float, float, float, float]]]


def _panel_rule(root: Path) -> Rows:
    """Held-out check of the L2 panel rule on the two sm_6x boards' nn.Linear kernel times."""
    floors = td.neusight_floors(td.load_neusight(root, 100000, 0, 0))
    on: dict[str, object] = {}
    off: dict[str, object] = {}
    rows: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for r in dp.load_family(root / "neusight-train", "linear"):
        spec = get_gpu(r.gpu)
        if spec.name not in PASCAL:
            continue
        floor = floors.get((spec.name, "linear"), 0.0)
        if r.latency_s < td.NEUSIGHT_FLOOR_KEEP * floor:
            continue  # floor-dominated: blink train drops it too
        if spec.name not in on:
            on[spec.name] = core_gpu_spec(spec)
            off[spec.name] = core_gpu_spec(dataclasses.replace(spec, l2_bytes=2**62))
        m = dp.map_row(r)
        f_off = _C.features_for(m.op_name, m.inputs, m.outputs, off[spec.name], False, True,
                                False)
        f_on = _C.features_for(m.op_name, m.inputs, m.outputs, on[spec.name], False, True,
                               False)
        k_split = float(f_off["k"]) / max(1.0, float(f_off["split_k"]))
        x = (float(f_off["tile_m"]) + float(f_off["tile_n"])) * k_split * 4.0 / spec.l2_bytes
        rows[spec.name].append((r.latency_s - floor, float(f_off["analytic_time_s"]),
                                float(f_on["analytic_time_s"]), x))

    def at(gpu: str, e: float) -> float:
        return _mape([(t, p * max(1.0, x) ** e) for t, p, _, x in rows[gpu]])

    _board_table("nn.Linear kernel times on the sm_6x boards: MAPE % with the L2 panel rule off, "
                 "at the exponent the other board prefers, and shipped",
                 f"shipped kPascalLtPanelExponent = {_C.kPascalLtPanelExponent}", EXPONENTS,
                 rows, at, ("rule off", lambda g: _mape([(t, p) for t, p, _, _ in rows[g]])),
                 lambda g: _mape([(t, p) for t, _, p, _ in rows[g]]), ("exponent", ".1f"))
    return rows


def _board_table(title: str, shipped_line: str, grid: list[float], rows: Rows,
                 at: Callable[[str, float], float],
                 base: tuple[str, Callable[[str], float]], shipped: Callable[[str], float],
                 value: tuple[str, str]) -> None:
    """One sm_6x board held out at a time: its MAPE without the rule (`base`), at the grid
    value the other board's rows prefer, its own best value and shipped."""
    print(title)
    print(f"{shipped_line}; grid {', '.join(str(v) for v in grid)}")
    head = (f"{'held out':10} {'n':>6} {base[0]:>9} {'other board':>12} {value[0]:>9} "
            f"{'held out':>9} {'own best':>9} {'shipped':>8}")
    print(head)
    print("-" * len(head))
    for gpu in PASCAL:
        other = next(g for g in PASCAL if g != gpu)
        mapes = {g: {v: at(g, v) for v in grid} for g in (gpu, other)}
        v_other = min(grid, key=mapes[other].__getitem__)
        v_own = min(grid, key=mapes[gpu].__getitem__)
        print(f"{gpu:10} {len(rows[gpu]):6d} {base[1](gpu):9.1f} {other:>12} "
              f"{v_other:9{value[1]}} {mapes[gpu][v_other]:9.1f} {v_own:9{value[1]}} "
              f"{shipped(gpu):8.1f}")
    print()


def _tile_rate(rows: Rows) -> None:
    """Held-out check of kPascalLtTileRate: the shipped engine's times scaled by shipped / rate
    (exact for an unsplit plan at a fixed clock; the split-K reduce and the boost window make it
    an approximation)."""
    shipped = float(_C.kPascalLtTileRate)

    def at(gpu: str, rate: float) -> float:
        return _mape([(t, p * shipped / rate) for t, _, p, _ in rows[gpu]])

    _board_table("nn.Linear kernel times on the sm_6x boards: MAPE % with the *_tn tiles at the "
                 "table's rate (1), at the rate the other board prefers, and shipped",
                 f"shipped kPascalLtTileRate = {shipped}", RATES, rows, at,
                 ("rate 1", lambda g: at(g, 1.0)), lambda g: at(g, shipped), ("rate", ".3f"))


if __name__ == "__main__":
    raise SystemExit(main())
