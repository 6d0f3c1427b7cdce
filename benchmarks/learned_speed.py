"""Speed of the learned predictors: the C++ forest evaluator against xgboost's own predict, and
what per-unit trees and the GNN add to blink.predict_trace, as ratios.

    .venv/bin/python benchmarks/learned_speed.py [--models DIR] [--repeats 5]

Part 1 trains one forest here (300 trees, depth 6, 40 features, NaNs) and predicts 100k rows:
blink._C.Forest.predict (one thread) vs xgboost DMatrix + predict and inplace_predict, both
nthread=1. Part 2 costs the benchmark traces (traced once, not timed) with predictor="analytic",
with the forests of --models (default: forests for every unit kind trained here on the traces'
own rows, 100 trees depth 6, all inputs) and with a random-weight GNN added.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import CASES, median_seconds

import blink
from blink import gnn, learned
from blink.predict import predict_trace


def forest_table(repeats: int) -> None:
    import xgboost as xgb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 40))
    y = np.sin(x[:, 0]) + x[:, 1] * (x[:, 2] > 0) + 0.1 * rng.normal(size=len(x))
    x[rng.random(x.shape) < 0.1] = np.nan
    b = xgb.train({"max_depth": 6, "eta": 0.1, "nthread": 1}, xgb.DMatrix(x, y), 300)
    with tempfile.TemporaryDirectory() as d:
        b.save_model(os.path.join(d, "m.json"))
        f = blink._C.load_forest(os.path.join(d, "m.json"))
    rows = rng.normal(size=(100000, 40))
    rows[rng.random(rows.shape) < 0.1] = np.nan
    b.set_param({"nthread": 1})
    t_ours = median_seconds(lambda: f.predict(rows), repeats)
    t_dm = median_seconds(lambda: b.predict(xgb.DMatrix(rows, nthread=1)), repeats)
    t_in = median_seconds(lambda: b.inplace_predict(rows), repeats)
    err = np.abs(np.array(f.predict(rows)) - b.predict(xgb.DMatrix(rows))).max()
    print(f"forest: {f.num_trees} trees, {f.num_nodes} nodes; 100k rows x 40 features, one thread; "
          f"max |ours - xgboost| = {err:.1e}")
    hdr = f"{'evaluator':<34} {'ms':>8} {'Mrows/s':>8} {'ours/this':>10}"
    print(hdr)
    print("-" * len(hdr))
    for name, t in (("blink._C.Forest.predict", t_ours), ("xgboost DMatrix + predict", t_dm),
                    ("xgboost inplace_predict", t_in)):
        print(f"{name:<34} {t * 1e3:>8.1f} {len(rows) / t / 1e6:>8.2f} {t_ours / t:>9.2f}x")
    print()


def synthetic_models(d: Path, traces: list, gpu: str) -> None:
    """Forests for every unit kind on the traces' own rows (random targets), a random GNN."""
    import xgboost as xgb

    names = learned.input_names()
    by_kind: dict[str, list] = {}
    for t in traces:
        r = learned.trace_input_rows(t, gpu)
        for k, row in zip(r["kind"], r["rows"], strict=True):
            by_kind.setdefault(k, []).append(row)
    rng = np.random.default_rng(0)
    card = {"format_version": 1, "feature_schema_version": 1, "forests": {},
            "gnn": {"file": "gnn.safetensors"}}
    for k, rows in by_kind.items():
        x = np.array(rows)
        b = xgb.train({"max_depth": 6, "nthread": 1}, xgb.DMatrix(x, rng.normal(size=len(x))), 100)
        b.save_model(str(d / f"forest_{k}.json"))
        card["forests"][k] = {"file": f"forest_{k}.json", "target": "log_ratio",
                              "features": names, "clip": [-1.0, 1.0]}
    torch.manual_seed(0)
    gnn.save(gnn.UnitGNN(hidden=32, layers=2, clip=(-0.5, 0.5)), d / "gnn.safetensors")
    (d / "card.json").write_text(json.dumps(card))


def predict_table(models: str | None, repeats: int, gpu: str) -> None:
    traces = [(name, mode, blink.trace_model(name, mode=mode, **kw))
              for name, kw in CASES for mode in ("inference", "train")]
    tmp = tempfile.TemporaryDirectory()
    if models is None:
        models = tmp.name
        synthetic_models(Path(models), [t for _n, _m, t in traces], gpu)
    d = Path(models)
    card = json.loads((d / "card.json").read_text())
    tmp2 = tempfile.TemporaryDirectory()
    no_gnn = Path(tmp2.name)
    for f in d.iterdir():
        if f.name != "card.json" and not f.name.startswith("gnn"):
            (no_gnn / f.name).write_bytes(f.read_bytes())
    card.pop("gnn", None)
    (no_gnn / "card.json").write_text(json.dumps(card))
    print(f"predict_trace on {gpu}, median of {repeats}; models: {d}")
    hdr = (f"{'model':<22} {'mode':<10} {'units':>6} {'analytic ms':>12} {'+trees ms':>10} "
           f"{'+gnn ms':>8} {'trees/analytic':>15} {'(trees+gnn)/analytic':>21}")
    print(hdr)
    print("-" * len(hdr))
    for name, mode, t in traces:
        os.environ["BLINK_MODELS_DIR"] = str(no_gnn)
        ta = median_seconds(lambda t=t: predict_trace(t, gpu, predictor="analytic"), repeats)
        tt = median_seconds(lambda t=t: predict_trace(t, gpu), repeats)
        os.environ["BLINK_MODELS_DIR"] = str(d)
        tg = median_seconds(lambda t=t: predict_trace(t, gpu), repeats)
        p = predict_trace(t, gpu)
        print(f"{name:<22} {mode:<10} {len(p.units):>6} {ta * 1e3:>12.1f} {tt * 1e3:>10.1f} "
              f"{tg * 1e3:>8.1f} {tt / ta:>14.2f}x {tg / ta:>20.2f}x", flush=True)
    tmp.cleanup()
    tmp2.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None, help="a models/ directory (default: synthetic)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu", default="H200")
    a = ap.parse_args()
    forest_table(a.repeats)
    predict_table(a.models, a.repeats, a.gpu)


if __name__ == "__main__":
    main()
