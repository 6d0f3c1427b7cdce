"""`blink evaluate` / `python -m blink.train.evaluation`: accuracy on held-out GPUs, families and
batch sizes, with an ablation in one run.

Per unit (NeuSight + DeepBench kernels), every number is for rows whose GPU chip the forest never
saw (leave-one-GPU-out), or whose batch lies above every batch it was fitted on. NeuSight rows
are kernel times: each GPU's CUDA-event floor is taken off and floor-dominated rows are dropped
(blink.train.data.neusight_floors), as in training:

- roofline: the unit's roofline time (blink::roofline_time_s);
- analytic: blink's analytic time (blink::analytic_time_s), what predict uses without trees;
- trees: analytic * exp(forest), the forest fitted without the held-out GPU.

Intervals: the conformal q for a held-out GPU is calibrated without it (pair_q: each other GPU's
residuals under a forest fitted without that GPU and without the held-out one); for analytic, q
is the quantile of the other GPUs' analytic residuals.

Model level (timm-rtx3090, cached blink predictions and unit graphs): 5 folds of held-out name
families; roofline (the predicted timeline's lower bound), analytic (blink.predict time_ms),
trees (the timeline of the shipped forests' unit times as predict makes it where no GNN
applies: a forest whose GPU generations do not include the RTX 3090's leaves its units
analytic), gnn (the GNN on the analytic graphs), trees+gnn (the GNN on the forests' graphs,
every forest applied),
trees+gnn+model (trees+gnn blended with the model-level correction: what predict does on a GPU
the GNN covers), the whole-model baseline (params, FLOPs, batch, image size) and the model-level
correction forest. q: for analytic and trees, the quantile of the
other folds' residuals; for the GNN, of the other folds' out-of-fold residuals; for the forests,
out-of-fold inside the training families.

Training steps (timm-rtx3090's training file, cached as traced SGD steps): the same 5-fold
held-out-family split for roofline, analytic, the whole-model baseline and the model-level
correction refitted on training steps (what predict ships for them on the RTX 3090).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..learned import blend_ms
from . import gnn_fit
from . import model_level as ml
from .data import KindTable, load_units, public_root, shape_half, tables_by_kind
from .fit import (
    NUM_ROUNDS,
    conformal_q,
    fit_forest,
    group_folds,
    metrics,
    set_threads,
    shrunk_s,
)
from .pipeline import BLEND_WEIGHT_GNN, COVERAGE, repo_root
from .timm_cache import default_cache_path, load_cache
from .timm_graphs import GraphSet, default_graphs_path, load_graphs
from .units import MIN_ROWS, PairForests, choose_scale, logo, nested_shrink

__all__ = ["evaluate", "main"]

# trees: the shipped predictor (shrunk forest, scale chosen without the held-out GPU); "trees x1":
# the same forests unshrunk, for the ablation.
PREDICTORS_UNIT = ("roofline", "analytic", "trees", "trees x1")
PREDICTORS_MODEL = ("roofline", "analytic", "trees", "gnn", "trees+gnn", "trees+gnn+model",
                    "baseline", "correction")
# The batch-extrapolation split: rows above this quantile of their family's batch values are
# the test set; the forest is fitted on the rest.
BATCH_QUANTILE = 0.75


def default_out_dir() -> Path:
    return repo_root() / "benchmarks" / "results" / "accuracy"


# -- formatting -----------------------------------------------------------------------------
def _fmt(x: Any, pct: bool = True) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.1f}" if pct else f"{x}"


def table(title: str, rows: list[tuple[str, int, dict[str, dict[str, float]]]],
          predictors: tuple[str, ...]) -> str:
    """One row per group: n, then MAPE / median / p90 APE / coverage for each predictor."""
    head = f"{'':<32} {'n':>6}"
    for p in predictors:
        head += f" | {p:>10} {'MAPE':>6} {'med':>6} {'p90':>7} {'cov':>5}"
    lines = [title, head.replace(" | ", " | ").rstrip(), "-" * len(head)]
    for name, n, m in rows:
        s = f"{name:<32} {n:>6}"
        for p in predictors:
            d = m.get(p, {})
            cov = d.get("coverage")
            s += (f" | {'':>10} {_fmt(d.get('mape')):>6} {_fmt(d.get('median_ape')):>6} "
                  f"{_fmt(d.get('p90_ape')):>7} "
                  f"{'-' if cov is None or not math.isfinite(cov) else f'{100 * cov:.0f}%':>5}")
        lines.append(s)
    return "\n".join(lines)


def long_table(title: str, rows: list[tuple[str, int, dict[str, dict[str, float]]]],
               predictors: tuple[str, ...]) -> str:
    """One line per group and predictor (for many predictors): MAPE / median / p90 APE / cov,
    and the ratio of each predictor's MAPE to the roofline's (the baseline) beside."""
    pw = max([len("predictor"), *map(len, predictors)]) + 1
    head = (f"{'':<28} {'n':>5}  {'predictor':<{pw}} {'MAPE':>6} {'med':>6} {'p90':>7} "
            f"{'cov':>5} {'MAPE/roofline':>13}")
    lines = [title, head, "-" * len(head)]
    for name, n, m in rows:
        base = m.get("roofline", {}).get("mape")
        first = True
        for p in predictors:
            d = m.get(p)
            if d is None:
                continue
            cov = d.get("coverage")
            ratio = (d["mape"] / base if base and d.get("mape") is not None
                     and math.isfinite(d["mape"]) else math.nan)
            lines.append(
                f"{name if first else '':<28} {n if first else '':>5}  {p:<{pw}} "
                f"{_fmt(d.get('mape')):>6} {_fmt(d.get('median_ape')):>6} "
                f"{_fmt(d.get('p90_ape')):>7} "
                f"{'-' if cov is None or not math.isfinite(cov) else f'{100 * cov:.0f}%':>5} "
                f"{'-' if not math.isfinite(ratio) else f'{ratio:.2f}x':>13}")
            first = False
    return "\n".join(lines)


# -- per unit -------------------------------------------------------------------------------
def held_out_calibration(t: KindTable, ns: Any, chip: str,
                         scale: float) -> tuple[np.ndarray, np.ndarray]:
    """|log(measured / trees)| and chips of the rows that calibrate held-out `chip`'s interval:
    the other chips' rows, each predicted by a forest of `ns` (nested_shrink) that saw neither
    `chip` nor the row's own chip, shrunk by `scale`."""
    raw = ns.others[chip]
    cal = (t.chip != chip) & np.isfinite(raw)
    res = np.log(t.measured_s[cal] / shrunk_s(t.analytic_s[cal], raw[cal], scale))
    return np.abs(res), t.chip[cal]


def unit_logo(t: KindTable, rounds: int, coverage: float) -> dict[str, Any]:
    """Held-out-GPU predictions and interval bounds of every row of one kind. For held-out chip
    c the shrinkage is chosen (nested_shrink) and q calibrated on the other chips' predictions
    by forests that saw neither that chip nor c, so neither ever used c. Where shrinking does
    not beat the whole forest on held-out GPUs, blink train ships the forest whole, and so
    "trees" here is the whole forest."""
    lg = logo(t, rounds=rounds)
    ns = nested_shrink(t, lg, PairForests(t, rounds))
    scales = ns.scales if ns.shrinks else dict.fromkeys(lg.chips, 1.0)
    q_trees = np.full(len(t), math.nan)
    q_ana = np.full(len(t), math.nan)
    for c in lg.chips:
        test = t.chip == c
        res, _ = held_out_calibration(t, ns, c, scales[c])
        q_trees[test] = conformal_q(res, coverage)
        q_ana[test] = conformal_q(np.abs(np.log(t.measured_s[~test] / t.analytic_s[~test])),
                                  coverage)
    return {"trees": ns.trees_s, "trees x1": ns.whole_s,
            "q_trees": q_trees, "q_analytic": q_ana, "scales": scales, "gated": lg.gated}


def _unit_metrics(t: KindTable, r: dict[str, Any], m: np.ndarray) -> dict[str, dict]:
    out = {"roofline": metrics(t.roofline_s[m], t.measured_s[m]),
           "analytic": metrics(t.analytic_s[m], t.measured_s[m]),
           "trees": metrics(r["trees"][m], t.measured_s[m]),
           "trees x1": metrics(r["trees x1"][m], t.measured_s[m])}
    for p in ("analytic", "trees"):
        # A trees interval exists only where a forest timed the unit: not on the rows of a
        # held-out chip whose generation its fold never saw (predict leaves those analytic).
        k = m & ~r.get("gated", np.zeros(len(t), dtype=bool)) if p == "trees" else m
        pred = t.analytic_s[k] if p == "analytic" else r["trees"][k]
        out[p]["coverage"] = (float(np.mean(np.abs(np.log(t.measured_s[k] / pred))
                                            <= r[f"q_{p}"][k])) if k.any() else math.nan)
    return out


def batch_split(t: KindTable, rounds: int, coverage: float) -> dict[str, Any] | None:
    """Fit on rows at or below their family's BATCH_QUANTILE batch (a shape-hashed half of
    them; the other half calibrates q), test on the rows above it."""
    test = np.zeros(len(t), dtype=bool)
    for fam in sorted(set(t.family.tolist())):
        f = t.family == fam
        thr = np.quantile(t.batch[f], BATCH_QUANTILE)
        test |= f & (t.batch > thr)
    if test.sum() < 20 or (~test).sum() < 50:
        return None
    cal = shape_half(t.shape) & ~test
    fit = ~test & ~cal
    forest = fit_forest(t.subset(fit), rounds=rounds)
    raw = np.full(len(t), math.nan)
    raw[cal | test] = forest.raw_log_ratio(t.X[cal | test])
    # The shrinkage, like q, comes from the calibration half.
    forest.scale = choose_scale(t, raw, cal)
    q = conformal_q(np.abs(np.log(t.measured_s[cal] / forest.predict_s(t.subset(cal)))),
                    coverage)
    q_ana = conformal_q(np.abs(np.log(t.measured_s[~test] / t.analytic_s[~test])), coverage)
    pred = np.full(len(t), math.nan)
    pred[test] = forest.predict_s(t.subset(test))
    pred1 = np.full(len(t), math.nan)
    pred1[test] = shrunk_s(t.analytic_s[test], raw[test], 1.0)
    return {"test": test, "trees": pred, "trees x1": pred1, "q_trees": np.full(len(t), q),
            "q_analytic": np.full(len(t), q_ana)}


# -- model level ----------------------------------------------------------------------------
def model_folds(mt: ml.ModelTable, coverage: float, k: int = 5, gs: GraphSet | None = None,
                gnn: bool = True) -> dict[str, np.ndarray]:
    """Held-out-family predictions (and per-row q) of every model-level predictor. With the
    graph cache `gs`: trees (the shipped forests' timeline: they never saw this GPU or these
    models) and, unless gnn=False, the GNN on the analytic and on the trees graphs."""
    n = len(mt)
    out = {p: np.full(n, math.nan) for p in PREDICTORS_MODEL}
    qs = {p: np.full(n, math.nan) for p in PREDICTORS_MODEL}
    out["roofline"] = mt.roofline_ms.copy()
    out["analytic"] = mt.analytic_ms.copy()
    folds = group_folds(mt.family, k)
    for test in folds:
        train = ~test
        qs["analytic"][test] = conformal_q(
            np.abs(np.log(mt.measured_ms[train] / mt.analytic_ms[train])), coverage)
        for p in ("baseline", "correction"):
            out[p][test] = ml.fit_predict(mt, p, train, test)
            qs[p][test] = ml.conformal_oof(mt, p, train, coverage, k=k - 1)
    if gs is not None:
        gi = gnn_fit.align(gs, mt.model, mt.batch, mt.img_size)
        have = gi >= 0
        out["trees"][have] = gs.forests_ms[gi[have]]
        for test in folds:
            cal = ~test & have
            qs["trees"][test] = conformal_q(
                np.abs(np.log(mt.measured_ms[cal] / out["trees"][cal])), coverage)
        for p, variant in (("gnn", "analytic"), ("trees+gnn", "trees")):
            if gnn:
                out[p] = gnn_fit.oof(gs, variant, gi, mt.measured_ms, folds)
                qs[p] = gnn_fit.cross_conformal_q(out[p], mt.measured_ms, folds, coverage)
        if gnn:
            # What predict ships where the GNN applies (card gnn.blend): the geometric blend.
            out["trees+gnn+model"] = blend_ms(out["trees+gnn"], out["correction"],
                                              BLEND_WEIGHT_GNN)
            qs["trees+gnn+model"] = gnn_fit.cross_conformal_q(out["trees+gnn+model"],
                                                             mt.measured_ms, folds, coverage)
    out.update({f"q_{p}": q for p, q in qs.items()})
    return out


def _excluded_rows(kept: list[dict[str, Any]], excluded: list[dict[str, Any]],
                   gs: GraphSet | None, gnn: bool) -> list[tuple[str, int, dict]]:
    """Metrics on the rows split_consistent left out, each predictor fitted on the kept rows
    only (what blink ships), one table row per model family plus all of them."""
    both = ml.table(kept + excluded)
    test = np.arange(len(both)) >= len(kept)
    r = {p: np.full(len(both), math.nan) for p in PREDICTORS_MODEL}
    r["roofline"], r["analytic"] = both.roofline_ms, both.analytic_ms
    for p in ("baseline", "correction"):
        r[p][test] = ml.fit_predict(both, p, ~test, test)
    if gs is not None:
        gi = gnn_fit.align(gs, both.model, both.batch, both.img_size)
        have = gi >= 0
        r["trees"][have] = gs.forests_ms[gi[have]]
        if gnn:
            for p, variant in (("gnn", "analytic"), ("trees+gnn", "trees")):
                r[p] = gnn_fit.oof(gs, variant, gi, both.measured_ms, [test])
            r["trees+gnn+model"] = blend_ms(r["trees+gnn"], r["correction"], BLEND_WEIGHT_GNN)
    rows = [("all excluded rows", int(test.sum()), _model_metrics(both, r, test))]
    for fam in sorted(set(both.family[test].tolist())):
        m = test & (both.family == fam)
        rows.append((f"family {fam}", int(m.sum()), _model_metrics(both, r, m)))
    return rows


def _fit_unseen(mt: ml.ModelTable, trn: np.ndarray) -> dict[str, np.ndarray]:
    """The whole-model baseline and the correction fitted on rows `trn`, predicting the other
    rows (NaN on `trn`): the batch-extrapolation splits."""
    out = {}
    for p in ("baseline", "correction"):
        out[p] = np.full(len(mt), math.nan)
        out[p][~trn] = ml.fit_predict(mt, p, trn, ~trn)
    return out


def _model_metrics(mt: ml.ModelTable, r: dict[str, np.ndarray], m: np.ndarray,
                   predictors: tuple[str, ...] = PREDICTORS_MODEL) -> dict[str, dict]:
    out = {}
    for p in predictors:
        if not np.isfinite(r[p][m]).any():
            continue
        d = metrics(r[p][m], mt.measured_ms[m])
        q = r.get(f"q_{p}")
        if q is not None and np.isfinite(q[m]).any():
            d["coverage"] = float(np.mean(np.abs(np.log(mt.measured_ms[m] / r[p][m])) <= q[m]))
        out[p] = d
    return out


# -- figures --------------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "font.size": 8, "svg.hashsalt": "blink",
                         "path.simplify": False})
    return plt


def _save(fig: Any, path: Path) -> None:
    # No Software / date metadata: the same data give the same bytes.
    fig.savefig(path, metadata={"Software": None}, bbox_inches="tight")


def figure_units(tables: dict[str, KindTable], res: dict[str, dict], path: Path) -> None:
    plt = _plt()
    fams = [(k, f) for k, t in tables.items() if k in res for f in sorted(set(t.family.tolist()))]
    cols = 3
    rows = max(1, math.ceil(len(fams) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.6 * rows), squeeze=False)
    for ax, (k, fam) in zip(axes.flat, fams, strict=False):
        t, r = tables[k], res[k]
        m = t.family == fam
        meas = t.measured_s[m] * 1e3
        ax.scatter(meas, t.analytic_s[m] * 1e3, s=3, alpha=0.35, c="tab:gray", label="analytic",
                   rasterized=True)
        ax.scatter(meas, r["trees"][m] * 1e3, s=3, alpha=0.35, c="tab:blue",
                   label="trees (GPU held out)", rasterized=True)
        lo, hi = float(np.min(meas)), float(np.max(meas))
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{k} / {fam} (n={int(m.sum())})")
        ax.set_xlabel("measured ms")
        ax.set_ylabel("predicted ms")
        ax.legend(loc="upper left", markerscale=3, fontsize=7)
    for ax in list(axes.flat)[len(fams):]:
        ax.axis("off")
    fig.suptitle("Per-unit time, predicted vs measured, leave-one-GPU-out")
    fig.subplots_adjust(hspace=0.4, wspace=0.3)
    _save(fig, path)
    plt.close(fig)


def figure_models(mt: ml.ModelTable, r: dict[str, np.ndarray], path: Path) -> None:
    plt = _plt()
    colors = {"analytic": "tab:gray", "trees": "tab:green", "trees+gnn": "tab:purple",
              "trees+gnn+model": "tab:red", "baseline": "tab:orange", "correction": "tab:blue"}
    shown = [p for p in colors if p in r and np.isfinite(r[p]).all()]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.4 * len(shown), 4.2), squeeze=False)
    meas = mt.measured_ms
    for ax, p in zip(axes.flat, shown, strict=True):
        ax.scatter(meas, r[p], s=5, alpha=0.5, c=colors[p], rasterized=True)
        lo, hi = float(meas.min()), float(meas.max())
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ape = np.abs(r[p] - meas) / meas * 100
        ax.set_title(f"{p}: MAPE {ape.mean():.1f}%, median {np.median(ape):.1f}%")
        ax.set_xlabel("measured ms per batch (RTX 3090, AMP fp16)")
        ax.set_ylabel("predicted ms")
    fig.suptitle(f"timm models, held-out families ({len(mt)} models)")
    _save(fig, path)
    plt.close(fig)


def figure_batch(tables: dict[str, KindTable], bres: dict[str, dict], mt: ml.ModelTable | None,
                 mres: dict[str, np.ndarray] | None, path: Path) -> None:
    plt = _plt()
    n = 1 + (mt is not None)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), squeeze=False)
    ax = axes[0][0]
    colors = dict(zip(sorted(bres), ("tab:blue", "tab:orange", "tab:green", "tab:red",
                                     "tab:purple", "tab:brown", "tab:pink"), strict=False))
    for k, r in bres.items():
        t = tables[k]
        m = r["test"]
        b = t.batch[m]
        for p, ls in (("analytic", "--"), ("trees", "-")):
            pred = t.analytic_s[m] if p == "analytic" else r["trees"][m]
            ape = np.abs(pred - t.measured_s[m]) / t.measured_s[m] * 100
            edges = np.unique(np.quantile(b, np.linspace(0, 1, 7)))
            if edges.size < 2:
                continue
            idx = np.clip(np.searchsorted(edges, b, side="right") - 1, 0, edges.size - 2)
            xs = [float(np.median(b[idx == i])) for i in range(edges.size - 1) if (idx == i).any()]
            ys = [float(np.median(ape[idx == i])) for i in range(edges.size - 1)
                  if (idx == i).any()]
            ax.plot(xs, ys, ls, marker="o", ms=3, color=colors.get(k), label=f"{k} {p}")
    ax.set_xscale("log")
    ax.set_xlabel("batch (above every batch the trees were fitted on)")
    ax.set_ylabel("median APE %")
    ax.set_title("Per-unit error vs batch size (unseen batches)")
    ax.legend(fontsize=6, ncol=2)
    if mt is not None and mres is not None:
        ax = axes[0][1]
        bs = np.unique(mt.batch)
        for p in ("analytic", "trees", "trees+gnn", "baseline", "correction"):
            if not np.isfinite(mres[p]).all():
                continue
            ape = np.abs(mres[p] - mt.measured_ms) / mt.measured_ms * 100
            ys = [float(np.median(ape[mt.batch == b])) for b in bs]
            ax.plot(bs, ys, marker="o", ms=3, label=p)
        ax.set_xscale("log")
        ax.set_xlabel("benchmark batch size")
        ax.set_ylabel("median APE % (held-out families)")
        ax.set_title("timm models: error vs batch size")
        ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)


# A board whose power rule gives it under this fraction of boost under dense FP32 math is
# power-capped for the evaluation's split (the 70-75 W P4 and T4 among the public boards; the
# TITAN Xp's 0.97 is within the rule's error of boost).
CAPPED_RATIO = 0.9


def _power_capped(gpu: str) -> bool:
    """Whether the hardware table's power rule puts `gpu` well below boost under dense FP32
    math (sustained FP32 ratio under CAPPED_RATIO)."""
    from ..hardware import get_gpu

    return get_gpu(gpu).sustained_fp32_ratio < CAPPED_RATIO


# -- driver ---------------------------------------------------------------------------------
def evaluate(data: str | Path | None = None, out: str | Path | None = None, *,
             neusight_rows_per_file: int | None = 6000, neusight_mixed_rows: int | None = None,
             rounds: int = NUM_ROUNDS, timm_cache: str | Path | None = None, figures: bool = True,
             coverage: float = COVERAGE, timm_graphs: str | Path | None = None,
             gnn: bool = True, timm_train_cache: str | Path | None = None,
             log: Any = sys.stderr) -> dict[str, Any]:
    """Run every split, print the tables, write results.json and the PNG figures."""
    t0 = time.time()
    root = public_root(data)
    out_dir = Path(out) if out is not None else default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        if log is not None:
            print(f"[{time.time() - t0:6.1f}s] {msg}", file=log)

    tables = tables_by_kind(load_units(root, neusight_rows_per_file=neusight_rows_per_file,
                                       neusight_mixed_rows=neusight_mixed_rows))
    res: dict[str, dict] = {}
    bres: dict[str, dict] = {}
    for k, t in tables.items():
        if len(t) < MIN_ROWS or len(set(t.chip.tolist())) < 2:
            continue
        res[k] = unit_logo(t, rounds, coverage)
        b = batch_split(t, rounds, coverage)
        if b is not None:
            bres[k] = b
        say(f"{k}: {len(t)} rows evaluated")

    text: list[str] = []
    results: dict[str, Any] = {"coverage_nominal": coverage}
    # Kinds whose forest blink train does not ship (models/card.json): their trees rows are the
    # ablation's, not what predict uses.
    card_path = repo_root() / "models" / "card.json"
    not_shipped = (set(json.loads(card_path.read_text()).get("forests_not_shipped", {}))
                   if card_path.is_file() else set())
    fam_rows, gpu_rows, kind_rows, clock_rows = [], [], [], []
    capped_chips: set[str] = set()
    for k, t in tables.items():
        if k not in res:
            continue
        kind_rows.append((k, len(t), _unit_metrics(t, res[k], np.ones(len(t), dtype=bool))))
        capped = np.array([_power_capped(g) for g in t.gpu.tolist()], dtype=bool)
        capped_chips.update(t.chip[capped].tolist())
        for name, m in (("at boost", ~capped), ("power-capped", capped)):
            if m.any():
                clock_rows.append((f"{k}: {name}", int(m.sum()), _unit_metrics(t, res[k], m)))
        for key in sorted(set(zip(t.dataset.tolist(), t.family.tolist(), strict=True))):
            m = (t.dataset == key[0]) & (t.family == key[1])
            fam_rows.append((f"{key[0].split('-')[0]}:{key[1]}", int(m.sum()),
                             _unit_metrics(t, res[k], m)))
    for chip in sorted({c for t in tables.values() for c in t.chip.tolist()}):
        for k, t in tables.items():
            if k not in res:
                continue
            for ds in sorted(set(t.dataset[t.chip == chip].tolist())):
                m = (t.chip == chip) & (t.dataset == ds)
                gpu_rows.append((f"{chip}:{ds.split('-')[0]}:{k}", int(m.sum()),
                                 _unit_metrics(t, res[k], m)))
    text.append(table("Per unit kind, leave-one-GPU-out (every row predicted by a forest that "
                      "never saw its GPU chip, or analytic where that chip's generation is "
                      "outside the other chips', as predict does, and trees cov counted on the "
                      "rows a forest timed; NeuSight as kernel time, its event floor taken off)",
                      [(k + (" (not shipped)" if k in not_shipped else ""), n, m)
                       for k, n, m in kind_rows], PREDICTORS_UNIT))
    text.append("Shrinkage (trees = analytic x exp(scale x forest)), chosen per held-out chip "
                "on the other chips only:\n" + "\n".join(
                    f"  {k}: " + ", ".join(f"{c} {a:g}" for c, a in r["scales"].items())
                    for k, r in res.items()))
    results["unit_scales"] = {k: r["scales"] for k, r in res.items()}
    text.append(table("Per unit kind, boards that hold their boost clock under dense FP32 math "
                      f"and power-capped ones (sustained ratio < {CAPPED_RATIO:g} by the "
                      "hardware table's power rule, blink/hardware.py; not chosen by error)",
                      clock_rows, PREDICTORS_UNIT)
                + f"\n  power-capped: {', '.join(sorted(capped_chips))}; every other chip at boost")
    results["unit_by_clock"] = {n: m for n, _, m in clock_rows}
    text.append(table("Per data-set family, leave-one-GPU-out", fam_rows, PREDICTORS_UNIT))
    text.append(table("Per held-out GPU chip, data set and unit kind (NeuSight: PyTorch 2.1 "
                      "FP32; DeepBench: cuBLAS/cuDNN 2016-19 fp32 + fp16 tensor cores)",
                      gpu_rows, PREDICTORS_UNIT))
    results["unit_by_kind"] = {n: m for n, _, m in kind_rows}
    results["unit_by_family"] = {n: m for n, _, m in fam_rows}
    results["unit_by_gpu"] = {n: m for n, _, m in gpu_rows}

    b_rows = []
    for k, r in bres.items():
        t = tables[k]
        for fam in sorted(set(t.family[r["test"]].tolist())):
            m = r["test"] & (t.family == fam)
            thr = int(np.quantile(t.batch[t.family == fam], BATCH_QUANTILE))
            b_rows.append((f"{k}:{fam} b>{thr}", int(m.sum()), _unit_metrics(t, r, m)))
    text.append(table(f"Per unit, batch sizes above the {int(BATCH_QUANTILE * 100)}th "
                      "percentile of each family (trees fitted on the smaller ones, all GPUs)",
                      b_rows, PREDICTORS_UNIT))
    results["unit_batch"] = {n: m for n, _, m in b_rows}

    mt = None
    mres = None
    cache = Path(timm_cache) if timm_cache is not None else default_cache_path()
    if cache.is_file():
        kept, excluded = ml.split_consistent(load_cache(cache))
        mt = ml.table(kept)
        gpath = Path(timm_graphs) if timm_graphs is not None else default_graphs_path()
        gs = load_graphs(gpath) if gpath.is_file() else None
        if gs is None:
            text.append(f"(no graph cache at {gpath}: trees and GNN model rows skipped)")
        mres = model_folds(mt, coverage, gs=gs, gnn=gnn)
        allm = np.ones(len(mt), dtype=bool)
        m_rows = [("all held-out families", len(mt), _model_metrics(mt, mres, allm))]
        fams, counts = np.unique(mt.family, return_counts=True)
        order = sorted(range(len(fams)), key=lambda i: (-counts[i], fams[i]))
        for i in order[:15]:
            m = mt.family == fams[i]
            m_rows.append((f"family {fams[i]}", int(m.sum()), _model_metrics(mt, mres, m)))
        rest = ~np.isin(mt.family, fams[order[:15]])
        if rest.any():
            m_rows.append((f"other {len(order) - 15} families", int(rest.sum()),
                           _model_metrics(mt, mres, rest)))
        text.append(long_table(f"timm-rtx3090 (AMP fp16 inference, RTX 3090), 5 folds of "
                               f"held-out families ({len(set(mt.family.tolist()))} families)",
                               m_rows, PREDICTORS_MODEL))
        results["model_families"] = {n: m for n, _, m in m_rows}
        if excluded:
            x_rows = _excluded_rows(kept, excluded, gs, gnn)
            text.append(long_table(
                f"timm-rtx3090 rows left out of every fit and of the tables above "
                f"({len(excluded)}): measured faster than the traced program's roofline at the "
                "board's top clock, so the run was another program (another torch's kernels); "
                "predicted by models fitted on all other rows", x_rows, PREDICTORS_MODEL))
            results["model_excluded"] = {n: m for n, _, m in x_rows}
        # Unseen batch sizes: fitted on the batch-1024 models, tested on every other batch.
        trn = mt.batch == 1024
        tst = ~trn
        if tst.sum() >= 10:
            br = {"roofline": mt.roofline_ms, "analytic": mt.analytic_ms,
                  "trees": mres["trees"], **_fit_unseen(mt, trn)}
            if gs is not None and gnn:
                gi = gnn_fit.align(gs, mt.model, mt.batch, mt.img_size)
                br["trees+gnn"] = gnn_fit.oof(gs, "trees", gi, mt.measured_ms, [tst])
                br["trees+gnn+model"] = blend_ms(br["trees+gnn"], br["correction"],
                                                 BLEND_WEIGHT_GNN)
            bpred = tuple(p for p in PREDICTORS_MODEL if p in br)
            bb_rows = [(f"batch {int(b)}", int((mt.batch == b).sum()),
                        _model_metrics(mt, br, mt.batch == b, bpred))
                       for b in sorted(set(mt.batch[tst].tolist()))]
            bb_rows.append(("all batch < 1024", int(tst.sum()),
                            _model_metrics(mt, br, tst, bpred)))
            text.append(long_table("timm-rtx3090, batch sizes not trained (fitted on batch "
                                   "1024 only; no interval)", bb_rows, bpred))
            results["model_batch"] = {n: m for n, _, m in bb_rows}
        say(f"model level: {len(mt)} timm models evaluated")
    else:
        text.append(f"(no timm cache at {cache}: model-level rows skipped)")

    tcache = (Path(timm_train_cache) if timm_train_cache is not None
              else default_cache_path("train"))
    if tcache.is_file():
        # Whole training steps: no unit graphs, so roofline, analytic and the model-level
        # predictors only (the training-step correction is what predict ships for them).
        tt = ml.consistent_table(load_cache(tcache, mode="train"))[0]
        tres = model_folds(tt, coverage)
        tpred = ("roofline", "analytic", "baseline", "correction")
        t_rows = [("all held-out families", len(tt),
                   _model_metrics(tt, tres, np.ones(len(tt), dtype=bool), tpred))]
        for lo, hi in ((0, 64), (64, 256), (256, 10**9)):
            m = (tt.batch > lo) & (tt.batch <= hi)
            if m.any():
                t_rows.append((f"batch {lo + 1}-{hi}" if hi < 10**9 else f"batch > {lo}",
                               int(m.sum()), _model_metrics(tt, tres, m, tpred)))
        text.append(long_table(f"timm-rtx3090 training steps (AMP fp16, SGD, RTX 3090), 5 folds "
                               f"of held-out families ({len(set(tt.family.tolist()))} families)",
                               t_rows, tpred))
        results["train_families"] = {n: m for n, _, m in t_rows}
        # Unseen batch sizes (families seen): fitted on one side of a batch threshold, tested on
        # the other, both ways.
        tb_rows = []
        for name, trn in (("batch < 128 (fitted on >= 128)", tt.batch >= 128),
                          ("batch > 256 (fitted on <= 256)", tt.batch <= 256)):
            br = {"roofline": tt.roofline_ms, "analytic": tt.analytic_ms, **_fit_unseen(tt, trn)}
            tb_rows.append((name, int((~trn).sum()), _model_metrics(tt, br, ~trn, tpred)))
        text.append(long_table("timm-rtx3090 training steps, batch sizes not trained (no "
                               "interval)", tb_rows, tpred))
        results["train_batch"] = {n: m for n, _, m in tb_rows}
        say(f"training steps: {len(tt)} timm models evaluated")
    else:
        text.append(f"(no timm training-step cache at {tcache}: training-step rows skipped)")

    report = "\n\n".join(text)
    print(report)
    (out_dir / "accuracy.txt").write_text(report + "\n")
    (out_dir / "results.json").write_text(json.dumps(_jsonable(results), indent=1) + "\n")
    if figures:
        figure_units(tables, res, out_dir / "unit_pred_vs_measured.png")
        if mt is not None and mres is not None:
            figure_models(mt, mres, out_dir / "timm_pred_vs_measured.png")
        figure_batch(tables, bres, mt, mres, out_dir / "error_vs_batch.png")
    say(f"wrote {out_dir}")
    return results


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, float):
        return round(x, 5) if math.isfinite(x) else None
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blink.train.evaluation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    a = ap.parse_args(argv)
    return run(a)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from .__main__ import add_evaluate_arguments

    add_evaluate_arguments(ap)


def run(a: argparse.Namespace) -> int:
    set_threads(a.nthread)
    evaluate(a.data, a.out, neusight_rows_per_file=a.rows_per_file,
             neusight_mixed_rows=a.mixed_rows, rounds=a.rounds,
             timm_cache=a.timm_cache, figures=not a.no_figures,
             timm_train_cache=a.timm_train_cache,
             timm_graphs=a.timm_graphs, gnn=not a.no_gnn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
