"""Which unit kinds the RTX 3090's training steps say Blink over- or under-costs.

    .venv/bin/python benchmarks/timm_train_kinds.py [--cache FILE]     (~2 s)

Data: the public timm RTX 3090 AMP training steps (shared/data/public/timm-rtx3090; torch 1.12,
cuDNN 8.3, SGD with momentum) as blink's training cache holds them (data/derived; rebuilt by
``python -m blink.train.timm_cache --mode train``), with each model's analytic time summed per
unit kind. The measured step time is regressed on those sums (relative least squares, as
benchmarks/timm_conv_classes.py does for inference convolutions): a weight is what the
measurements weigh that kind's predicted time by, 1 where Blink is right on average, above 1
where it under-costs it. Intervals: 5th-95th percentile over bootstrap resamples of whole
families. No value of Blink is fitted here; it is the check of rules derived elsewhere (the
backward warp softmax's rate, csrc/include/blink/roofline.h kWarpSoftmaxSlowdown; the cache's
torch 1.12 optimizer step, blink.dryrun.torch112_sgd_step).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from timm_conv_classes import print_weights  # noqa: E402

# Kinds with a column of their own; the rest (embedding, other, reduction) are summed.
GROUPS = {
    "gemm": ("gemm",),
    "conv": ("conv",),
    "norm": ("norm",),
    "elementwise": ("elementwise",),
    "copy": ("copy",),
    "softmax+attention": ("softmax", "attention"),
    "rest": ("reduction", "embedding", "other"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=None, help="a training cache file (default: the shipped)")
    a = ap.parse_args()
    from blink.train import timm_cache as tc

    rows = (tc.load_cache(Path(a.cache)) if a.cache else tc.load_cache(mode="train"))
    X = np.array([[sum(r[f"t_{k}"] for k in kinds) for kinds in GROUPS.values()] for r in rows])
    y = np.array([r["measured_ms"] for r in rows])
    fam = np.array([r["family"] for r in rows])
    analytic = np.array([r["time_ms"] for r in rows])
    print(f"timm-rtx3090 training steps: {len(rows)} models, {len(np.unique(fam))} families")
    print_weights("kind", list(GROUPS), X, y, fam, analytic, width=20, weight_label="weight")


if __name__ == "__main__":
    main()
