"""Per-unit forests: held-out-GPU fits and the out-of-fold residuals conformal needs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .data import KindTable
from .fit import Forest, fit_forest

__all__ = ["MIN_ROWS", "LogoResult", "logo", "logo_splits", "pair_train_mask"]

# A kind needs this many rows (and two GPUs) to get a forest; fewer stay analytic.
MIN_ROWS = 200


@dataclass
class LogoResult:
    """Leave-one-GPU(chip)-out: each row's prediction by the forest that never saw its chip."""

    kind: str
    chips: list[str]
    pred_s: np.ndarray                       # trees, out of fold
    forests: dict[str, Forest] = field(default_factory=dict)

    def log_residuals(self, t: KindTable) -> np.ndarray:
        return np.log(t.measured_s / self.pred_s)


def logo_splits(t: KindTable) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(held-out chip, train mask, test mask) per chip: every row of the chip is test, every
    other row is train."""
    out = []
    for c in sorted(set(t.chip.tolist())):
        test = t.chip == c
        out.append((c, ~test, test))
    return out


def logo(t: KindTable, rounds: int | None = None, keep_forests: bool = False) -> LogoResult:
    """Fit one forest per held-out chip on the other chips' rows."""
    chips = sorted(set(t.chip.tolist()))
    pred = np.full(len(t), math.nan)
    res = LogoResult(t.kind, chips, pred)
    if len(chips) < 2:
        return res
    for c, train, test in logo_splits(t):
        kw = {} if rounds is None else {"rounds": rounds}
        f = fit_forest(t.subset(train), **kw)
        pred[test] = f.predict_s(t.subset(test))
        if keep_forests:
            res.forests[c] = f
    return res


def pair_train_mask(t: KindTable, calibration_chip: str, held_out: str) -> np.ndarray:
    """Rows a calibration forest for `held_out` is fitted on: neither the test chip nor the
    calibration chip (whose residuals it supplies), so no calibration residual comes from a
    model that saw either."""
    return (t.chip != calibration_chip) & (t.chip != held_out)
