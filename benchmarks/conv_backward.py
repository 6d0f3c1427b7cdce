"""cuDNN's backward convolutions against its forward ones: DeepBench's kernel times by GPU.

    .venv/bin/python benchmarks/conv_backward.py          (~10 s on 2 cores)

Data: the public DeepBench convolution rows (shared/data/public/deepbench, cuDNN 7.6, fp32 on
six boards and fp16 tensor cores on the T4 and V100), costed by blink.train.data.load_deepbench as
`blink train` sees them. With one implicit-GEMM rate for every pass, the forward kernels came
out at 1.03x of the plan at the median, data gradients of stride-1 convolutions at 1.04x, but
data gradients of stride-2 convolutions at 2.4x and weight gradients at 1.34x, on every board
and in both precisions. Blink now runs those two at kConvStridedDgradEfficiency and
kConvWgradEfficiency of the forward rate (csrc/include/blink/kernel_plan.h, used in
conv_cost.cpp). The first table is median measured / analytic per pass with the rates at 1 and
shipped. The second holds each GPU chip out: the rate with the lowest MAPE on the other chips'
rows (a grid), that chip's MAPE at it, its own best and the shipped rate. A rate's times are the
shipped times with their implicit-GEMM main loop scaled by shipped / rate (its share of the
time: the main loop against the fp16 rows' NCHW transposes at the streaming rate); the algorithm
choice (Winograd for some 3x3 fp32 passes) stays as shipped, so the tables approximate the
engine at other rates (rebuilt at each rate, the engine gives strided dgrad 54.0% at rate 1
and 38.5% at 0.5, wgrad 35.2% at 1 and 34.5% at 0.85).

The check no DeepBench row enters: the RTX 3090's timm training steps (torch 1.12, cuDNN 8.3,
AMP), whose analytic MAPE the third table prints (before these rates: 10.1%, median measured /
analytic 1.099; `python -m blink.train.timm_cache --mode train` rebuilds that cache).
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import mape_pct as _mape  # noqa: E402
from _common import public_root_or_none  # noqa: E402

from blink.cost import _C  # noqa: E402
from blink.hardware import get_gpu  # noqa: E402
from blink.train import data as td  # noqa: E402
from blink.train import timm_cache  # noqa: E402

GRID = [0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 1.0]
GEMM_ALGOS = (1, 4)  # ConvAlgo::kImplicitGemm, kGroupedGemm


def _pass(family: str, stride: int) -> str:
    if family == "conv_bwd_data":
        return "dgrad, stride 1" if stride == 1 else "dgrad, strided"
    return {"conv_fwd": "forward", "conv_bwd_filter": "wgrad"}[family]


def main() -> int:
    root = public_root_or_none()
    if root is None:
        return 1
    shipped = {"dgrad, strided": float(_C.kConvStridedDgradEfficiency),
               "wgrad": float(_C.kConvWgradEfficiency)}
    rows: dict[str, list[tuple[str, float, float, float]]] = defaultdict(list)
    for r in td.load_deepbench(root):
        if r.kind != "conv":
            continue
        p = _pass(r.family, int(r.feats["stride_h"]))
        # The share of the analytic time that is the implicit GEMM's main loop (the rest: the
        # NCHW <-> NHWC transposes of the fp16 rows, aux_bytes at the streaming rate).
        share = 0.0
        if int(r.feats["conv_algo"]) in GEMM_ALGOS:
            g = get_gpu(r.gpu)
            kc = float(r.feats["kernel_compute_s"])
            aux = float(r.feats["aux_bytes"]) / (g.memory_bandwidth_bytes_per_s * g.dram_efficiency)
            share = kc / (kc + aux) if kc > 0 else 0.0
        rows[p].append((td.chip_of(r.gpu), r.measured_s, float(r.feats["analytic_time_s"]), share))

    def at(p: str, rate: float, chip: str | None = None,
           on_chip: bool = True) -> list[tuple[float, float]]:
        """(measured, time at `rate`) of pass p's rows: all, chip's, or the other chips'."""
        s = shipped.get(p, 1.0)
        return [(t, a * (1.0 + w * (s / rate - 1.0))) for c, t, a, w in rows[p]
                if chip is None or (c == chip) == on_chip]

    print("DeepBench convolutions: median measured / analytic per pass (rows)")
    head = f"{'pass':16} {'rows':>5} {'rate':>6} {'at rate 1':>10} {'shipped':>8}"
    print(head)
    print("-" * len(head))
    for p in ("forward", "dgrad, stride 1", "dgrad, strided", "wgrad"):
        s = shipped.get(p, 1.0)
        one = statistics.median(t / a for t, a in at(p, 1.0))
        now = statistics.median(t / a for _, t, a, _ in rows[p])
        print(f"{p:16} {len(rows[p]):5d} {s:6.2f} {one:10.2f} {now:8.2f}")
    print()
    for p in ("dgrad, strided", "wgrad"):
        print(f"{p}: MAPE % per held-out GPU chip; grid {', '.join(map(str, GRID))}")
        head = (f"{'held out':14} {'n':>4} {'rate 1':>7} {'others pick':>12} {'held out':>9} "
                f"{'own best':>9} {'shipped':>8}")
        print(head)
        print("-" * len(head))
        chips = sorted({c for c, *_ in rows[p]})
        tot = {"one": 0.0, "held": 0.0, "shipped": 0.0, "n": 0}
        for chip in chips:
            others = {x: _mape(at(p, x, chip, False)) for x in GRID}
            mine = {x: _mape(at(p, x, chip)) for x in GRID}
            pick, own = min(GRID, key=others.__getitem__), min(GRID, key=mine.__getitem__)
            n = sum(1 for c, *_ in rows[p] if c == chip)
            one = _mape(at(p, 1.0, chip))
            held = _mape(at(p, pick, chip))
            now = _mape(at(p, shipped[p], chip))
            for k, v in (("one", one), ("held", held), ("shipped", now)):
                tot[k] += v * n
            tot["n"] += n
            print(f"{chip:14} {n:4d} {one:7.1f} {pick:12.2f} {held:9.1f} {own:9.2f} {now:8.1f}")
        n = tot["n"]
        print(f"{'all':14} {n:4d} {tot['one'] / n:7.1f} {'':>12} {tot['held'] / n:9.1f} "
              f"{'':>9} {tot['shipped'] / n:8.1f}")
        print()
    cache = REPO / "data" / "derived" / timm_cache.TRAIN_CACHE_NAME
    if cache.is_file():
        pairs = [(float(r["measured_ms"]), float(r["time_ms"]))
                 for r in timm_cache.load_cache(cache, mode="train")]
        ratios = sorted(t / p for t, p in pairs)
        print(f"check: timm-rtx3090 training steps ({cache.name}, {len(pairs)} models): analytic "
              f"MAPE {_mape(pairs):.1f}%, median measured / analytic "
              f"{statistics.median(ratios):.3f} (before these rates: 10.1%, 1.099)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
