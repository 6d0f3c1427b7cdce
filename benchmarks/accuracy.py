"""Accuracy of Blink's time predictors on held-out GPUs, families and batch sizes, in one run.

    .venv/bin/python benchmarks/accuracy.py [--out DIR] [--nthread 1] [--no-figures]

The same as `blink evaluate` (blink/train/evaluation.py says what each split holds out):
per-unit kernels of the public NeuSight and DeepBench sets leave-one-GPU-out and above the
trained batch sizes (roofline, analytic, trees), and whole timm models on an RTX 3090 with
held-out families (roofline, analytic, trees, GNN, trees + GNN, whole-model baseline,
model-level correction; each with its MAPE as a ratio of the roofline's). MAPE,
median and p90 absolute percentage error, and the coverage of the 90% conformal intervals.
Writes accuracy.txt, results.json and PNG figures to benchmarks/results/accuracy/.
"""
from __future__ import annotations

import sys

from blink.train.evaluation import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
