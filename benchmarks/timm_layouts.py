"""NCHW against channels-last: the same timm models, measured both ways on one RTX 3090.

    .venv/bin/python benchmarks/timm_layouts.py [--models 60]
    .venv/bin/python benchmarks/timm_layouts.py --cached

--cached reads the two analytic caches instead of tracing (data/derived/timm_rtx3090_infer.csv.gz
and timm_rtx3090_infer_nhwc.csv.gz, `python -m blink.train.timm_cache --mode inference-nhwc`):
every cached model in both layouts, roofline and analytic only, the measured and predicted
speed-ups with the families whose layout effect blink misses most, and the benchmark's own
repeatability (models whose convolutions are under 2% of the roofline time should not change
with the layout: their measured NHWC/NCHW spread is run-to-run noise).

timm-rtx3090 has AMP fp16 inference times of each model in NCHW and in channels_last (NHWC).
The shipped GNN and the model-level cache saw NCHW only, so the NHWC rows are a held-out layout:
they check the channels-last path (meta convolutions in CUDA's output format, NHWC convolution
costs, the transposes Blink adds or drops) and whether the learned corrections carry over. For a
deterministic sample of models present in both files at the same batch and image size (spread
over families), prints MAPE / median / p90 per predictor and layout, each predictor's MAPE as a
ratio of the roofline's, and the measured and predicted NHWC/NCHW speed-ups.

Predictors: roofline (the timeline's lower bound), analytic (predictor="analytic") and blink
(predictor="auto": the shipped forests and, on this GPU, the GNN). The GNN was fitted on every
cached NCHW row, so blink's NCHW figures are in-sample (its held-out-family figures are blink
evaluate's); its NHWC figures are for a layout it never saw.
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
from blink.train.timm_cache import (  # noqa: E402
    GPU,
    PARAM_TOLERANCE,
    read_benchmark,
    select_models,
)

FILES = {"nchw": "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv.gz",
         "nhwc": "benchmark-infer-amp-nhwc-pt240-cu124-rtx3090.csv.gz"}
PREDICTORS = ("roofline", "analytic", "blink")
LAYOUT_MODES = {"nchw": "inference", "nhwc": "inference-nhwc"}  # blink.train.timm_cache modes
# timm maps old names of these benchmark files to their current ones, with a warning each.
warnings.filterwarnings("ignore", message="Mapping deprecated model name")


def predict(name: str, batch: int, img: int, layout: str) -> dict[str, float]:
    from blink.predict import predict_trace
    from blink.train.timm_cache import build_model

    # as the cache traces each file: the benchmark's timm settings (fast norm) and layout
    t, _ = build_model(name, batch, img, None, LAYOUT_MODES[layout])
    kw = {"allow_tf32_matmul": True, "allow_tf32_cudnn": True, "cudnn_benchmark": True,
          "host_time": "table"}
    a = predict_trace(t, GPU, predictor="analytic", **kw)
    b = predict_trace(t, GPU, predictor="auto", **kw)
    return {"roofline": a.lower_ms, "analytic": a.time_ms, "blink": b.time_ms,
            "blink_predictor": b.predictor}


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred / meas - 1.0) * 100.0


def cached_pairs() -> tuple[list[tuple], dict[str, dict[tuple, dict]]]:
    """(keys, {layout: {key: cached row}}) of the models cached in both layouts, key = (model,
    img_size, batch). As blink train and evaluate do, a row measured below its traced roofline
    timed another program than the trace (model_level.split_consistent): a model is kept only
    when both layouts pass."""
    from blink.hardware import get_gpu
    from blink.train.timm_cache import load_cache

    top = get_gpu(GPU).max_clock_ratio
    keyed = {lay: {(r["model"], r["img_size"], r["batch"]): r for r in load_cache(mode=mode)}
             for lay, mode in LAYOUT_MODES.items()}
    both = sorted(k for k in set(keyed["nchw"]) & set(keyed["nhwc"])
                  if all(d[k]["roofline_ms"] <= d[k]["measured_ms"] * top
                         for d in keyed.values()))
    return both, keyed


def cached() -> int:
    both, keyed = cached_pairs()
    print(f"timm-rtx3090, AMP fp16 inference, {len(both)} cached models in both layouts "
          f"(measured above the traced roofline in both), GPU {GPU}")
    print(f"{'layout':<7} {'predictor':<10} {'MAPE':>6} {'median':>7} {'p90':>6} "
          f"{'MAPE/roofline':>14} {'pred/meas':>10}")
    col = {"roofline": "roofline_ms", "analytic": "time_ms"}
    for lay, d in keyed.items():
        meas = np.array([d[k]["measured_ms"] for k in both])
        base = None
        for p, c in col.items():
            pred = np.array([d[k][c] for k in both])
            ape = _ape(pred, meas)
            base = base if base is not None else ape.mean()
            print(f"{lay:<7} {p:<10} {ape.mean():6.1f} {np.median(ape):7.1f} "
                  f"{np.quantile(ape, 0.9):6.1f} {ape.mean() / base:13.2f}x "
                  f"{np.median(pred / meas):10.3f}")
    ms = np.array([keyed["nchw"][k]["measured_ms"] / keyed["nhwc"][k]["measured_ms"] for k in both])
    ps = np.array([keyed["nchw"][k]["time_ms"] / keyed["nhwc"][k]["time_ms"] for k in both])
    agree = np.mean(np.sign(np.log(ps)) == np.sign(np.log(ms)))
    print(f"\nNHWC speed-up (NCHW ms / NHWC ms): measured median {np.median(ms):.3f}, analytic "
          f"{np.median(ps):.3f}; same direction {100 * agree:.0f}%, correlation of the logs "
          f"{np.corrcoef(np.log(ms), np.log(ps))[0, 1]:.2f}, MAPE of the predicted speed-up "
          f"{_ape(ps, ms).mean():.1f}%")
    conv = np.array([keyed["nchw"][k]["r_conv"] / keyed["nchw"][k]["roofline_ms"] for k in both])
    flat = conv < 0.02
    print(f"repeatability: {flat.sum()} models with convolutions under 2% of the roofline: "
          f"measured |NHWC/NCHW - 1| median {100 * np.median(np.abs(ms[flat] - 1)):.1f}%, "
          f"mean {100 * np.mean(np.abs(ms[flat] - 1)):.1f}% (analytic speed-up median "
          f"{np.median(ps[flat]):.3f})")
    fams: dict[str, list[int]] = {}
    for i, k in enumerate(both):
        fams.setdefault(keyed["nchw"][k]["family"], []).append(i)
    gap = sorted((float(np.mean(np.log(ps[ix] / ms[ix]))), f, ix) for f, ix in fams.items())
    print("families whose layout effect blink misses most (mean log(predicted / measured "
          "speed-up)):")
    print(f"  {'family':<16} {'n':>3} {'measured':>9} {'analytic':>9} {'log gap':>8}")
    for g, f, ix in gap[:8] + gap[-8:]:
        print(f"  {f:<16} {len(ix):>3} {np.median(ms[ix]):9.3f} {np.median(ps[ix]):9.3f} "
              f"{g:+8.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--cached", action="store_true",
                    help="all cached models, roofline and analytic (no tracing)")
    a = ap.parse_args()
    if a.cached:
        return cached()
    root = public_root() / "timm-rtx3090"
    rows = {k: read_benchmark(root / f) for k, f in FILES.items()}
    nhwc = {(r["model"], r["infer_img_size"], r["infer_batch_size"]): r for r in rows["nhwc"]}
    both = [r for r in rows["nchw"]
            if (r["model"], r["infer_img_size"], r["infer_batch_size"]) in nhwc]
    picked = select_models(both, a.models)
    t0 = time.time()
    got: dict[str, dict[str, list[float]]] = {k: {p: [] for p in (*PREDICTORS, "measured")}
                                             for k in FILES}
    used: set[str] = set()
    skipped = 0
    for r in picked:
        key = (r["model"], r["infer_img_size"], r["infer_batch_size"])
        bs, img = int(r["infer_batch_size"]), int(r["infer_img_size"])
        try:
            import timm
            import torch

            with torch.device("meta"):
                n = sum(p.numel() for p in timm.create_model(r["model"]).parameters())
            want = float(r["param_count"]) * 1e6
            if abs(n - want) > PARAM_TOLERANCE * want:
                skipped += 1
                continue
            out = {k: predict(r["model"], bs, img, k) for k in FILES}
        except Exception as exc:  # noqa: BLE001 - a model that cannot be rebuilt is skipped
            print(f"skip {r['model']}: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            skipped += 1
            continue
        for k, src in (("nchw", r), ("nhwc", nhwc[key])):
            got[k]["measured"].append(float(src["infer_step_time"]))
            for p in PREDICTORS:
                got[k][p].append(out[k][p])
            used.add(str(out[k]["blink_predictor"]))
    n = len(got["nchw"]["measured"])
    print(f"timm-rtx3090, AMP fp16 inference, {n} models in both layouts ({skipped} skipped), "
          f"GPU {GPU}, {time.time() - t0:.0f} s; blink = predictor {', '.join(sorted(used))}")
    print(f"{'layout':<7} {'predictor':<10} {'MAPE':>6} {'median':>7} {'p90':>6} "
          f"{'MAPE/roofline':>14}")
    for k in FILES:
        meas = np.array(got[k]["measured"])
        base = None
        for p in PREDICTORS:
            ape = np.abs(np.array(got[k][p]) - meas) / meas * 100
            base = base if base is not None else ape.mean()
            lab = k + ("*" if k == "nchw" and p == "blink" else "")
            print(f"{lab:<7} {p:<10} {ape.mean():6.1f} {np.median(ape):7.1f} "
                  f"{np.quantile(ape, 0.9):6.1f} {ape.mean() / base:13.2f}x")
    print("* in-sample: the shipped GNN was fitted on these NCHW rows")
    m = np.array(got["nchw"]["measured"]) / np.array(got["nhwc"]["measured"])
    print(f"\nNHWC speed-up over NCHW (NCHW ms / NHWC ms), median over models: measured "
          f"{np.median(m):.3f}", end="")
    for p in PREDICTORS[1:]:
        s = np.array(got["nchw"][p]) / np.array(got["nhwc"][p])
        agree = np.mean(np.sign(np.log(s)) == np.sign(np.log(m)))
        print(f", {p} {np.median(s):.3f} (same direction as measured for {100 * agree:.0f}%)",
              end="")
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
