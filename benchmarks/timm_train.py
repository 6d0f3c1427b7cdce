"""Whole training steps: predicted against measured for timm models on one RTX 3090.

    .venv/bin/python benchmarks/timm_train.py [--models 40]

timm-rtx3090's training file times a full step (zero_grad, forward under AMP fp16, cross
entropy, backward, SGD with momentum) for each model at its benchmark batch and image size. No
learned model of Blink saw a training step: the forests learned per-op kernels, and the GNN
covers inference only (predict does not apply it to training steps, and says so). So this is a
held-out-mode check of what predict gives for training-cost estimates. For a deterministic
sample of models spread over families (param count within 1% of the benchmark's), prints MAPE /
median / p90 per predictor with each one's MAPE as a ratio of the roofline's, and the median
predicted / measured ratio.

Caveat: the file was measured with torch 1.12 and CUDA 11.3, whose SGD looped over parameters
(foreach became the CUDA default later) and whose cuDNN is older; Blink traces today's torch.
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

from blink.train.data import public_root  # noqa: E402
from blink.train.timm_cache import GPU, PARAM_TOLERANCE, read_benchmark, select_models  # noqa: E402

FILE = "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv.gz"
PREDICTORS = ("roofline", "analytic", "blink")
# timm maps old names of these benchmark files to their current ones, with a warning each.
warnings.filterwarnings("ignore", message="Mapping deprecated model name")


def main() -> int:
    import timm
    import torch

    from blink.dryrun import trace_model
    from blink.predict import predict_trace

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=40)
    a = ap.parse_args()
    rows = read_benchmark(public_root() / "timm-rtx3090" / FILE)
    picked = select_models(rows, a.models)
    t0 = time.time()
    got: dict[str, list[float]] = {p: [] for p in (*PREDICTORS, "measured")}
    used: set[str] = set()
    skipped = 0
    kw = {"allow_tf32_matmul": True, "allow_tf32_cudnn": True, "cudnn_benchmark": True,
          "host_time": "table"}
    for r in picked:
        bs, img = int(r["train_batch_size"]), int(r["train_img_size"])
        try:
            with torch.device("meta"):
                model = timm.create_model(r["model"], pretrained=False)
            n = sum(p.numel() for p in model.parameters())
            want = float(r["param_count"]) * 1e6
            if abs(n - want) > PARAM_TOLERANCE * want:
                skipped += 1
                continue
            t = trace_model(model, input_shape=(bs, 3, img, img), batch_size=bs, gpu=GPU,
                            dtype="amp-fp16", mode="train", optimizer="sgd")
            an = predict_trace(t, GPU, predictor="analytic", **kw)
            bl = predict_trace(t, GPU, predictor="auto", **kw)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be rebuilt is skipped
            print(f"skip {r['model']}: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            skipped += 1
            continue
        got["measured"].append(float(r["train_step_time"]))
        got["roofline"].append(an.lower_ms)
        got["analytic"].append(an.time_ms)
        got["blink"].append(bl.time_ms)
        used.add(bl.predictor)
    meas = np.array(got["measured"])
    print(f"timm-rtx3090 training steps (AMP fp16, SGD momentum, torch 1.12), {meas.size} models "
          f"({skipped} skipped), GPU {GPU}, {time.time() - t0:.0f} s; blink = predictor "
          f"{', '.join(sorted(used))}")
    print(f"{'predictor':<10} {'MAPE':>6} {'median':>7} {'p90':>6} {'pred/meas':>10} "
          f"{'MAPE/roofline':>14}")
    base = None
    for p in PREDICTORS:
        pred = np.array(got[p])
        ape = np.abs(pred - meas) / meas * 100
        base = base if base is not None else ape.mean()
        print(f"{p:<10} {ape.mean():6.1f} {np.median(ape):7.1f} {np.quantile(ape, 0.9):6.1f} "
              f"{np.median(pred / meas):10.3f} {ape.mean() / base:13.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
