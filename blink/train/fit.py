"""Fitting the per-unit forests (XGBoost, imported here and only at training time), held-out
splits and split-conformal quantiles."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import KindTable

__all__ = [
    "CLIP",
    "FOREST_PARAMS",
    "Forest",
    "centred_by_chip",
    "chip_medians",
    "conformal_q",
    "fit_forest",
    "group_folds",
    "medians_by_chip",
    "metrics",
    "shrunk_s",
    "xgb",
]

# Prediction p of a forest is clipped to this range before exp: at most a factor e^3 = 20x
# away from the analytic time, whatever the trees say off the ends of their data.
CLIP = (-3.0, 3.0)

# Small, regularised forests: shallow trees (artifact size, and generality across GPUs over
# fitting the shapes at hand), shrinkage 0.1, row/column subsampling with a fixed seed,
# nthread=2 (deterministic: XGBoost's hist method is deterministic for a fixed thread count).
FOREST_PARAMS: dict[str, Any] = {
    "objective": "reg:squarederror",
    "tree_method": "hist",
    "max_depth": 5,
    "eta": 0.1,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "min_child_weight": 5.0,
    "lambda": 1.0,
    "max_bin": 256,
    "seed": 0,
    "nthread": 2,
}
# XGBoost's hist trees are the same bytes for any thread count (checked in tests/test_train.py),
# so the thread count is a speed setting only; on a loaded 2-core machine 1 is faster.

NUM_ROUNDS = 120


def xgb() -> Any:
    """The xgboost module (training only; `import blink` never needs it)."""
    try:
        import xgboost
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "blink train needs xgboost at training time: pip install xgboost-cpu "
            "(pinned in requirements-dev.txt); prediction does not need it") from exc
    return xgboost


def shrunk_s(analytic_s: np.ndarray, raw: np.ndarray, scale: float) -> np.ndarray:
    """analytic * exp(clip(scale * raw)): what the C++ core does with a forest's raw output
    (blink::apply_unit_models)."""
    return analytic_s * np.exp(np.clip(scale * raw, CLIP[0], CLIP[1]))


@dataclass
class Forest:
    """A fitted booster with its input feature names and the shrinkage its output gets."""

    booster: Any
    features: list[str]
    scale: float = 1.0

    def raw_log_ratio(self, X: np.ndarray) -> np.ndarray:
        """The booster's own output (no shrinkage, no clip)."""
        d = xgb().DMatrix(X, missing=math.nan, feature_names=self.features, nthread=1)
        return np.asarray(self.booster.predict(d), dtype=np.float64)

    def predict_log_ratio(self, X: np.ndarray) -> np.ndarray:
        return np.clip(self.scale * self.raw_log_ratio(X), CLIP[0], CLIP[1])

    def predict_s(self, t: KindTable) -> np.ndarray:
        return t.analytic_s * np.exp(self.predict_log_ratio(t.X))


def set_threads(n: int) -> None:
    """Threads for every later fit (FOREST_PARAMS and the model-level forests)."""
    from . import model_level

    FOREST_PARAMS["nthread"] = int(n)
    model_level.MODEL_PARAMS["nthread"] = int(n)


def centred_by_chip(t: KindTable) -> np.ndarray:
    """t.y less each GPU chip's median: the target the per-unit forests are fitted on.

    A chip's median log(measured / analytic) is that board's own offset from the analytic model
    (its clocks under that benchmark's timing, its software, its power cap), and no other board
    predicts it: a forest fitted on raw targets learns it from the chip's hardware features and
    carries it, wrongly, to the next board. Centred, the trees learn only how the ratio moves
    with the unit's shape inside a board, which does carry, and the analytic model alone sets
    the level on an unseen GPU. Checked leave-one-GPU-out on the public per-unit rows (`blink
    evaluate`, the held-out chip never in the fit or its median): GEMM 16.3 -> 16.1% MAPE with
    the nested shrinkage, 20.9 -> 16.6% unshrunk; conv 22.2 -> 20.3%; softmax 15.8 -> 14.5%;
    layer norm 13.1 -> 12.9%; element-wise 1.8% either way. Centring each (chip, data set)
    instead scored the same or worse (GEMM 16.2%)."""
    y = np.array(t.y, dtype=np.float64, copy=True)
    for c, med in chip_medians(t).items():
        y[t.chip == c] -= med
    return y


def chip_medians(t: KindTable) -> dict[str, float]:
    """Each GPU chip's median log(measured / analytic) over its rows of `t`: the board offsets
    centred_by_chip takes off (and card.json records)."""
    return medians_by_chip(t.y, t.chip)


def medians_by_chip(y: np.ndarray, chip: np.ndarray) -> dict[str, float]:
    """The median of `y` over each chip's rows, by chip name (sorted)."""
    return {c: float(np.median(y[chip == c])) for c in sorted(set(chip.tolist()))}


def fit_forest(t: KindTable, *, rounds: int = NUM_ROUNDS,
               params: dict[str, Any] | None = None) -> Forest:
    """Fit log(measured / analytic), centred per chip (centred_by_chip), on the rows of `t`
    (weighted)."""
    X = xgb()
    p = dict(FOREST_PARAMS)
    if params:
        p.update(params)
    d = X.DMatrix(t.X, label=centred_by_chip(t), weight=t.weight, missing=math.nan,
                  feature_names=t.features, nthread=p["nthread"])
    return Forest(X.train(p, d, num_boost_round=rounds), list(t.features))


def group_folds(groups: np.ndarray, k: int) -> list[np.ndarray]:
    """GroupKFold-style: the distinct groups, sorted, dealt into k folds by descending size
    (largest first to the currently smallest fold; ties by name), so folds are balanced and
    every group lies in exactly one. Returns a boolean test mask per fold."""
    names, counts = np.unique(groups, return_counts=True)
    order = sorted(range(len(names)), key=lambda i: (-counts[i], str(names[i])))
    sizes = [0] * k
    members: list[list[str]] = [[] for _ in range(k)]
    for i in order:
        j = min(range(k), key=lambda f: (sizes[f], f))
        sizes[j] += int(counts[i])
        members[j].append(str(names[i]))
    return [np.isin(groups.astype(str), m) for m in members if m]


def conformal_q(abs_residuals: np.ndarray, coverage: float) -> float:
    """Split-conformal quantile: the ceil((n+1) * coverage)-th smallest |residual| (the
    interval pred*exp(-q) .. pred*exp(q) then covers a new exchangeable row with probability
    >= coverage). inf if n is too small for that coverage."""
    r = np.sort(np.abs(np.asarray(abs_residuals, dtype=np.float64)))
    n = r.size
    rank = math.ceil((n + 1) * coverage)
    if n == 0 or rank > n:
        return math.inf
    return float(r[rank - 1])


def metrics(pred: np.ndarray, meas: np.ndarray, q: float | None = None) -> dict[str, float]:
    """MAPE, median and p90 absolute percentage error (in %), and, given a conformal q, the
    fraction of rows inside pred*exp(-q) .. pred*exp(q)."""
    ape = np.abs(pred - meas) / meas * 100.0
    out = {"n": int(ape.size), "mape": float(np.mean(ape)) if ape.size else math.nan,
           "median_ape": float(np.median(ape)) if ape.size else math.nan,
           "p90_ape": float(np.percentile(ape, 90)) if ape.size else math.nan}
    if q is not None:
        inside = np.abs(np.log(meas / pred)) <= q
        out["coverage"] = float(np.mean(inside)) if ape.size else math.nan
    return out
