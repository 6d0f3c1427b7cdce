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

from ..hardware import get_gpu
from ..learned import blend_ms
from . import model_level as ml
from .data import (
    NEUSIGHT_FLOOR_KEEP,
    dataset_files,
    load_units,
    public_root,
    sha256_file,
    tables_by_kind,
)
from .fit import (
    CLIP,
    FOREST_PARAMS,
    NUM_ROUNDS,
    chip_medians,
    conformal_q,
    fit_forest,
    medians_by_chip,
    metrics,
    xgb,
)
from .timm_cache import GPU as TIMM_GPU
from .timm_cache import default_cache_path, load_cache
from .timm_graphs import GraphWriter, default_graphs_path, load_graphs
from .units import (
    MIN_DATASET_ROWS,
    MIN_ROWS,
    PairForests,
    cc_major_range,
    logo,
    nested_shrink,
)

__all__ = ["CARD_FORMAT_VERSION", "COVERAGE", "FEATURE_SCHEMA_VERSION", "train"]

CARD_FORMAT_VERSION = 1
FEATURE_SCHEMA_VERSION = 1
COVERAGE = 0.9
# Where the GNN applies, predict's time is trees+gnn^w x model_level^(1 - w): equal weights, as
# the two are about equally good alone (11.0% and 10.9% held-out-family MAPE). 0.3 and 0.7 were
# also looked at on the same folds (9.9% and 10.1% against 9.7%), so the blend's held-out
# figure is slightly optimistic for this one choice.
BLEND_WEIGHT_GNN = 0.5
# A forest ships only if its held-out-GPU MAPE is this fraction below the analytic model's: a
# forest shrunk to a sliver of its correction (choose_scale's smallest values) that wins by
# hundredths of a point is noise, not a model.
MIN_GAIN = 0.02
# Data sets whose rows time an op as PyTorch runs it (ATen's dispatch, its cuDNN / cuBLAS calls
# and algorithm choice, the neighbouring kernels' state of the caches). DeepBench calls cuDNN and
# cuBLAS directly from its own harness, with the libraries of 2016-19, timing one kernel in a
# loop: a forest fitted on it alone learns that harness and its software. The conv forest, all
# of whose rows are DeepBench's, showed it: it beat the analytic model on DeepBench's held-out
# GPUs (20.3% against 31.2% MAPE) yet made every whole-model time measured in PyTorch worse, on
# the RTX 3090's 60 most conv-heavy timm models (benchmarks/conv_forest_extrapolation.py: 6.1%
# against 5.3%) and in NVIDIA's published ResNet-50 / SE-ResNeXt / EfficientNet inference tables
# on the V100 and the T4, boards it was fitted on (benchmarks/models_published.py, 33 GPU-bound
# rows: 8.3% against 6.2% MAPE; it cut ResNet-50's conv time on the T4 by 19% where the analytic
# time was within 3% of the measured). So a forest ships only if some of its rows were measured
# in PyTorch; it is fitted and judged (blink evaluate) either way. (Figures of the engine that
# decided it; since the FP32 Winograd reduction, kWinogradFlopReduction, the conv forest scores
# 20.8% against 29.2% held out and 5.2% against 5.3% on the timm models.)
PYTORCH_DATASETS = frozenset({"neusight-train"})


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


# The whole-model intervals are calibrated on one GPU's models (the RTX 3090's timm times). On
# any other GPU the prediction also carries that board's own level error: its clocks, power cap,
# memory system and software put its kernels off the analytic model by a board-wide factor the
# RTX 3090's residuals do not contain. The per-unit rows are the only measurements of many
# boards, so they give its spread: each GPU chip's median log(measured / analytic) over all its
# unit rows, less the median over chips (the common level is what the whole-model residuals
# already calibrate). On a GPU outside the calibration the interval is the conformal quantile of
# |r + o| over every pair of a whole-model residual r and a chip offset o, the two taken as
# independent. Not fitted to any whole-model row of another GPU; checked on NVIDIA's published
# V100 / T4 / A100 tables (benchmarks/models_published.py).


def chip_level_offsets(tables: dict[str, Any]) -> dict[str, float]:
    """Each chip's median log(measured / analytic) over its unit rows of every kind, less the
    median of those over the chips."""
    med = medians_by_chip(np.concatenate([t.y for t in tables.values()]),
                          np.concatenate([t.chip for t in tables.values()]))
    mid = float(np.median(list(med.values())))
    return {c: v - mid for c, v in med.items()}


def other_gpu_q(log_residuals: np.ndarray, offsets: dict[str, float]) -> float:
    """The conformal quantile of |r + o| over every (whole-model residual r, chip offset o)."""
    r = np.asarray(log_residuals, dtype=np.float64)
    o = np.array(list(offsets.values()), dtype=np.float64)
    return conformal_q(np.abs((r[:, None] + o[None, :]).ravel()), COVERAGE)


def _other_gpu_entry(offsets: dict[str, float]) -> dict[str, Any]:
    # predict names GPUs by their hardware-table name (the timm cache's alias resolves to it)
    return {"calibrated_on": [get_gpu(TIMM_GPU).name],
            "chip_offsets": {c: _r(v, 4) for c, v in offsets.items()},
            "calibration": "on a GPU outside calibrated_on, q_other_gpu: the conformal "
                           "quantile of |r + o| over the whole-model residuals r and the "
                           "per-unit rows' board-level offsets o (each chip's median "
                           "log(measured / analytic), centred; blink.train.pipeline."
                           "chip_level_offsets)"}


def _m(d: dict[str, float]) -> dict[str, Any]:
    return {k: (_r(v) if isinstance(v, float) else v) for k, v in d.items()}


def train(data: str | Path | None = None, out: str | Path | None = None, *,
          neusight_rows_per_file: int | None = 6000, neusight_mixed_rows: int | None = None,
          rounds: int = NUM_ROUNDS,
          timm_cache: str | Path | None = None, timm_graphs: str | Path | None = None,
          timm_train_cache: str | Path | None = None,
          refresh_timm: bool = False, command: str = "blink train",
          log: Any = sys.stderr) -> dict[str, Any]:
    """Fit every forest, the end-to-end GNN and the conformal table; write models/ and return
    the card. refresh_timm: re-trace the timm models (the model-level cache, then the graphs
    with the forests just fitted) before the model-level fits."""
    t_start = time.time()
    root = public_root(data)
    out_dir = Path(out) if out is not None else default_models_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    # A kind (or GNN) that is no longer shipped leaves no file behind.
    for stale in [*out_dir.glob("forest_*.json"), *out_dir.glob("gnn*.safetensors")]:
        stale.unlink()
    xgb_mod = xgb()

    def say(msg: str) -> None:
        if log is not None:
            print(f"[{time.time() - t_start:6.1f}s] {msg}", file=log)

    floors: dict[tuple[str, str], float] = {}
    rows = load_units(root, neusight_rows_per_file=neusight_rows_per_file,
                      neusight_mixed_rows=neusight_mixed_rows, floors=floors)
    tables = tables_by_kind(rows)
    say(f"{len(rows)} unit rows: " + ", ".join(f"{k} {len(t)}" for k, t in tables.items()))
    offsets = chip_level_offsets(tables)

    forests: dict[str, Any] = {}
    not_shipped: dict[str, Any] = {}
    conformal_units: dict[str, Any] = {}
    for kind, t in tables.items():
        chips = sorted(set(t.chip.tolist()))
        if len(t) < MIN_ROWS or len(chips) < 2:
            say(f"{kind}: {len(t)} rows on {len(chips)} GPU(s): stays analytic")
            continue
        # The shrinkage is chosen on the held-out-GPU predictions (one number per kind), and
        # kept only if choosing it without the held-out GPU (nested_shrink) beats the whole
        # forest; the ship rule below judges those nested times, which never used their GPU.
        lg = logo(t, rounds=rounds, scale=None)
        ns = nested_shrink(t, lg, PairForests(t, rounds))
        if not ns.shrinks:
            lg.scale = 1.0
        lg.pred_s = ns.trees_s
        ana_mape = metrics(t.analytic_s, t.measured_s)["mape"]
        # Judged twice: as predict runs the forest (analytic on a held-out chip of a generation
        # its fold never saw) and applied everywhere. The second is the transfer test the gate
        # would otherwise hide: a forest fitted on sm_6x-7x that hurts the held-out sm_80 chip
        # must not ship with a range that reaches sm_8x because the full fit saw that chip.
        variants = {"trees": lg.pred_s, "trees_every_generation": ns.trees_ungated_s}
        tree_mape = max(metrics(v, t.measured_s)["mape"] for v in variants.values())
        by_ds = {}
        for ds in sorted(set(t.dataset.tolist())):
            m = t.dataset == ds
            if m.sum() >= MIN_DATASET_ROWS:
                by_ds[ds] = {"analytic": _m(metrics(t.analytic_s[m], t.measured_s[m]))}
                for name, v in variants.items():
                    by_ds[ds][name] = _m(metrics(v[m], t.measured_s[m]))
        worse = [ds for ds, d in by_ds.items()
                 if not max(d[n]["mape"] for n in variants) < d["analytic"]["mape"]]
        gains = tree_mape < (1.0 - MIN_GAIN) * ana_mape
        in_pytorch = bool(set(t.dataset.tolist()) & PYTORCH_DATASETS)
        if not gains or worse or not in_pytorch:
            # Shipped only where the trees beat the analytic model on GPUs they never saw, by
            # MIN_GAIN overall and in every data set they learned from (one set's protocol or
            # software must not win by outnumbering another's), gated and applied everywhere.
            if not gains:
                why = (f"LOGO MAPE trees {tree_mape:.2f}% (the worse of gated and every "
                       f"generation) is not {100 * MIN_GAIN:g}% below "
                       f"analytic {ana_mape:.2f}% (scale {lg.scale:g})")
            elif worse:
                why = "worse than analytic on held-out GPUs of " + ", ".join(
                    f"{ds} ({max(by_ds[ds][n]['mape'] for n in variants):.1f}% vs "
                    f"{by_ds[ds]['analytic']['mape']:.1f}%)" for ds in worse)
            else:
                why = (f"LOGO MAPE trees {tree_mape:.2f}% against analytic {ana_mape:.2f}%, "
                       f"but fitted only on {', '.join(sorted(set(t.dataset.tolist())))}, "
                       f"none of it measured in PyTorch (PYTORCH_DATASETS)")
            say(f"{kind}: {why}: not shipped, stays analytic")
            not_shipped[kind] = {"rows": len(t), "analytic_mape": _r(ana_mape, 3),
                                 "trees_mape": _r(tree_mape, 3), "scale": lg.scale, "why": why,
                                 "datasets": sorted(set(t.dataset.tolist())),
                                 "by_dataset": by_ds,
                                 "split": "leave-one-GPU-out (chips)"}
            continue
        f = fit_forest(t, rounds=rounds)
        f.scale = lg.scale
        fname = f"forest_{kind}.json"
        f.booster.save_model(str(out_dir / fname))
        # Per-unit intervals go only to units a forest timed: calibrated on those rows.
        r = np.abs(lg.log_residuals(t))[~lg.gated]
        q = conformal_q(r, COVERAGE)
        conformal_units[kind] = {"q": _r(q, 6), "n": int(r.size)}
        per_chip = {}
        for c in chips:
            m = t.chip == c
            per_chip[c] = {"analytic": _m(metrics(t.analytic_s[m], t.measured_s[m])),
                           "trees": _m(metrics(lg.pred_s[m], t.measured_s[m]))}
        forests[kind] = {
            "file": fname, "target": "log_ratio", "features": list(t.features),
            # what the trees were fitted on (predict applies p the same way either way)
            "fit_target": "log(measured / analytic) less each training GPU chip's median "
                          "(blink.train.fit.centred_by_chip)",
            "training_chip_medians": {c: _r(v, 4) for c, v in chip_medians(t).items()},
            "clip": list(CLIP), "scale": lg.scale,
            "scale_choice": "lowest leave-one-GPU-out MAPE of analytic x exp(clip(scale x p)) "
                            "over 0.05 .. 1 with every data set better than analytic; 1 where "
                            "that choice, made without each held-out GPU, loses to 1 there",
            "scales_nested": ns.scales,
            "gpus": sorted(set(t.gpu.tolist())), "rows": len(t),
            # predict leaves the kind analytic on a GPU generation outside these (unless a GNN
            # trained on this forest's output applies there): blink::UnitModel::cc_major_lo
            "cc_major_range": list(cc_major_range(t)),
            # what the trees saw: a unit outside these is an extrapolation (predict may prefer
            # the analytic time there)
            "math_modes": _math_modes(t),
            "datasets": sorted(set(t.dataset.tolist())),
            "families": sorted(set(t.family.tolist())),
            # predict applies the forest to these ops only (blink::UnitModel::ops)
            "ops": list(t.meta.get("ops", [])),
            "params": _params(FOREST_PARAMS, rounds),
            "metrics": {"split": "leave-one-GPU-out (chips)",
                        "analytic": _m(metrics(t.analytic_s, t.measured_s)),
                        "trees": _m(metrics(lg.pred_s, t.measured_s, q)),
                        "trees_scale_1": _m(metrics(ns.whole_s, t.measured_s)),
                        # every forest applied, gated rows included (the ship rule's other half)
                        "trees_every_generation": _m(metrics(ns.trees_ungated_s, t.measured_s)),
                        "by_dataset": by_ds, "by_held_out_gpu": per_chip},
        }
        say(f"{kind}: {len(t)} rows, {len(chips)} GPUs, LOGO MAPE analytic "
            f"{forests[kind]['metrics']['analytic']['mape']:.1f}% -> trees "
            f"{forests[kind]['metrics']['trees']['mape']:.1f}% (scale {lg.scale:g}; at 1: "
            f"{forests[kind]['metrics']['trees_scale_1']['mape']:.1f}%), q={q:.3f}")

    # Model level (timm-rtx3090 through the cached blink predictions).
    cache = Path(timm_cache) if timm_cache is not None else default_cache_path()
    graphs = Path(timm_graphs) if timm_graphs is not None else default_graphs_path()
    train_cache = (Path(timm_train_cache) if timm_train_cache is not None
                   else default_cache_path("train"))
    if refresh_timm:
        from .timm_cache import build_cache

        # The graphs' trees variant needs the forests of this run: write a card for them first.
        _write_json(out_dir / "card.json", _forests_card(forests))
        say("re-tracing the timm models (model-level cache and unit graphs, with the forests "
            "just fitted)")
        writer = GraphWriter(out_dir, forests)
        build_cache(root, cache, on_trace=writer.add)
        writer.write(graphs, cache, command)
        say("re-tracing the timm training steps (training-step cache)")
        build_cache(root, train_cache, mode="train")
    model_card: dict[str, Any] | None = None
    conformal_model: dict[str, Any] = {}
    cache_info: dict[str, Any] | None = None
    if cache.is_file():
        mt, excluded = ml.consistent_table(load_cache(cache))
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
            "q_other_gpu": _r(other_gpu_q(np.log(mt.measured_ms / mt.analytic_ms), offsets), 6),
            "other_gpu": _other_gpu_entry(offsets),
            "model_level": {"q": _r(q_corr, 6), "n": len(mt),
                            "predictor": "model-level correction (forest_model.json)",
                            "calibration": "out-of-fold over 5 held-out-family folds"},
        }
        model_card = {
            "file": "forest_model.json", "sha256": sha256_file(out_dir / "forest_model.json"),
            "target": "log_ratio",
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
            "rows": len(mt), "excluded": _excluded(excluded),
            "left_out_of_fit": _beyond_bound(mt),
            "metrics": {"split": "5 folds of held-out timm families",
                        "analytic": _m(metrics(mt.analytic_ms, mt.measured_ms, q_ana)),
                        "correction": _m(metrics(p_corr, mt.measured_ms, q_corr))},
        }
        cache_info = _cache_info(cache)
        if excluded:
            say(f"model level: {len(excluded)} timm rows excluded (measured below the traced "
                "program's roofline: " + ", ".join(sorted({r['model'] for r in excluded})) + ")")
        say(f"model level: {len(mt)} timm models, held-out-family MAPE analytic "
            f"{model_card['metrics']['analytic']['mape']:.1f}% -> correction "
            f"{model_card['metrics']['correction']['mape']:.1f}%")
    else:
        say(f"{cache}: no timm cache, model level skipped "
            "(python -m blink.train.timm_cache creates it)")

    # The end-to-end GNN, on the graphs of the same timm models.
    gnn_card: dict[str, Any] | None = None
    if model_card is not None:
        gnn_card = _train_gnn(out_dir, graphs, forests, mt, conformal_model, say, p_corr,
                              offsets=offsets)

    # The training-step correction, on the timm training file's steps.
    train_card, conformal_train = _train_steps(out_dir, train_cache, say, offsets)

    conformal = {
        "format_version": 1, "method": "split-conformal (absolute log-ratio residuals)",
        "coverage": COVERAGE,
        "calibration": "per unit kind: leave-one-GPU-out residuals (each calibration row "
                       "predicted by a forest that never saw its GPU chip); model: timm-rtx3090 "
                       "residuals of the predictor that made the time (analytic and trees: "
                       "unfitted on timm; trees+gnn and model_level: out-of-fold over held-out "
                       "families)",
        "unit": conformal_units,
    }
    if conformal_model:
        conformal["model"] = conformal_model
    if conformal_train:
        conformal["model_train"] = conformal_train
    _write_json(out_dir / "conformal.json", conformal)

    files = dataset_files(root)
    used = {"neusight-train": "neusight-train", "deepbench": "deepbench"}
    datasets = []
    for name, paths in files.items():
        if name == "timm-rtx3090" and model_card is None:
            continue
        n = (sum(int((t.dataset == used[name]).sum()) for t in tables.values())
             if name in used else (model_card or {}).get("rows", 0)
             + (train_card or {}).get("rows", 0))
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
            "bools": "0.0 / 1.0",
            "tensor_core": "1.0 where the unit's math mode runs on tensor cores (tf32, 3xtf32, "
            "bf16_tc, fp16_tc, fp8_tc), else 0.0: the forests' precision input; dtype and "
            "math_mode are not forest inputs (blink.train.data._NOT_FOREST_INPUTS)",
            "gpu_cc": "10 * major + minor", "gpu_clock_hz": "GpuSpec.clock_hz (boost clock)",
            "missing": "NaN (XGBoost default direction); absent GPU peaks are 0.0 as in GpuSpec",
            "prediction": "time_s = analytic_time_s * exp(clip(margin, clip[0], clip[1]))"},
        "forests": forests,
        "forests_not_shipped": not_shipped,
        "neusight_floor_us": {f"{g}:{fam}": _r(f * 1e6, 3)
                              for (g, fam), f in sorted(floors.items())},
        "neusight_floor": "NeuSight rows are kernel times: each GPU's CUDA-event floor (above, "
                          "blink.train.data.neusight_floors) taken off, rows under "
                          f"{NEUSIGHT_FLOOR_KEEP:g}x the floor dropped",
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
    if gnn_card is not None and gnn_card.get("file"):
        card["gnn"] = gnn_card
        card["metrics"]["trees+gnn"] = gnn_card["metrics"]["trees+gnn"]
        if "blend" in gnn_card:
            card["metrics"]["trees+gnn+model"] = gnn_card["metrics"]["trees+gnn+model"]
    elif gnn_card is not None:
        card["gnn_not_shipped"] = gnn_card
    if model_card is not None:
        card["model_level"] = model_card
        card["timm_cache"] = cache_info
        card["metrics"]["model_level"] = model_card["metrics"]["correction"]
    if train_card is not None and train_card.get("file"):
        card["model_level_train"] = train_card
        card["metrics"]["model_level_train"] = train_card["metrics"]["correction"]
    elif train_card is not None:
        card["model_level_train_not_shipped"] = train_card
    # The created stamp is the only run-dependent field; everything else is a function of the
    # data, the code and the seeds.
    _write_json(out_dir / "card.json", card)
    say(f"wrote {out_dir} ({sum(p.stat().st_size for p in out_dir.iterdir()) / 1e6:.2f} MB) "
        f"in {time.time() - t_start:.0f}s")
    return card


def _cache_info(cache: Path) -> dict[str, Any]:
    """A timm cache as the card names it: path, sha256 and its provenance JSON (None if absent)."""
    prov = cache.with_suffix("").with_suffix(".provenance.json")
    return {"path": _rel(cache, repo_root()), "sha256": sha256_file(cache),
            "provenance": json.loads(prov.read_text()) if prov.is_file() else None}


def _excluded(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The card's record of the timm rows left out by model_level.split_consistent."""
    return {"rule": "measured_ms x the board's top clock ratio < sum of the traced units' "
                    "roofline_ms: the measurement ran another program than the trace "
                    "(blink.train.model_level.split_consistent)",
            "rows": [{"model": r["model"], "img_size": int(r["img_size"]),
                      "batch": int(r["batch"]),
                      "roofline_over_measured": _r(r["roofline_ms"] / r["measured_ms"], 3)}
                     for r in rows]}


def _beyond_bound(mt: ml.ModelTable) -> dict[str, Any]:
    """The rows ml.fit_rows leaves out of a model-level correction's fit."""
    out = ~ml.fit_rows(mt)
    ratio = mt.measured_ms / mt.analytic_ms
    return {"rule": f"|log(measured / analytic)| > {ml.FIT_LOG_BOUND:g}: left out of the fit, "
                    "kept in metrics and intervals",
            "models": [f"{m} (batch {int(b)}, measured x{float(r):.2f})" for m, b, r in
                       zip(mt.model[out], mt.batch[out], ratio[out], strict=True)]}


def _train_steps(out_dir: Path, cache: Path, say: Any,
                 offsets: dict[str, float]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The training-step correction (forest_model_train.json) on the timm training file's
    cached steps: the same features and forest as the inference correction, its own fit. Ships
    only if it beats the analytic time on held-out families. Returns (card entry, conformal
    entry); (None, {}) without a cache."""
    if not cache.is_file():
        say(f"{cache}: no timm training-step cache, training-step correction skipped "
            "(python -m blink.train.timm_cache --mode train creates it)")
        return None, {}
    mt, excluded = ml.consistent_table(load_cache(cache, mode="train"))
    allrows = np.ones(len(mt), dtype=bool)
    p_corr = ml.oof(mt, "correction", allrows)
    q_corr = conformal_q(np.abs(np.log(mt.measured_ms / p_corr)), COVERAGE)
    q_ana = conformal_q(np.abs(np.log(mt.measured_ms / mt.analytic_ms)), COVERAGE)
    m_ana = metrics(mt.analytic_ms, mt.measured_ms, q_ana)
    m_corr = metrics(p_corr, mt.measured_ms, q_corr)
    card: dict[str, Any] = {
        "target": "log(measured / analytic time_ms) of a whole training step",
        "features": list(ml.CORRECTION_FEATURES), "clip": list(CLIP),
        "feature_definitions": "as model_level's",
        "applies_to": {"gpus": ["RTX3090"], "dtype": "amp-fp16", "mode": "train",
                       "optimizer": "sgd",
                       "models": "timm image classifiers (zero_grad, forward + cross entropy "
                                 "under AMP, backward, SGD with momentum)"},
        "params": _params(ml.MODEL_PARAMS, ml.MODEL_ROUNDS), "rows": len(mt),
        "excluded": _excluded(excluded), "left_out_of_fit": _beyond_bound(mt),
        "timm_cache": _cache_info(cache),
        "metrics": {"split": "5 folds of held-out timm families",
                    "roofline": _m(metrics(mt.roofline_ms, mt.measured_ms)),
                    "analytic": _m(m_ana), "correction": _m(m_corr)},
    }
    say(f"training steps: {len(mt)} timm models, held-out-family MAPE analytic "
        f"{m_ana['mape']:.1f}% -> correction {m_corr['mape']:.1f}%")
    if not m_corr["mape"] < m_ana["mape"]:
        say("training-step correction not shipped: it does not beat the analytic time on "
            "held-out families")
        card["not_shipped"] = "does not beat the analytic time on held-out families"
        return card, {}
    booster = ml.fit_correction(mt)
    booster.save_model(str(out_dir / "forest_model_train.json"))
    card = {"file": "forest_model_train.json",
            "sha256": sha256_file(out_dir / "forest_model_train.json"), **card}
    conformal = {
        "q": _r(q_ana, 6), "n": len(mt),
        "predictor": "analytic (blink.predict time_ms) of a training step",
        "q_other_gpu": _r(other_gpu_q(np.log(mt.measured_ms / mt.analytic_ms), offsets), 6),
        "other_gpu": _other_gpu_entry(offsets),
        "calibration": "timm-rtx3090 training steps (no model fitted on them)",
        "by_predictor": {"model": {
            "q": _r(q_corr, 6), "n": len(mt),
            "predictor": "training-step correction (forest_model_train.json)",
            "calibration": "timm-rtx3090 training steps, out-of-fold over 5 held-out-family "
                           "folds"}},
    }
    return card, conformal


def _forests_card(forests: dict[str, Any]) -> dict[str, Any]:
    """A card with only the forests (what timm_graphs needs to load them mid-training)."""
    return {"format_version": CARD_FORMAT_VERSION,
            "feature_schema_version": FEATURE_SCHEMA_VERSION, "forests": forests}


def _train_gnn(out_dir: Path, graphs: Path, forests: dict[str, Any], mt: ml.ModelTable,
               conformal_model: dict[str, Any], say: Any, p_corr: np.ndarray | None = None,
               *, offsets: dict[str, float]) -> dict[str, Any] | None:
    """Fit the GNN on the trees variant of the timm graphs, held-out families first; ship it
    (models/gnn.safetensors) only if it beats the forests' timeline on held-out families. Adds
    the end-to-end conformal entries of the trees and trees+gnn times to `conformal_model`.
    With the model-level correction's out-of-fold times `p_corr` (same folds), the card's
    "blend" says how predict blends the two where the GNN applies, if the blend beats the GNN
    alone on held-out families."""
    from ..gnn import save
    from .fit import group_folds
    from .gnn_fit import GNN_PARAMS, align, cross_conformal_q, fit_gnn, oof, targets

    if not graphs.is_file():
        say(f"{graphs}: no timm graph cache, GNN skipped (python -m blink.train.timm_graphs)")
        return None
    try:
        gs = load_graphs(graphs, out_dir, forests)
    except ValueError as exc:
        say(f"GNN skipped: {exc}")
        return None
    gi = align(gs, mt.model, mt.batch, mt.img_size)
    have = gi >= 0
    folds = group_folds(mt.family, 5)
    meas = mt.measured_ms
    # What predict ships on a GPU without a GNN: forests off outside their GPU generations.
    trees_ms = np.where(have, gs.forests_ms[np.maximum(gi, 0)], math.nan)
    pred = oof(gs, "trees", gi, meas, folds)
    ok = have & np.isfinite(pred)
    m_trees = metrics(trees_ms[ok], meas[ok])
    m_gnn = metrics(pred[ok], meas[ok])
    q_trees = conformal_q(np.abs(np.log(meas[ok] / trees_ms[ok])), COVERAGE)
    q_gnn = conformal_q(np.abs(np.log(meas[ok] / pred[ok])), COVERAGE)
    held_q = cross_conformal_q(pred, meas, folds, COVERAGE)
    m_gnn["coverage"] = float(np.mean(np.abs(np.log(meas[ok] / pred[ok])) <= held_q[ok]))
    m_trees["coverage"] = float(np.mean(np.abs(np.log(meas[ok] / trees_ms[ok])) <= q_trees))
    by = conformal_model.setdefault("by_predictor", {})
    by["analytic"] = {k: conformal_model[k] for k in ("q", "n", "predictor", "q_other_gpu")
                      if k in conformal_model}
    by["trees"] = {"q": _r(q_trees, 6), "n": int(ok.sum()),
                   "q_other_gpu": _r(other_gpu_q(np.log(meas[ok] / trees_ms[ok]), offsets), 6),
                   "predictor": "per-unit forests (the timeline of their unit times)",
                   "calibration": "timm-rtx3090 residuals of that timeline as predict makes "
                                  "it without a GNN (a forest whose GPU generations do not "
                                  "include this GPU's leaves its units analytic; nothing "
                                  "fitted on these models)"}
    card: dict[str, Any] = {
        "target": "log(measured / end-to-end time of the forests' timeline)",
        "variant": "trees", "graphs": {"path": _rel(graphs, repo_root()),
                                       "sha256": sha256_file(graphs)},
        "rows": int(ok.sum()), "params": dict(GNN_PARAMS),
        "left_out_of_fit": _outside_clip(gs, gi, meas, mt),
        "applies_to": {"gpus": ["RTX3090"], "modes": ["inference"], "dtype": "amp-fp16",
                       "models": "timm image classifiers"},
        "metrics": {"split": "5 folds of held-out timm families",
                    "trees": _m(m_trees), "trees+gnn": _m(m_gnn)},
    }
    say(f"GNN: {int(ok.sum())} timm graphs, held-out-family MAPE trees {m_trees['mape']:.1f}% "
        f"-> trees+gnn {m_gnn['mape']:.1f}%")
    if not m_gnn["mape"] < m_trees["mape"]:
        say("GNN not shipped: it does not beat the forests' timeline on held-out families")
        card["not_shipped"] = "does not beat the forests' timeline on held-out families"
        return card
    train_all = np.zeros(len(gs), dtype=bool)
    train_all[gi[have]] = True
    net = fit_gnn(gs, "trees", targets(gs, "trees", gi, meas), train_all)
    save(net, out_dir / "gnn.safetensors")
    card.update({"file": "gnn.safetensors", "sha256": sha256_file(out_dir / "gnn.safetensors")})
    by["trees+gnn"] = {"q": _r(q_gnn, 6), "n": int(ok.sum()),
                       "predictor": "GNN-corrected forests' timeline (gnn.safetensors)",
                       "calibration": "timm-rtx3090 out-of-fold residuals over 5 held-out-family "
                                      "folds"}
    if p_corr is not None:
        _blend(card, by, pred, p_corr, meas, ok & np.isfinite(p_corr), folds, m_gnn, say)
    return card


def _outside_clip(gs: Any, gi: np.ndarray, meas: np.ndarray,
                  mt: ml.ModelTable) -> dict[str, Any]:
    """The timm rows no GNN fit uses (gnn_fit.in_clip): their log(measured / forests'
    timeline) lies outside the network's output clip. They stay in every metric and interval."""
    from .gnn_fit import GNN_PARAMS, in_clip

    have = gi >= 0
    ratio = np.full(gi.size, math.nan)
    ratio[have] = meas[have] / gs.end_to_end_ms("trees")[gi[have]]
    out = have & ~in_clip(np.log(ratio))
    return {"rule": f"log(measured / forests' timeline) outside the output clip "
                    f"{GNN_PARAMS['clip']}: left out of the fit, kept in metrics and intervals",
            "models": [f"{m} (batch {int(b)}, measured x{float(r):.2f})" for m, b, r in
                       zip(mt.model[out], mt.batch[out], ratio[out], strict=True)]}


def _blend(card: dict[str, Any], by: dict[str, Any], p_gnn: np.ndarray, p_corr: np.ndarray,
           meas: np.ndarray, ok: np.ndarray, folds: list[np.ndarray], m_gnn: dict[str, float],
           say: Any) -> None:
    """The geometric blend of the GNN's and the model-level correction's out-of-fold times with
    BLEND_WEIGHT_GNN; recorded in card["blend"] (and its conformal entry) only if it beats the
    GNN alone on held-out families."""
    from .gnn_fit import cross_conformal_q

    w = BLEND_WEIGHT_GNN
    p = blend_ms(p_gnn, p_corr, w)
    m = metrics(p[ok], meas[ok])
    q = conformal_q(np.abs(np.log(meas[ok] / p[ok])), COVERAGE)
    held_q = cross_conformal_q(np.where(ok, p, math.nan), meas, folds, COVERAGE)
    m["coverage"] = float(np.mean(np.abs(np.log(meas[ok] / p[ok])) <= held_q[ok]))
    card["metrics"]["trees+gnn+model"] = _m(m)
    say(f"blend: held-out-family MAPE trees+gnn {m_gnn['mape']:.1f}% -> trees+gnn^{w:g} x "
        f"model-level^{1 - w:g} {m['mape']:.1f}%")
    if not m["mape"] < m_gnn["mape"]:
        say("blend not shipped: it does not beat the GNN alone on held-out families")
        return
    card["blend"] = {"weight_gnn": w, "with": "model_level (forest_model.json)",
                     "time": "trees+gnn^weight_gnn x model_level^(1 - weight_gnn)"}
    by["trees+gnn+model"] = {
        "q": _r(q, 6), "n": int(ok.sum()),
        "predictor": "GNN time blended with the model-level correction (gnn.blend)",
        "calibration": "timm-rtx3090 out-of-fold residuals over 5 held-out-family folds"}


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
