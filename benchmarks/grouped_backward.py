"""The backward rate of grouped convolutions, chosen on held-out families of training steps.

    .venv/bin/python benchmarks/grouped_backward.py          (~3.5 minutes on 2 cores)

Data: the public timm RTX 3090 AMP training steps (shared/data/public/timm-rtx3090; torch 1.12,
cuDNN 8.3) as blink's training cache holds them (data/derived). Each cached model is traced
again for the analytic time of its grouped (not depthwise) convolutions' backward passes, which
kConvGroupedBackwardEfficiency (csrc/include/blink/kernel_plan.h) divides. A step's time at
another rate r is taken as the cached time plus that part rescaled (shipped / r - 1): exact
for a timeline of back-to-back kernels while no plan switches to the dense alternative, so an
approximation of the engine. For each of blink evaluate's five folds of held-out families the
rate with the lowest MAPE on the other four folds is chosen and scored on the held-out one.
"""
from __future__ import annotations

import sys
import warnings
from multiprocessing import Pool
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

warnings.filterwarnings("ignore")

RATES = [1.0, 0.9, 0.8, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4]
FOLDS = 5
HEAVY = 0.05  # "grouped-heavy": grouped backward passes above this share of the step


def _grouped_backward_ms(job: tuple[str, int, int]) -> float | None:
    """Analytic ms of one cached row's grouped-convolution backward units (None: no build)."""
    from timm_conv_classes import conv_class

    from blink.cost import trace_features
    from blink.hardware import get_gpu
    from blink.train import timm_cache as tc

    name, img, batch = job
    try:
        t, _ = tc.build_model(name, batch, img, None, "train")
    except Exception:  # noqa: BLE001 - a row that fails to build is skipped, as the cache does
        return None
    total = 0.0
    for f in trace_features(t, get_gpu(tc.GPU), allow_tf32_matmul=True, allow_tf32_cudnn=True,
                            cudnn_benchmark=True):
        if f["kind"] == "conv" and "backward" in f["op"] and conv_class(f) == "grouped":
            total += f["analytic_time_s"] * 1e3
    return total


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


def main() -> None:
    from blink.cost import _C
    from blink.train import timm_cache as tc
    from blink.train.fit import group_folds

    shipped = float(_C.kConvGroupedBackwardEfficiency)
    rows = tc.load_cache(mode="train")
    with Pool(2) as pool:
        got = pool.map(_grouped_backward_ms,
                       [(r["model"], int(r["img_size"]), int(r["batch"])) for r in rows],
                       chunksize=4)
    kept = [(r, g) for r, g in zip(rows, got, strict=True) if g is not None]
    meas = np.array([r["measured_ms"] for r, _ in kept])
    time = np.array([r["time_ms"] for r, _ in kept])
    grouped = np.array([g for _, g in kept])
    fam = np.array([r["family"] for r, _ in kept])

    def at(rate: float) -> np.ndarray:
        return time + grouped * (shipped / rate - 1.0)

    heavy = grouped * shipped > HEAVY * at(1.0)
    print(f"timm-rtx3090 training steps: {len(kept)} models, {len(np.unique(fam))} families; "
          f"{int(heavy.sum())} with > {HEAVY:.0%} of the step (at rate 1) in grouped backward "
          f"passes; shipped kConvGroupedBackwardEfficiency = {shipped}")
    print("MAPE % by rate (all rows, in sample):")
    print("  " + "  ".join(f"{r:g}: {_mape(at(r), meas):.2f}" for r in RATES))
    held = np.empty_like(meas)
    print(f"{'fold':>4} {'n':>4} {'chosen':>7} {'at 1':>6} {'held out':>9}")
    for i, test in enumerate(group_folds(fam, FOLDS)):
        rate = min(RATES, key=lambda r: _mape(at(r)[~test], meas[~test]))
        held[test] = at(rate)[test]
        print(f"{i:>4} {int(test.sum()):>4} {rate:>7g} {_mape(at(1.0)[test], meas[test]):>6.2f} "
              f"{_mape(held[test], meas[test]):>9.2f}")
    print(f"held-out families, MAPE at rate 1 -> each fold's chosen rate: "
          f"all {_mape(at(1.0), meas):.2f} -> {_mape(held, meas):.2f}; grouped-heavy "
          f"{_mape(at(1.0)[heavy], meas[heavy]):.2f} -> {_mape(held[heavy], meas[heavy]):.2f} "
          f"(median measured / predicted {np.median(meas[heavy] / at(1.0)[heavy]):.3f} -> "
          f"{np.median(meas[heavy] / held[heavy]):.3f})")
    print("grouped-heavy families (MAPE at rate 1 -> held out):")
    for f in sorted(set(fam[heavy])):
        m = heavy & (fam == f)
        print(f"  {f:<14} {int(m.sum()):>3} {_mape(at(1.0)[m], meas[m]):6.1f} -> "
              f"{_mape(held[m], meas[m]):6.1f}")


if __name__ == "__main__":
    main()
