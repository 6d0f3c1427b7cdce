"""python -m blink.train: fit the forests and the conformal table into models/."""
from __future__ import annotations

import argparse
import sys


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", default=None, help="the shared/data/public folder "
                    "(default: ../shared/data/public beside the repository)")
    ap.add_argument("--out", default=None, help="artifact folder (default models/)")
    ap.add_argument("--timm-cache", default=None,
                    help="model-level cache (default data/derived/timm_rtx3090_infer.csv.gz)")
    ap.add_argument("--timm-graphs", default=None,
                    help="the GNN's graph cache (default data/derived/timm_rtx3090_graphs.npz)")
    ap.add_argument("--timm-train-cache", default=None,
                    help="training-step cache (default data/derived/timm_rtx3090_train.csv.gz)")
    ap.add_argument("--refresh-timm", action="store_true",
                    help="re-trace the timm models: the model-level cache, then the graphs with "
                    "the forests just fitted, then the training steps (after cost-model "
                    "changes; about 25 minutes)")
    ap.add_argument("--rows-per-file", type=int, default=6000,
                    help="NeuSight bmm/linear rows per GPU file (default 6000)")
    ap.add_argument("--mixed-rows", type=int, default=None,
                    help="NeuSight elem/ln/softmax rows per file (default: all)")
    ap.add_argument("--rounds", type=int, default=None, help="boosting rounds per forest")
    ap.add_argument("--nthread", type=int, default=2,
                    help="XGBoost threads: a speed setting only, the artifacts are the same")


def add_evaluate_arguments(ap: argparse.ArgumentParser) -> None:
    """`blink evaluate`'s arguments, defined here so that building the CLI imports neither numpy
    nor xgboost (blink/train/evaluation.py does)."""
    ap.add_argument("--data", default=None, help="the shared/data/public folder")
    ap.add_argument("--out", default=None,
                    help="output folder (default benchmarks/results/accuracy)")
    ap.add_argument("--timm-cache", default=None, help="the timm cache (data/derived/...)")
    ap.add_argument("--timm-train-cache", default=None,
                    help="training-step cache (default data/derived/timm_rtx3090_train.csv.gz)")
    ap.add_argument("--rows-per-file", type=int, default=6000,
                    help="NeuSight bmm/linear rows per GPU file (default 6000)")
    ap.add_argument("--mixed-rows", type=int, default=None,
                    help="NeuSight elem/ln/softmax rows per file (default: all)")
    ap.add_argument("--rounds", type=int, default=120, help="boosting rounds (default 120, "
                    "blink.train.fit.NUM_ROUNDS)")
    ap.add_argument("--nthread", type=int, default=2, help="XGBoost threads (speed only)")
    ap.add_argument("--timm-graphs", default=None,
                    help="the GNN's graph cache (default data/derived/timm_rtx3090_graphs.npz)")
    ap.add_argument("--no-gnn", action="store_true",
                    help="skip the GNN rows (10 GNN fits, a few minutes)")
    ap.add_argument("--no-figures", action="store_true")


def run(a: argparse.Namespace) -> int:

    from .fit import NUM_ROUNDS, set_threads
    from .pipeline import train

    set_threads(a.nthread)
    cmd = "blink train" + (f" --rows-per-file {a.rows_per_file}" if a.rows_per_file != 6000
                           else "") + (f" --mixed-rows {a.mixed_rows}" if a.mixed_rows else "")
    train(a.data, a.out, neusight_rows_per_file=a.rows_per_file,
          neusight_mixed_rows=a.mixed_rows,
          rounds=a.rounds or NUM_ROUNDS, timm_cache=a.timm_cache, timm_graphs=a.timm_graphs,
          timm_train_cache=a.timm_train_cache, refresh_timm=a.refresh_timm, command=cmd)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blink.train", description=__doc__)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
