"""`blink train`: public data -> models/ (forests, conformal table, card.json).

One command, deterministic (fixed seeds, nthread=2), re-runnable after any cost-model change:
the features and the analytic time every target is relative to come from the C++ core of the
tree being trained.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import model_level as ml
from .data import (
    MATH_MODES,
    dataset_files,
    load_units,
    public_root,
    sha256_file,
    tables_by_kind,
)
from .fit import CLIP, FOREST_PARAMS, NUM_ROUNDS, conformal_q, fit_forest, metrics, xgb
from .timm_cache import default_cache_path, load_cache
from .units import MIN_ROWS, logo

__all__ = ["CARD_FORMAT_VERSION", "COVERAGE", "FEATURE_SCHEMA_VERSION", "train"]

CARD_FORMAT_VERSION = 1
FEATURE_SCHEMA_VERSION = 1
COVERAGE = 0.9


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_models_dir() -> Path:
    return repo_root() / "models"


def _rel(p: Path, root: Path, prefix: str = "") -> str:
    try:
        return prefix + str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)


def _r(x: float, nd: int = 4) -> float | None:
    return None if not math.isfinite(x) else round(float(x), nd)


def _m(d: dict[str, float]) -> dict[str, Any]:
    return {k: (_r(v) if isinstance(v, float) else v) for k, v in d.items()}


def train(data: str | Path | None = None, out: str | Path | None = None, *,
          neusight_rows_per_file: int | None = 6000, neusight_mixed_rows: int | None = None,
          rounds: int = NUM_ROUNDS,
          timm_cache: str | Path | None = None, command: str = "blink train",
          log: Any = sys.stderr) -> dict[str, Any]:
    """Fit every forest and the conformal table; write models/ and return the card."""
    t_start = time.time()
    root = public_root(data)
    out_dir = Path(out) if out is not None else default_models_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("forest_*.json"):  # a kind that is no longer shipped leaves none
        stale.unlink()
    xgb_mod = xgb()

    def say(msg: str) -> None:
        if log is not None:
            print(f"[{time.time() - t_start:6.1f}s] {msg}", file=log)

    rows = load_units(root, neusight_rows_per_file=neusight_rows_per_file,
                      neusight_mixed_rows=neusight_mixed_rows)
    tables = tables_by_kind(rows)
    say(f"{len(rows)} unit rows: " + ", ".join(f"{k} {len(t)}" for k, t in tables.items()))

    forests: dict[str, Any] = {}
    not_shipped: dict[str, Any] = {}
    conformal_units: dict[str, Any] = {}
    for kind, t in tables.items():
        chips = sorted(set(t.chip.tolist()))
        if len(t) < MIN_ROWS or len(chips) < 2:
            say(f"{kind}: {len(t)} rows on {len(chips)} GPU(s): stays analytic")
            continue
        lg = logo(t, rounds=rounds)
        ana_mape = metrics(t.analytic_s, t.measured_s)["mape"]
        tree_mape = metrics(lg.pred_s, t.measured_s)["mape"]
        if not tree_mape < ana_mape:
            # Shipped only where the trees beat the analytic model on GPUs they never saw.
            say(f"{kind}: LOGO MAPE trees {tree_mape:.1f}% >= analytic {ana_mape:.1f}%: "
                "not shipped, stays analytic")
            not_shipped[kind] = {"rows": len(t), "analytic_mape": _r(ana_mape, 3),
                                 "trees_mape": _r(tree_mape, 3),
                                 "split": "leave-one-GPU-out (chips)"}
            continue
        f = fit_forest(t, rounds=rounds)
        fname = f"forest_{kind}.json"
        f.booster.save_model(str(out_dir / fname))
        r = np.abs(lg.log_residuals(t))
        q = conformal_q(r, COVERAGE)
        conformal_units[kind] = {"q": _r(q, 6), "n": int(r.size)}
        per_chip = {}
        for c in chips:
            m = t.chip == c
            per_chip[c] = {"analytic": _m(metrics(t.analytic_s[m], t.measured_s[m])),
                           "trees": _m(metrics(lg.pred_s[m], t.measured_s[m]))}
        forests[kind] = {
            "file": fname, "target": "log_ratio", "features": list(t.features),
            "clip": list(CLIP), "gpus": sorted(set(t.gpu.tolist())), "rows": len(t),
            # what the trees saw: a unit outside these is an extrapolation (predict may prefer
            # the analytic time there)
            "math_modes": _math_modes(t),
            "datasets": sorted(set(t.dataset.tolist())),
            "families": sorted(set(t.family.tolist())),
            "params": _params(FOREST_PARAMS, rounds),
            "metrics": {"split": "leave-one-GPU-out (chips)",
                        "analytic": _m(metrics(t.analytic_s, t.measured_s)),
                        "trees": _m(metrics(lg.pred_s, t.measured_s, q)),
                        "by_held_out_gpu": per_chip},
        }
        say(f"{kind}: {len(t)} rows, {len(chips)} GPUs, LOGO MAPE analytic "
            f"{forests[kind]['metrics']['analytic']['mape']:.1f}% -> trees "
            f"{forests[kind]['metrics']['trees']['mape']:.1f}%, q={q:.3f}")

    # Model level (timm-rtx3090 through the cached blink predictions).
    cache = Path(timm_cache) if timm_cache is not None else default_cache_path()
    model_card: dict[str, Any] | None = None
    conformal_model: dict[str, Any] = {}
    cache_info: dict[str, Any] | None = None
    if cache.is_file():
        mt = ml.table(load_cache(cache))
        allrows = np.ones(len(mt), dtype=bool)
        booster = ml.fit_correction(mt)
        booster.save_model(str(out_dir / "forest_model.json"))
        p_corr = ml.oof(mt, "correction", allrows)
        r_corr = np.abs(np.log(mt.measured_ms / p_corr))
        r_ana = np.abs(np.log(mt.measured_ms / mt.analytic_ms))
        q_corr = conformal_q(r_corr, COVERAGE)
        q_ana = conformal_q(r_ana, COVERAGE)
        conformal_model = {
            "q": _r(q_ana, 6), "n": len(mt), "predictor": "analytic (blink.predict time_ms)",
            "model_level": {"q": _r(q_corr, 6), "n": len(mt),
                            "predictor": "model-level correction (forest_model.json)",
                            "calibration": "out-of-fold over 5 held-out-family folds"},
        }
        model_card = {
            "file": "forest_model.json", "target": "log_ratio",
            "features": list(ml.CORRECTION_FEATURES), "clip": list(CLIP),
            "feature_definitions": {
                "log_*": "natural log of the Prediction's field (ms, FLOP, bytes, params)",
                "log_analytic_ms": "time_ms", "log_roofline_ms": "sum of units' roofline_ms",
                "log_host_ms": "host_ms", "gpu_bound": "gpu_busy_ms >= host_ms",
                "share_<kind>": "sum of the kind's units' time_ms / sum of all units' time_ms",
                "eff_<kind>": "sum of the kind's roofline_ms / sum of its time_ms (NaN if 0)",
                "n_units": "number of units", "batch": "batch size", "img_size": "input side"},
            "applies_to": {"gpus": ["RTX3090"], "dtype": "amp-fp16", "mode": "inference",
                           "models": "timm image classifiers"},
            "params": _params(ml.MODEL_PARAMS, ml.MODEL_ROUNDS),
            "rows": len(mt),
            "metrics": {"split": "5 folds of held-out timm families",
                        "analytic": _m(metrics(mt.analytic_ms, mt.measured_ms, q_ana)),
                        "correction": _m(metrics(p_corr, mt.measured_ms, q_corr))},
        }
        prov = cache.with_suffix("").with_suffix(".provenance.json")
        cache_info = {"path": _rel(cache, repo_root()), "sha256": sha256_file(cache),
                      "provenance": json.loads(prov.read_text()) if prov.is_file() else None}
        say(f"model level: {len(mt)} timm models, held-out-family MAPE analytic "
            f"{model_card['metrics']['analytic']['mape']:.1f}% -> correction "
            f"{model_card['metrics']['correction']['mape']:.1f}%")
    else:
        say(f"{cache}: no timm cache, model level skipped "
            "(python -m blink.train.timm_cache creates it)")

    conformal = {
        "format_version": 1, "method": "split-conformal (absolute log-ratio residuals)",
        "coverage": COVERAGE,
        "calibration": "per unit kind: leave-one-GPU-out residuals (each calibration row "
                       "predicted by a forest that never saw its GPU chip); model: timm-rtx3090 "
                       "residuals (analytic: unfitted; model_level: out-of-fold over held-out "
                       "families)",
        "unit": conformal_units,
    }
    if conformal_model:
        conformal["model"] = conformal_model
    _write_json(out_dir / "conformal.json", conformal)

    files = dataset_files(root)
    used = {"neusight-train": "neusight-train", "deepbench": "deepbench"}
    datasets = []
    for name, paths in files.items():
        if name == "timm-rtx3090" and model_card is None:
            continue
        n = (sum(int((t.dataset == used[name]).sum()) for t in tables.values())
             if name in used else (model_card or {}).get("rows", 0))
        datasets.append({"name": name, "rows": n,
                         "files": [{"path": _rel(p, root, "shared/data/public/"),
                                    "sha256": sha256_file(p)} for p in paths]})
    card: dict[str, Any] = {
        "format_version": CARD_FORMAT_VERSION,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "blink_version": _blink_version(), "command": command,
        "xgboost_version": xgb_mod.__version__,
        "datasets": datasets,
        "feature_encoding": {
            "source": "blink::feature_values(UnitFeatures) + analytic_time_s + GPU fields",
            "bools": "0.0 / 1.0", "math_mode": "blink::MathMode enum index "
            f"({', '.join(f'{i}={m}' for i, m in enumerate(MATH_MODES))})",
            "gpu_cc": "10 * major + minor", "gpu_clock_hz": "GpuSpec.clock_hz (boost clock)",
            "missing": "NaN (XGBoost default direction); absent GPU peaks are 0.0 as in GpuSpec",
            "prediction": "time_s = analytic_time_s * exp(clip(margin, clip[0], clip[1]))"},
        "forests": forests,
        "forests_not_shipped": not_shipped,
        "conformal": {"file": "conformal.json"},
        "splits": {
            "unit": "leave-one-GPU-out over GPU chips (V100 PCIe and SXM2 are one chip); "
                    "NeuSight bmm/linear sampled to "
                    f"{neusight_rows_per_file} rows per GPU file, elem/ln/softmax files to "
                    f"{neusight_mixed_rows or 'all'} rows (random.Random(0))",
            "model": "5 folds of whole timm name families (group_folds, largest first)",
        },
        "metrics": {k: v["metrics"]["trees"] for k, v in forests.items()},
    }
    if model_card is not None:
        card["model_level"] = model_card
        card["timm_cache"] = cache_info
        card["metrics"]["model_level"] = model_card["metrics"]["correction"]
    # The created stamp is the only run-dependent field; everything else is a function of the
    # data, the code and the seeds.
    _write_json(out_dir / "card.json", card)
    say(f"wrote {out_dir} ({sum(p.stat().st_size for p in out_dir.iterdir()) / 1e6:.2f} MB) "
        f"in {time.time() - t_start:.0f}s")
    return card


def _math_modes(t: Any) -> list[str]:
    return list(t.meta.get("math_modes", []))


def _params(p: dict[str, Any], rounds: int) -> dict[str, Any]:
    # nthread is a speed setting (the trees are the same bytes for any thread count).
    return {**{k: v for k, v in p.items() if k != "nthread"}, "num_boost_round": rounds}


def _blink_version() -> str:
    from .. import __version__
    from .timm_cache import _git_commit

    return f"{__version__} ({_git_commit()})"


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")
