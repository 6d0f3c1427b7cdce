"""What the benchmarks share: the speed benchmarks' models and median timer, and the MAPE of
(measured, predicted) pairs the accuracy ones print."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# The foundation issue's benchmark cases: model, trace_model/prepare keyword arguments.
CASES = [
    ("torchvision:resnet50", {"batch_size": 32}),
    ("hf:bert-base", {"batch_size": 8, "seq_len": 512}),
    ("hf:llama-7b", {"batch_size": 1, "seq_len": 2048}),
]


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mape_pct(pairs: Iterable[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (measured, predicted) pairs, in %."""
    return 100.0 * statistics.fmean(abs(p / t - 1.0) for t, p in pairs)


def public_root_or_none() -> Path | None:
    """The public data folder (blink.train.data.public_root), or None after saying why not."""
    from blink.train.data import public_root

    try:
        return public_root()
    except FileNotFoundError as e:
        print(e)
        return None
