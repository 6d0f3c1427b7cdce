"""Training: public measurements -> the shipped predictor artifacts in models/.

    blink train                      # or: python -m blink.train
    blink evaluate                   # or: python -m blink.train.evaluation

XGBoost is needed here only (imported lazily); prediction reads the JSON artifacts from C++.
Modules: data (rows from the public sets, featured by the C++ core), fit (forests, folds,
conformal), units (held-out-GPU fits), timm_cache (the model-level set), model_level,
pipeline (writes models/), evaluation (the accuracy tables and figures; its `evaluate` is
re-exported here as blink.train.evaluate).
"""
from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "train"]


def train(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """blink.train.pipeline.train (see there)."""
    from .pipeline import train as _train

    return _train(*args, **kwargs)


def evaluate(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """blink.train.evaluation.evaluate (see there)."""
    from .evaluation import evaluate as _evaluate

    return _evaluate(*args, **kwargs)
