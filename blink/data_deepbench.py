"""The public DeepBench kernel timings (NVIDIA results): loading the CSVs and mapping each row to
the ATen op PyTorch would run for it.

The data (``shared/data/public/deepbench/`` in this repository's workspace; see its README.md)
are Baidu DeepBench's measured GEMM, convolution and RNN kernel times on eight NVIDIA GPUs
(Maxwell to Turing, CUDA 7.5-10.1, cuDNN 5-7.6; Apache-2.0). Each ``time_us`` is the mean of R
back-to-back calls after a warm-up, so launch overhead is mostly hidden: a kernel time, not an
event-timed eager call.

Mapping (what PyTorch's CUDA backend runs for the same problem):

- ``gemm`` rows (column-major ``C(m x n) = op(A) op(B)``): the ``aten::mm`` whose cuBLAS call
  this is (PyTorch passes its row-major operands swapped, so ``mm`` of an (n, k) by a (k, m)
  matrix; a ``T`` operand is a transposed view).
- ``conv`` rows: ``fwd`` is ``aten::convolution`` (input (n, c, h, w), weight (k, c, r, s), no
  bias, dilation 1, groups 1); ``bwd_data`` / ``bwd_filter`` are ``aten::convolution_backward``
  with output_mask (1, 0, 0) / (0, 1, 0). ``fp16_tc`` rows ran NHWC in the benchmark, so their
  tensors are channels-last here; every other row is NCHW.
- ``precision``: ``fp32`` -> float32 with TF32 off (these GPUs have none); ``fp16`` (P100
  "pseudo fp16": fp16 storage, fp32 math) and ``fp16_tc`` -> float16, which Blink costs on
  tensor cores where the GPU has them (sm_70+) and at the FP32 rate before. ``int8`` rows are
  not mapped (PyTorch runs no int8 cuDNN convolution or cuBLAS GEMM for nn modules).

Caveats from the README that matter for accuracy: with tensor cores the benchmark forced
IMPLICIT_PRECOMP_GEMM forward and ALGO_1 backward (not what cuDNN's heuristics or
cudnn.benchmark would pick), and cuDNN 5-7 is old; compare fp16_tc backward rows with care.
"""
from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .train.data import DEEPBENCH_GPUS, deepbench_conv_op, deepbench_gemm_op

__all__ = ["DEVICES", "FAMILIES", "Row", "data_dir", "load", "map_row", "predict"]

FAMILIES = ("gemm", "conv")

# The CSV's gpu column -> the blink.hardware name: the training mapping's table.
DEVICES: dict[str, str] = dict(DEEPBENCH_GPUS)

_DTYPE = {"fp32": 6, "fp16": 5, "fp16_tc": 5}


@dataclass(frozen=True)
class Row:
    family: str          # gemm | conv
    gpu_csv: str         # the CSV's gpu column
    precision: str       # fp32 | fp16 | fp16_tc
    direction: str       # gemm: "fwd"; conv: fwd | bwd_data | bwd_filter
    shape: dict[str, Any]
    time_s: float
    algo: str            # cuDNN forward algorithm the workbook names ("" if none)

    @property
    def gpu(self) -> str:
        return DEVICES[self.gpu_csv]


def data_dir(root: str | Path | None = None) -> Path | None:
    """The data set's folder: `root`, else ``../shared/data/public/deepbench`` beside this
    repository, else ``/work/shared/...``; None if none exists."""
    if root is not None:
        p = Path(root)
        return p if p.is_dir() else None
    rel = Path("shared") / "data" / "public" / "deepbench"
    for base in (Path(__file__).resolve().parents[2], Path("/work")):
        if (base / rel).is_dir():
            return base / rel
    return None


def load(root: Path, family: str) -> Iterator[Row]:
    """The training-mode rows of `family` on GPUs the hardware table has, precisions mapped."""
    if family not in FAMILIES:
        raise ValueError(f"unknown DeepBench family {family!r}; expected one of {FAMILIES}")
    path = root / f"{family}.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the DeepBench data set")
    with gzip.open(path, "rt", newline="") as fh:
        for rec in csv.DictReader(fh):
            if rec["mode"] != "train" or rec["gpu"] not in DEVICES:
                continue
            if rec["precision"] not in _DTYPE:
                continue
            if family == "gemm":
                shape = {k: int(rec[k]) for k in ("m", "n", "k")}
                shape["a_trans"], shape["b_trans"] = rec["a_trans"], rec["b_trans"]
                direction, algo = "fwd", ""
            else:
                shape = {k: int(rec[k]) for k in ("n", "c", "h", "w", "k", "r", "s", "pad_h",
                                                 "pad_w", "stride_h", "stride_w", "out_h",
                                                 "out_w")}
                direction, algo = rec["direction"], rec["algo"]
            yield Row(family, rec["gpu"], rec["precision"], direction, shape,
                      float(rec["time_us"]) * 1e-6, algo)


def map_row(row: Row) -> tuple[str, list, list]:
    """(ATen op name, raw inputs, raw outputs) PyTorch would run for the row: the mapping
    blink.train uses for its DeepBench rows (blink/train/data.py), so both see the same op."""
    dt = _DTYPE[row.precision]
    s = row.shape
    if row.family == "gemm":
        return deepbench_gemm_op(s["m"], s["n"], s["k"], s["a_trans"], s["b_trans"], dt)
    return deepbench_conv_op(s, row.direction, dt, row.precision == "fp16_tc")


def predict(row: Row, cudnn_benchmark: bool = True) -> dict[str, Any]:
    """blink.cost.unit_features of the row's op on its GPU. DeepBench chose algorithms with
    cudnnFind* (measured), hence cudnn_benchmark=True; these GPUs have no TF32. Its times are
    the mean of a loop of repeats, which keeps a power-capped board at its sustained clock: no
    boost window (blink.hardware.BOOST_WINDOW_S)."""
    from .cost import unit_features

    op, ins, outs = map_row(row)
    return unit_features(op, ins, outs, row.gpu, allow_tf32_matmul=False,
                         allow_tf32_cudnn=False, cudnn_benchmark=cudnn_benchmark,
                         boost_window_s=0.0)
