"""The public NeuSight training set: loading its CSVs and mapping each row to the ATen op it ran.

The data (``shared/data/public/neusight-train/`` in this repository's workspace; see its
README.md) are per-kernel latencies of PyTorch 2.1 ops on five NVIDIA GPUs, FP32 with TF32 off,
published with NeuSight (ASPLOS 2025, github.com/sitar-lab/NeuSight, MIT licence). Each row is
the mean of the fastest 5 of 25 CUDA-event-timed runs, in milliseconds.

Shape columns follow NeuSight's collector (``neusight/Dataset/collect.py``), not the usual GEMM
letters:

- ``bmm`` (B, M, N, K): ``torch.bmm(randn(B, M, N), randn(B, N, K))``, so N is the contracted
  dimension. Mapped to ``aten::bmm`` of (B, M, N) x (B, N, K) -> (B, M, K).
- ``linear`` (B, M, N, K): ``nn.Linear(N, K, bias=True)`` on a (B, M, N) input (B is always 1).
  ``aten::linear`` folds a contiguous 3-D input with a bias into one ``aten::addmm(bias (K,),
  x.view(B*M, N), weight.t())``, the weight's transpose being a (N, K) view with strides (1, N);
  the kernels column shows one cuBLAS(Lt) sgemm ``*_tn`` with the bias in its epilogue (no
  separate bias kernel), plus a split-K reduce kernel on some rows.
- ``elem`` (B, H): binary ``add / mul / pow / div`` are ``aten::<op>.Tensor`` (``pow``:
  ``Tensor_Tensor``) of two (B, H) tensors; the ``u`` forms take a Python float, which
  ``torch.add / mul / div`` pass as a wrapped 0-dim CPU tensor (``aten::<op>.Tensor``; the kernels
  are the CPU-scalar functors) and ``torch.pow`` as ``aten::pow.Tensor_Scalar``; ``relu`` is
  ``aten::relu`` (a clamp_min kernel), ``gelu`` ``aten::gelu(approximate='none')``, ``tanh``
  ``aten::tanh``. The scalar's value was random in (0, 1] and is not recorded; it does not change
  the cost.
- ``ln`` (B, H): ``nn.LayerNorm(H)`` -> ``aten::native_layer_norm`` over H with weight and bias,
  writing the (B, H) output and (B, 1) mean and rstd.
- ``softmax`` (B, H): ``nn.Softmax()`` with the implicit dim, 1 for a 2-D input ->
  ``aten::_softmax(x, 1, False)``.
"""
from __future__ import annotations

import csv
import gzip
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICES",
    "FAMILIES",
    "MappedOp",
    "Row",
    "data_dir",
    "family_files",
    "load_family",
    "map_row",
    "predict",
]

# Every kernel-launch family of the set, in report order.
FAMILIES = ("bmm", "linear", "elem", "ln", "softmax")

# The CSV's Device column -> the name blink.hardware.get_gpu knows it by (an alias).
DEVICES: dict[str, str] = {
    "Tesla P4": "Tesla P4",
    "Tesla P100-PCIE-16GB": "Tesla P100-PCIE-16GB",
    "Tesla T4": "Tesla T4",
    "Tesla V100-PCIE-32GB": "Tesla V100-PCIE-32GB",
    "NVIDIA A100-PCIE-40GB": "NVIDIA A100-PCIE-40GB",
}

_SHAPE_COLUMNS = {"bmm": ("B", "M", "N", "K"), "linear": ("B", "M", "N", "K"),
                  "elem": ("B", "H"), "ln": ("B", "H"), "softmax": ("B", "H")}
_MIXED_FILES = {"elem": "elem.csv.gz", "ln": "ln.csv.gz", "softmax": "softmax.csv.gz"}

# blink::ArgKind codes of the raw trace format, c10::ScalarType float32, c10::DeviceType CPU.
_TENSOR, _INT, _DOUBLE, _BOOL, _STRING, _INT_LIST = 1, 3, 4, 5, 6, 7
_F32 = 6
_CPU = 0
_LN_EPS = 1e-5
# Stand-in for the random exponent / operand of the `u` forms (not recorded in the data).
_SCALAR = 0.75

_ELEM_BINARY = {"add": "aten::add.Tensor", "mul": "aten::mul.Tensor",
                "div": "aten::div.Tensor", "pow": "aten::pow.Tensor_Tensor"}
_ELEM_WRAPPED_SCALAR = {"addu": "aten::add.Tensor", "mulu": "aten::mul.Tensor",
                        "divu": "aten::div.Tensor"}
_ELEM_UNARY = {"relu": "aten::relu", "tanh": "aten::tanh"}


@dataclass(frozen=True)
class Row:
    """One measured kernel: its family and op, the GPU, the shape columns and the latency."""

    family: str            # one of FAMILIES
    op: str                # the CSV's OPName (add, addu, ..., bmm, linear, ln, softmax)
    device: str            # the CSV's Device column
    dims: tuple[int, ...]  # (B, M, N, K) for bmm / linear, (B, H) otherwise
    latency_s: float       # the CSV's Latency, converted from ms
    kernel: str            # the CSV's Kernel Name (the kernel NeuSight matched)
    kernels: tuple[str, ...]  # every kernel the op launched (lower-cased by NeuSight)
    grid: tuple[int, int, int]   # the matched kernel's grid (CTAs in x, y, z)
    block: tuple[int, int, int]  # and its CTA shape (threads in x, y, z)

    @property
    def gpu(self) -> str:
        """The blink.hardware name of the row's GPU."""
        return DEVICES[self.device]


@dataclass(frozen=True)
class MappedOp:
    """The ATen op a row ran, with raw-format arguments for blink.cost.unit_features."""

    op_name: str
    inputs: list[Any]
    outputs: list[Any]


def data_dir(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The data set's folder: `root` if given, else ``../shared/data/public/neusight-train``
    beside this repository, else ``/work/shared/...``; None if none of them exists."""
    if root is not None:
        p = Path(root)
        return p if p.is_dir() else None
    rel = Path("shared") / "data" / "public" / "neusight-train"
    for base in (Path(__file__).resolve().parents[2], Path("/work")):
        if (base / rel).is_dir():
            return base / rel
    return None


def family_files(root: Path, family: str, device: str | None = None) -> list[Path]:
    """The CSV files holding `family` (for bmm / linear one per GPU, `device` picks one)."""
    if family in _MIXED_FILES:
        return [root / _MIXED_FILES[family]]
    if family not in ("bmm", "linear"):
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    devices = [device] if device is not None else list(DEVICES)
    return [root / "collect" / family / "p2.1.0" / (d.replace(" ", "_") + ".csv.gz")
            for d in devices]


def _read(path: Path, family: str) -> Iterator[Row]:
    shape = _SHAPE_COLUMNS[family]
    with gzip.open(path, "rt", newline="") as fh:
        for rec in csv.DictReader(fh):
            kernel = rec["Kernel Name"]
            launched = tuple(k for k in (rec.get("Kernels") or "").split(";") if k)
            yield Row(family=family, op=rec["OPName"], device=rec["Device"].strip(),
                      dims=tuple(int(rec[c]) for c in shape),
                      latency_s=float(rec["Latency"]) * 1e-3, kernel=kernel,
                      kernels=launched or (kernel,),
                      grid=(int(rec["Grid x"]), int(rec["Grid y"]), int(rec["Grid z"])),
                      block=(int(rec["Block x"]), int(rec["Block y"]), int(rec["Block z"])))


def load_family(root: Path, family: str, device: str | None = None,
                max_rows_per_file: int | None = None, seed: int = 0) -> list[Row]:
    """Rows of one family (optionally of one CSV Device), in file order. With
    `max_rows_per_file`, each file (after the device filter) is sampled down to that many rows
    with random.Random(seed), keeping file order."""
    if device is not None and device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {sorted(DEVICES)}")
    out: list[Row] = []
    for path in family_files(root, family, device):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing from the NeuSight data set")
        rows = [r for r in _read(path, family) if device is None or r.device == device]
        if max_rows_per_file is not None and len(rows) > max_rows_per_file:
            keep = sorted(random.Random(seed).sample(range(len(rows)), max_rows_per_file))
            rows = [rows[i] for i in keep]
        out.extend(rows)
    return out


class _Storages:
    """Distinct storage ids, as a trace gives them: < 0 for inputs, > 0 for outputs."""

    def __init__(self) -> None:
        self._inputs = 0
        self._outputs = 0

    def tensor(self, shape: tuple[int, ...], stride: tuple[int, ...] | None = None,
               output: bool = False) -> tuple[int, tuple]:
        from .cost import tensor_arg

        if output:
            self._outputs += 1
            sid = self._outputs
        else:
            self._inputs -= 1
            sid = self._inputs
        return tensor_arg(shape, _F32, stride, sid)

    def wrapped_scalar(self) -> tuple[int, tuple]:
        """A Python number passed for a Tensor parameter: a 0-dim CPU tensor."""
        self._inputs -= 1
        return (_TENSOR, ((), (), 0, self._inputs, 4, _F32, _CPU, False))


def map_row(row: Row) -> MappedOp:
    """The ATen op (name and raw arguments) that PyTorch ran on CUDA for the row."""
    s = _Storages()
    if row.family == "bmm":
        b, m, n, k = row.dims
        return MappedOp("aten::bmm", [s.tensor((b, m, n)), s.tensor((b, n, k))],
                        [s.tensor((b, m, k), output=True)])
    if row.family == "linear":
        b, m, n, k = row.dims
        # addmm(bias, input.view(B*M, N), weight.t(), beta=1, alpha=1); weight is (K, N).
        return MappedOp("aten::addmm",
                        [s.tensor((k,)), s.tensor((b * m, n)), s.tensor((n, k), (1, n)),
                         (_INT, 1), (_INT, 1)],
                        [s.tensor((b * m, k), output=True)])
    b, h = row.dims
    if row.family == "ln":
        return MappedOp("aten::native_layer_norm",
                        [s.tensor((b, h)), (_INT_LIST, [h]), s.tensor((h,)), s.tensor((h,)),
                         (_DOUBLE, _LN_EPS)],
                        [s.tensor((b, h), output=True), s.tensor((b, 1), output=True),
                         s.tensor((b, 1), output=True)])
    if row.family == "softmax":
        return MappedOp("aten::_softmax", [s.tensor((b, h)), (_INT, 1), (_BOOL, False)],
                        [s.tensor((b, h), output=True)])
    if row.family != "elem":
        raise ValueError(f"unknown family {row.family!r}")
    op = row.op
    if op in _ELEM_BINARY:
        inputs = [s.tensor((b, h)), s.tensor((b, h))]
        if op == "add":
            inputs.append((_INT, 1))  # alpha
        return MappedOp(_ELEM_BINARY[op], inputs, [s.tensor((b, h), output=True)])
    if op in _ELEM_WRAPPED_SCALAR:
        inputs = [s.tensor((b, h)), s.wrapped_scalar()]
        if op == "addu":
            inputs.append((_INT, 1))  # alpha
        return MappedOp(_ELEM_WRAPPED_SCALAR[op], inputs, [s.tensor((b, h), output=True)])
    if op == "powu":
        return MappedOp("aten::pow.Tensor_Scalar", [s.tensor((b, h)), (_DOUBLE, _SCALAR)],
                        [s.tensor((b, h), output=True)])
    if op == "gelu":
        return MappedOp("aten::gelu", [s.tensor((b, h)), (_STRING, "none")],
                        [s.tensor((b, h), output=True)])
    if op in _ELEM_UNARY:
        return MappedOp(_ELEM_UNARY[op], [s.tensor((b, h))], [s.tensor((b, h), output=True)])
    raise ValueError(f"elem op {op!r} has no ATen mapping")


def predict(row: Row, allow_tf32_matmul: bool = False) -> dict[str, Any]:
    """blink.cost.unit_features of the row's op on the row's GPU (the data ran TF32 off)."""
    from .cost import unit_features

    m = map_row(row)
    f = unit_features(m.op_name, m.inputs, m.outputs, row.gpu,
                      allow_tf32_matmul=allow_tf32_matmul)
    for key in ("roofline_time_s", "analytic_time_s"):
        v = f[key]
        if not (isinstance(v, float) and math.isfinite(v)):
            raise ValueError(f"{m.op_name} {row.dims} on {row.gpu}: {key} = {v!r}")
    return f
