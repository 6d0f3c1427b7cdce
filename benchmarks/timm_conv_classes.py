"""Which convolutions the RTX 3090's whole-model times say Blink over- or under-costs.

    .venv/bin/python benchmarks/timm_conv_classes.py          (~3 minutes on 2 cores)

Data: the public timm RTX 3090 AMP inference times (shared/data/public/timm-rtx3090, as blink's
timm caches in data/derived hold them; torch 2.4, cuDNN 9), NCHW and channels-last. For every
cached model whose analytic time is at least 30% convolutions, each convolution unit's analytic
time is put in one class (RGB stem, 1x1, 1x1 strided, kxk dense, grouped, depthwise; the NCHW
<-> NHWC transposes of the plan apart, as "transposes"), and the measured step time is
regressed on those class sums plus the memory-bound kinds (element-wise, norm, reduction, copy)
and the rest, with relative least squares. A coefficient is what the measurements weigh that
class's predicted time by: 1 where Blink is right on average, below 1 where it over-costs it.
Intervals: 5th-95th percentile over 300 bootstrap resamples of whole families (the set is
grouped by family everywhere else too). No fitted value of Blink comes from here: the
tensor-core relief of the implicit-GEMM loss (csrc/include/blink/kernel_plan.h,
kConvVsGemmEfficiency) is derived, and this table is its check, run before and after.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from multiprocessing import Pool
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

warnings.filterwarnings("ignore")

MODES = {"inference": "NCHW", "inference-nhwc": "channels-last"}
CLASSES = ("stem", "pw", "pw_s2", "dense", "grouped", "dw", "transposes")
MIN_CONV_SHARE = 0.3
BOOTSTRAP = 300


def conv_class(f: dict) -> str:
    """The class of a forward convolution unit's features."""
    c, g = f["conv_c"], f["groups"]
    if c <= 4:
        return "stem"
    if g > 1:
        return "dw" if g == c else "grouped"
    if f["conv_r"] == 1 and f["conv_s"] == 1:
        return "pw" if f["stride_h"] == 1 else "pw_s2"
    return "dense"


def _classes(job: tuple[str, int, int, str]) -> dict[str, float] | None:
    """Per-class analytic conv ms of one cached benchmark row (None if it no longer builds)."""
    from blink.cost import trace_features
    from blink.hardware import get_gpu
    from blink.train import timm_cache as tc

    name, img, batch, mode = job
    try:
        t, _ = tc.build_model(name, batch, img, None, mode)
    except Exception:  # noqa: BLE001 - a row that fails to build is skipped, as the cache does
        return None
    gpu = get_gpu(tc.GPU)
    stream_bw = gpu.memory_bandwidth_bytes_per_s * gpu.dram_efficiency
    out = {k: 0.0 for k in CLASSES}
    for f in trace_features(t, gpu, allow_tf32_matmul=True, allow_tf32_cudnn=True,
                            cudnn_benchmark=True):
        if f["kind"] != "conv":
            continue
        aux_ms = f["aux_bytes"] / stream_bw * 1e3
        out[conv_class(f)] += f["analytic_time_s"] * 1e3 - aux_ms
        out["transposes"] += aux_ms
    return out


def _fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    w = 1.0 / y
    return np.linalg.lstsq(X * w[:, None], y * w, rcond=None)[0]


def weigh(X: np.ndarray, y: np.ndarray, fam: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Relative least-squares weights of the columns of X for the measured times y, and their
    5th / 95th percentiles over BOOTSTRAP resamples of whole families."""
    coef = _fit(X, y)
    rng = np.random.default_rng(0)
    fams = np.unique(fam)
    boot = []
    for _ in range(BOOTSTRAP):
        idx = np.concatenate([np.flatnonzero(fam == f) for f in rng.choice(fams, len(fams))])
        boot.append(_fit(X[idx], y[idx]))
    lo, hi = np.percentile(np.array(boot), [5, 95], axis=0)
    return coef, lo, hi


def print_weights(label: str, names: list[str], X: np.ndarray, y: np.ndarray, fam: np.ndarray,
                  analytic: np.ndarray, width: int = 14, weight_label: str = "coef") -> None:
    """The table of weigh's weights (with each column's share of the analytic time) and the
    analytic MAPE / median measured over analytic of the rows."""
    coef, lo, hi = weigh(X, y, fam)
    share = X.sum(0) / X.sum()
    print(f"{label:<{width}}{'share':>8}{weight_label:>8}{'p5':>8}{'p95':>8}")
    for i, n in enumerate(names):
        print(f"{n:<{width}}{share[i]:>8.3f}{coef[i]:>8.3f}{lo[i]:>8.3f}{hi[i]:>8.3f}")
    print(f"analytic MAPE {100 * np.mean(np.abs(analytic / y - 1)):.2f}%, median measured / "
          f"analytic {np.median(y / analytic):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-models", type=int, default=0, help="first N qualifying rows (0: all)")
    a = ap.parse_args()
    from blink.train import timm_cache as tc

    for mode, layout in MODES.items():
        rows = [r for r in tc.load_cache(mode=mode)
                if r["t_conv"] >= MIN_CONV_SHARE * sum(r[f"t_{k}"] for k in tc.MODEL_KINDS)]
        if a.max_models:
            rows = rows[: a.max_models]
        jobs = [(r["model"], int(r["img_size"]), int(r["batch"]), mode) for r in rows]
        with Pool(2) as pool:
            got = pool.map(_classes, jobs, chunksize=4)
        kept = [(r, c) for r, c in zip(rows, got, strict=True) if c is not None]
        names = [*CLASSES, "memory-bound", "rest"]
        X = np.array([[c[k] for k in CLASSES]
                      + [sum(r[f"t_{k}"] for k in ("elementwise", "norm", "reduction", "copy")),
                         sum(r[f"t_{k}"] for k in ("gemm", "attention", "softmax", "embedding",
                                                   "other"))]
                      for r, c in kept])
        y = np.array([r["measured_ms"] for r, _ in kept])
        fam = np.array([r["family"] for r, _ in kept])
        analytic = np.array([r["time_ms"] for r, _ in kept])
        print(f"\n{layout}: {len(kept)} timm models with >= {MIN_CONV_SHARE:.0%} of their "
              f"analytic time in convolutions, {len(np.unique(fam))} families")
        print_weights("class", names, X, y, fam, analytic)


if __name__ == "__main__":
    main()
