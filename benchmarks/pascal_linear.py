"""nn.Linear on Pascal: the public NeuSight rows slow down with K and with the GEMM's size.

    .venv/bin/python benchmarks/pascal_linear.py          (~15 s on 2 cores)

Data: the public NeuSight nn.Linear and torch.bmm rows (shared/data/public/neusight-train,
PyTorch 2.1 / CUDA 12.1, FP32 with TF32 off) as kernel times (the event floor taken off, as
`blink train` does: blink.train.data.load_units), the kernel's grid from the same CSV rows.

Two tables of median measured / analytic, per GPU: by K (the reduction, nn.Linear's
in_features) and by the GEMM's operand + output bytes. nn.Linear rows only where the kernel
ran without a K split (gridDim.z = 1) and Blink's plan does not split either, so neither a
split count nor a reduce kernel is in the ratio; torch.bmm beside (cublasGemmStridedBatchedEx,
never split; NeuSight's bmm rows have K <= ~1000, so only the bytes table compares them).
A finding, not a rule (README, "Where the time model is weakest"). On the P100 and the P4 the
cublasLt kernels nn.Linear ran (maxwell_sgemm_*_tn, both operands K-contiguous) take
1.16x / 1.34x the plan at K <= 1024 and 2.5x / 3.0x at K > 16384; by bytes, 1.06x / 1.22x
under 64 MB and 1.56x / 3.1x over 1 GB, while their torch.bmm (maxwell_sgemm_128x64_nn) at the
same bytes stays at 0.85-1.07x. On the P100 K separates the slow rows better than size. The
V100's and A100's nn.Linear stay within 0.88-1.06x, the T4's 1.1-1.27x. The P100 holds its
boost clock under the power rule, so this is not the P4's power cap. A guess that fits the size
of it: in a long K loop the CTAs sharing an operand panel drift apart further than the small
Pascal L2 (4 MB / 2 MB) holds, each re-reads its panels from DRAM as scattered 32 B sectors (one
per K-contiguous row per K step), and a 64x64 tile's 16 FLOP/B is more than HBM2 or GDDR5 feeds
at that rate. Pascal is the only architecture that shows it and two of its boards are in the
data, so Blink does not fit it (one board would fit and the other be the whole check); it is
most of the P100's and P4's nn.Linear error in `blink evaluate`. Capping the plan's K split on
sm_6x (at 2-8 ways, or at 1-8 CTAs per SM) does not help (P100 nn.Linear 23.4% -> 22.8-29.5%,
DeepBench's Pascal GEMMs no better), nor does a GEMM forest given the panel-to-L2 ratio as a
feature (held-out GEMM MAPE 17.4 -> 17.2%, DeepBench 20.1 -> 21.8%; both tried 2026-12-05).
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from blink import data_public as dp  # noqa: E402
from blink.hardware import get_gpu  # noqa: E402
from blink.train import data as td  # noqa: E402

K_BINS = [(0, 1024), (1024, 4096), (4096, 8192), (8192, 16384), (16384, 10**9)]
MB = 2**20
FOOT_BINS = [(0, 64 * MB), (64 * MB, 256 * MB), (256 * MB, 1024 * MB), (1024 * MB, 10**13)]
GPUS = ["P100", "P4", "T4", "V100-PCIe", "A100-PCIe-40GB"]


def _labels(bins: list[tuple[int, int]], unit: int = 1, suffix: str = "") -> list[str]:
    return [f"{lo // unit}-{hi // unit}{suffix}" for lo, hi in bins[:-1]] + \
        [f">{bins[-1][0] // unit}{suffix}"]


def _bin(x: float, bins: list[tuple[int, int]], labels: list[str]) -> str:
    return next((lab for (lo, hi), lab in zip(bins, labels, strict=True) if lo < x <= hi), "?")


def _print(title: str, ratios: dict[tuple[str, str, str], list[float]], bins: list[str]) -> None:
    head = f"{'GPU':16} {'op':7}" + "".join(f" {b:>13}" for b in bins)
    print(title)
    print(head)
    print("-" * len(head))
    for gpu in GPUS:
        for fam in ("linear", "bmm"):
            cells = []
            for b in bins:
                v = ratios.get((gpu, fam, b), [])
                cells.append(f"{statistics.median(v):6.2f} ({len(v):4d})" if v else "-")
            print(f"{gpu:16} {fam:7}" + "".join(f" {c:>13}" for c in cells))
    print()


def main() -> int:
    try:
        root = td.public_root()
    except FileNotFoundError as e:
        print(e)
        return 1
    # The kernel grid of each nn.Linear row, by (GPU, dims); shapes repeat rarely, first wins.
    grid: dict[tuple[str, str], int] = {}
    names: dict[str, str] = {}
    for r in dp.load_family(root / "neusight-train", "linear"):
        name = names.setdefault(r.gpu, get_gpu(r.gpu).name)
        key = (name, "x".join(str(d) for d in r.dims))
        grid.setdefault(key, r.grid[2])
    k_labels, foot_labels = _labels(K_BINS), _labels(FOOT_BINS, MB, " MB")
    rows = td.load_units(root, neusight_rows_per_file=100000, neusight_mixed_rows=10)
    by_k: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    by_foot: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.dataset != "neusight-train" or r.family not in ("linear", "bmm"):
            continue
        dims = r.shape.split(":")[-1]
        k = int(r.feats["k"])  # the reduction (nn.Linear's in_features; dims are B, M, in, out)
        if r.family == "linear":
            z = grid.get((r.gpu, dims))
            if z != 1 or int(r.feats.get("split_k", 1)) != 1:
                continue
        ratio = r.measured_s / float(r.feats["analytic_time_s"])
        foot = float(r.feats["bytes_read"]) + float(r.feats["bytes_written"])
        by_k[(r.gpu, r.family, _bin(k, K_BINS, k_labels))].append(ratio)
        by_foot[(r.gpu, r.family, _bin(foot, FOOT_BINS, foot_labels))].append(ratio)
    what = ("median measured / analytic (rows); nn.Linear rows with no K split by cuBLAS or "
            "the plan")
    _print(f"{what}, by K", by_k, k_labels)
    _print(f"{what}, by operand + output bytes", by_foot, foot_labels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
