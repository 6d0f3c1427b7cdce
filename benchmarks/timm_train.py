"""Whole training steps: predicted against measured for timm models on one RTX 3090.

    .venv/bin/python benchmarks/timm_train.py [--models 40]

timm-rtx3090's training file times a full step (forward under AMP fp16, cross entropy,
backward, SGD with Nesterov momentum; zero_grad before the timer) for each model at its
benchmark batch and image size.
For a deterministic sample of models spread over families (param count within 1% of the
benchmark's), each traced here as that step, prints MAPE / median / p90 per predictor with each
one's MAPE as a ratio of the roofline's, and the median predicted / measured ratio:

- roofline, analytic: blink's unlearned times;
- trees: the per-unit forests' timeline (predictor="trees"): they learned per-op kernels only
  and never saw this GPU or a training step, so this is a held-out check of them (the conv
  forest, fitted on sm_6x-7x boards, stays off on this sm_86 GPU, as predict runs it);
- correction: the training-step correction (what predict ships for AMP training steps on the
  RTX 3090, models/forest_model_train.json), here refitted without the model's family: its
  out-of-fold time over 5 folds of held-out families of the training-step cache
  (data/derived/timm_rtx3090_train.csv.gz). The shipped one saw every cached row, so predict's
  own time for these models would be in-sample and is not shown.

Caveat: the file was measured with torch 1.12 and CUDA 11.3, whose cuDNN is older. Its
optimizer step is traced as torch 1.12 ran it (timm_cache.build_model ->
blink.dryrun.torch112_sgd_step: Nesterov SGD's per-parameter loop into zero-filled gradients)
and ViT / DeiT / PiT / Twins / VOLO attention scales its scores as 2022's timm did
(timm_cache._timm_2022_attention_scale); every other op is traced as today's torch and timm
run it.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from blink.train import model_level as ml  # noqa: E402
from blink.train.data import public_root  # noqa: E402
from blink.train.timm_cache import (  # noqa: E402
    GPU,
    MODES,
    build_model,
    default_cache_path,
    load_cache,
    read_benchmark,
    select_models,
)

PREDICTORS = ("roofline", "analytic", "trees", "correction")
# timm maps old names of these benchmark files to their current ones, with a warning each.
warnings.filterwarnings("ignore", message="Mapping deprecated model name")


def held_out_correction() -> dict[str, float]:
    """model -> the training-step correction's out-of-fold time (ms), families held out."""
    cache = default_cache_path("train")
    if not cache.is_file():
        return {}
    t = ml.consistent_table(load_cache(cache, mode="train"))[0]
    p = ml.oof(t, "correction", np.ones(len(t), dtype=bool))
    return dict(zip(t.model.tolist(), p.tolist(), strict=True))


def main() -> int:
    from blink.predict import predict_trace

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=40)
    a = ap.parse_args()
    rows = read_benchmark(public_root() / "timm-rtx3090" / MODES["train"].file)
    picked = select_models(rows, a.models)
    t0 = time.time()
    corr = held_out_correction()
    got: dict[str, list[float]] = {p: [] for p in (*PREDICTORS, "measured")}
    skipped = 0
    kw = {"allow_tf32_matmul": True, "allow_tf32_cudnn": True, "cudnn_benchmark": True,
          "host_time": "table"}
    for r in picked:
        bs, img = int(r["train_batch_size"]), int(r["train_img_size"])
        try:
            t, _ = build_model(r["model"], bs, img, float(r["param_count"]) * 1e6, "train")
            an = predict_trace(t, GPU, predictor="analytic", **kw)
            tr = predict_trace(t, GPU, predictor="trees", **kw)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be rebuilt is skipped
            print(f"skip {r['model']}: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            skipped += 1
            continue
        got["measured"].append(float(r["train_step_time"]))
        got["roofline"].append(an.lower_ms)
        got["analytic"].append(an.time_ms)
        got["trees"].append(tr.time_ms)
        got["correction"].append(corr.get(r["model"], float("nan")))
    meas = np.array(got["measured"])
    have = np.isfinite(np.array(got["correction"]))
    print(f"timm-rtx3090 training steps (AMP fp16, SGD momentum, torch 1.12), {meas.size} models "
          f"({skipped} skipped), GPU {GPU}, {time.time() - t0:.0f} s; correction: held-out "
          f"families, {int(have.sum())} of them in the training-step cache")
    print(f"{'predictor':<10} {'n':>4} {'MAPE':>6} {'median':>7} {'p90':>6} {'pred/meas':>10} "
          f"{'MAPE/roofline':>14}")
    for p in PREDICTORS:
        pred = np.array(got[p])
        m = have if p == "correction" else np.ones(meas.size, dtype=bool)
        if not m.any():
            print(f"{p:<10} (no training-step cache: python -m blink.train.timm_cache --mode "
                  "train)")
            continue
        ape = np.abs(pred[m] - meas[m]) / meas[m] * 100
        roof = np.abs(np.array(got["roofline"])[m] - meas[m]) / meas[m] * 100
        print(f"{p:<10} {int(m.sum()):>4} {ape.mean():6.1f} {np.median(ape):7.1f} "
              f"{np.quantile(ape, 0.9):6.1f} {np.median(pred[m] / meas[m]):10.3f} "
              f"{ape.mean() / roof.mean():13.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
