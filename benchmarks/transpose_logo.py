"""kPermutedCopySlowdown (csrc/include/blink/roofline.h), chosen and reported one timm family out.

    .venv/bin/python benchmarks/transpose_logo.py [--models N]

Data: the public timm RTX 3090 AMP inference times of the same models run NCHW and
channels-last (shared/data/public/timm-rtx3090, the two infer-amp files), for the models in
both blink caches whose measured times lie above the traced roofline in both layouts. Between
the two runs only the memory layout changes, and with it which copies and element-wise ops read
a permuted view (NCHW <-> token reshapes, NHWC channel slices, CaiT's talking-heads permutes).

Each model is traced in both layouts here and costed by the C++ engine; a unit that gathers
(features "permuted") has its time scaled from the shipped factor F to a grid value f (time x
f / F: its time is DRAM-bound, a small approximation for the few near the launch floor). For
each family held out, f is the grid value whose predicted NHWC / NCHW speed-ups best match the
measured ones (squared log error) on the other families; the table prints the held-out
speed-up error at f = 1 (no rule), at the fold's f and at F, and the analytic MAPE of each
layout at f = 1 and F, with the spread of log(predicted / measured) a learned correction
cannot remove by a constant.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from timm_layouts import LAYOUT_MODES, cached_pairs  # noqa: E402

from blink import _C  # noqa: E402
from blink.cost import trace_features  # noqa: E402
from blink.train import timm_cache as tc  # noqa: E402

SHIPPED = float(_C.kPermutedCopySlowdown)
GRID = [1.0 + 0.25 * i for i in range(9)]  # 1 .. 3
assert SHIPPED in GRID, "add the shipped constant to GRID"
warnings.filterwarnings("ignore", message="Mapping deprecated model name")


def _rows(limit: int | None) -> list[tuple[str, str, dict[str, tuple[float, float, float]]]]:
    """(model, family, {layout: (measured ms, analytic ms, permuted units' ms)})."""
    keys, caches = cached_pairs()
    out = []
    for name, img, batch in keys[:limit]:
        got = {}
        try:
            for lay, mode in LAYOUT_MODES.items():
                t, _ = tc.build_model(name, int(batch), int(img), None, mode)
                feats = trace_features(t, tc.GPU, allow_tf32_matmul=True, allow_tf32_cudnn=True,
                                       cudnn_benchmark=True)
                total = sum(r["analytic_time_s"] for r in feats) * 1e3
                perm = sum(r["analytic_time_s"] for r in feats if r["permuted"]) * 1e3
                got[lay] = (caches[lay][(name, img, batch)]["measured_ms"], total, perm)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be rebuilt is skipped
            print(f"skip {name}: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            continue
        out.append((name, tc.family_of(name), got))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=None, help="only the first N models")
    a = ap.parse_args()
    rows = _rows(a.models)
    fam = np.array([f for _, f, _ in rows])
    arr = {lay: np.array([g[lay] for _, _, g in rows]) for lay in LAYOUT_MODES}
    meas = {lay: arr[lay][:, 0] for lay in LAYOUT_MODES}
    # units that do not gather
    base = {lay: arr[lay][:, 1] - arr[lay][:, 2] for lay in LAYOUT_MODES}
    perm1 = {lay: arr[lay][:, 2] / SHIPPED for lay in LAYOUT_MODES}  # permuted units at f = 1

    def pred(lay: str, f: float) -> np.ndarray:
        return base[lay] + f * perm1[lay]

    ms = meas["nchw"] / meas["nhwc"]

    def speedup(f: float) -> np.ndarray:
        return pred("nchw", f) / pred("nhwc", f)

    held = np.zeros(len(rows))
    chosen: Counter[float] = Counter()
    for f_out in sorted(set(fam)):
        tr, te = fam != f_out, fam == f_out
        err = [np.mean(np.log(speedup(g)[tr] / ms[tr]) ** 2) for g in GRID]
        g = GRID[int(np.argmin(err))]
        chosen[g] += 1
        held[te] = speedup(g)[te]
    gathers = (perm1["nchw"] > 0.02 * base["nchw"]) | (perm1["nhwc"] > 0.02 * base["nhwc"])

    def ape(p: np.ndarray, m: np.ndarray) -> float:
        return float(np.mean(np.abs(p / m - 1.0)) * 100.0)

    print(f"timm-rtx3090 AMP fp16 inference, {len(rows)} models in both layouts, "
          f"{len(set(fam))} families; shipped kPermutedCopySlowdown = {SHIPPED}")
    print("factor chosen per held-out family: "
          + ", ".join(f"{g:g} x{n}" for g, n in sorted(chosen.items())))
    print(f"\n{'NHWC / NCHW speed-up error (MAPE)':<44} {'f=1':>7} {'fold f':>7} "
          f"{'shipped':>8}")
    for lab, m in (("all models", np.ones(len(rows), bool)),
                   (f"models with permuted units >2% ({gathers.sum()})", gathers)):
        print(f"  {lab:<42} {ape(speedup(1.0)[m], ms[m]):7.2f} {ape(held[m], ms[m]):7.2f} "
              f"{ape(speedup(SHIPPED)[m], ms[m]):8.2f}")
    print(f"\n{'analytic, per layout':<28} {'MAPE f=1':>9} {'shipped':>8} "
          f"{'std log(p/m) f=1':>17} {'shipped':>8}")
    for lay in LAYOUT_MODES:
        p1, ps = pred(lay, 1.0), pred(lay, SHIPPED)
        print(f"  {lay:<26} {ape(p1, meas[lay]):9.2f} {ape(ps, meas[lay]):8.2f} "
              f"{np.std(np.log(p1 / meas[lay])):17.4f} {np.std(np.log(ps / meas[lay])):8.4f}")
    print("\nfamilies the rule moves most (NCHW predicted / measured at f=1 -> shipped):")
    moved = sorted(set(fam), key=lambda f: -float(np.mean(perm1["nchw"][fam == f]
                                                          / base["nchw"][fam == f])))
    for f in moved[:8]:
        m = fam == f
        print(f"  {f:<14} n {m.sum():2d}  {np.median(pred('nchw', 1.0)[m] / meas['nchw'][m]):.3f}"
              f" -> {np.median(pred('nchw', SHIPPED)[m] / meas['nchw'][m]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
