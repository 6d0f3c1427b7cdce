"""The GNN's readout, with and without its per-unit time-weighted term, on held-out families.

    .venv/bin/python benchmarks/gnn_readout.py [--seeds 0,10] [--jobs 2]

Data: blink's timm RTX 3090 caches (the public AMP inference times, the unit graphs built with
the shipped forests: data/derived/), the same rows and the same five family folds as
`blink evaluate`. For each graph variant (the forests' timeline, which predict ships, and the
analytic one) and each seed, a GNN ensemble is fitted per fold on the other folds' families
(blink.train.gnn_fit.oof, GNN_PARAMS) twice: with the pooled (mean / max) head alone
(unit_term=False, the network shipped until 2026-12-04) and with the per-unit correction
averaged over the units' time shares added (unit_term=True, shipped). The shipped predictor
blends the trees-variant GNN with the model-level correction forest (blend_ms, weight
BLEND_WEIGHT_GNN), whose held-out predictions are fitted here on the same folds. The table
prints MAPE, median and p90 absolute percentage error of each and the ratio of the two MAPEs.
Every fit is a held-out fit; the term itself was one design, tried once (seeds 0 and 10 in the
first comparison) and not searched.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from blink.train import gnn_fit  # noqa: E402
from blink.train import model_level as ml  # noqa: E402
from blink.train.evaluation import BLEND_WEIGHT_GNN, blend_ms, group_folds  # noqa: E402
from blink.train.timm_cache import default_cache_path, load_cache  # noqa: E402
from blink.train.timm_graphs import default_graphs_path, load_graphs  # noqa: E402

VARIANTS = ("trees", "analytic")
FOLDS = 5


def _table() -> ml.ModelTable:
    kept, _excluded = ml.split_consistent(load_cache(default_cache_path()))
    return ml.table(kept)


_DATA: dict[str, Any] = {}  # this process's model table, graphs and folds, loaded once


def _data() -> dict[str, Any]:
    if not _DATA:
        mt = _table()
        gs = load_graphs(default_graphs_path())
        _DATA.update(mt=mt, gs=gs, gi=gnn_fit.align(gs, mt.model, mt.batch, mt.img_size),
                     folds=group_folds(mt.family, FOLDS))
    return _DATA


def _oof(job: tuple[str, int, bool]) -> np.ndarray:
    """Held-out GNN predictions (ms) per row of the model table for one (variant, seed, term)."""
    variant, seed, unit_term = job
    d = _data()
    return gnn_fit.oof(d["gs"], variant, d["gi"], d["mt"].measured_ms, d["folds"],
                       params={"seed": seed, "unit_term": unit_term})


def _errors(pred: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    ape = np.abs(pred / measured - 1.0) * 100.0
    ape = ape[np.isfinite(ape)]
    return float(ape.mean()), float(np.median(ape)), float(np.percentile(ape, 90))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0", help="comma-separated first seeds of the ensembles")
    ap.add_argument("--jobs", type=int, default=1, help="fits run in parallel (one core each)")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    mt = _table()
    folds = group_folds(mt.family, FOLDS)
    correction = np.full(len(mt), math.nan)
    for test in folds:
        correction[test] = ml.fit_predict(mt, "correction", ~test, test)
    jobs = [(v, s, t) for v in VARIANTS for s in seeds for t in (False, True)]
    # spawn, not fork: this process already runs torch / XGBoost threads, and a forked child
    # of a threaded parent can hang on their locks.
    with ProcessPoolExecutor(max_workers=max(1, a.jobs), mp_context=mp.get_context("spawn")) as ex:
        preds = dict(zip(jobs, ex.map(_oof, jobs), strict=True))
    print(f"timm RTX 3090 AMP inference, {len(mt)} models, {FOLDS} folds of held-out families "
          f"({len(set(mt.family.tolist()))} families); GNN ensembles of "
          f"{gnn_fit.GNN_PARAMS['members']} members from each seed")
    head = (f"{'graphs':9s} {'seed':>4s} {'predictor':16s} | {'pooled head only':^20s} | "
            f"{'+ per-unit term':^20s} | ratio")
    print(head)
    print(f"{'':36s}  {'MAPE':>6s} {'med':>6s} {'p90':>6s} | {'MAPE':>6s} {'med':>6s} {'p90':>6s} |"
          " MAPE")
    print("-" * len(head))
    for v in VARIANTS:
        for s in seeds:
            rows = [("gnn", preds[(v, s, False)], preds[(v, s, True)])]
            if v == "trees":  # what predict ships: the blend with the model-level correction
                rows.append(("gnn+model blend",
                             blend_ms(preds[(v, s, False)], correction, BLEND_WEIGHT_GNN),
                             blend_ms(preds[(v, s, True)], correction, BLEND_WEIGHT_GNN)))
            for name, old, new in rows:
                e0, e1 = _errors(old, mt.measured_ms), _errors(new, mt.measured_ms)
                print(f"{v:9s} {s:4d} {name:16s} | {e0[0]:6.2f} {e0[1]:6.2f} {e0[2]:6.2f} | "
                      f"{e1[0]:6.2f} {e1[1]:6.2f} {e1[2]:6.2f} | {e1[0] / e0[0]:.3f}")


if __name__ == "__main__":
    main()
