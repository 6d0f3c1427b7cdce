"""Training rows from the public kernel timings: each measured kernel mapped to the ATen op it ran,
costed by the C++ core (blink._C.features_for via blink.cost), with the GPU's hardware fields.

Sources (``shared/data/public/`` in this workspace; read each README):

- ``neusight-train``: PyTorch 2.1 FP32 (TF32 off) bmm / linear / elementwise / layer norm /
  softmax on five GPUs; rows mapped by :mod:`blink.data_public`.
- ``deepbench``: Baidu DeepBench cuBLAS GEMM and cuDNN convolution (fwd, bwd_data, bwd_filter),
  training workbooks, precisions ``fp32`` and ``fp16_tc``; mapped here to ``aten::mm``,
  ``aten::convolution`` and ``aten::convolution_backward``. Older CUDA/cuDNN (7.5-10.1): its rows
  get a lower sample weight where newer data exists for the same unit kind (GEMM).

A row's target is log(measured / analytic): the trees learn the correction to the analytic model,
which keeps their output bounded on shapes, batches and GPUs outside the training range.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import data_public
from ..collect.dataset import sha256_file
from ..cost import _C, core_gpu_fields, tensor_arg, unit_features

__all__ = [
    "DEEPBENCH_GPUS",
    "GPU_FEATURES",
    "MATH_MODES",
    "KindTable",
    "UnitSample",
    "chip_of",
    "dataset_files",
    "feature_vector",
    "gpu_features",
    "load_deepbench",
    "load_neusight",
    "load_units",
    "public_root",
    "sha256_file",
    "shape_half",
    "tables_by_kind",
]

# blink::MathMode, in enum order (csrc/include/blink/features.h): feature_values() gives the
# enum's integer, features_for() its name. The forests take neither (_NOT_FOREST_INPUTS); the
# card lists, in this order, the modes a forest's rows hold.
MATH_MODES = ("fp32_simt", "tf32", "bf16_tc", "fp16_tc", "fp8_tc", "other", "3xtf32")

# Hardware fields of a row's GPU (ARTIFACTS.md), from the same GpuSpec fields the core uses.
GPU_FEATURES = ("gpu_sm_count", "gpu_clock_hz", "gpu_mem_bw", "gpu_l2_bytes", "gpu_peak_fp32",
                "gpu_peak_tf32", "gpu_peak_bf16", "gpu_peak_fp16", "gpu_peak_fp8", "gpu_cc")

# Keys of features_for() that are not inputs of a forest: the unit kind (one forest per kind)
# and the host-side dispatch time (not a GPU-time feature; not in blink::feature_values), and
# the permuted-access and warp-softmax flags (analytic_time_s applies them; the forests see
# their time).
_NOT_FEATURES = ("kind", "host_dispatch_time_s", "error", "permuted", "warp_softmax")

# Unit fields the forests do not take although the core computes them: the dtype (c10
# ScalarType code) and the math mode (blink::MathMode code) are enum codes whose order means
# nothing. The training rows hold two precisions only (fp32 on CUDA cores, fp16 on tensor
# cores), so a cut on either code sent a precision the rows lack to whichever side its number
# fell: bf16 (ScalarType 15, MathMode 2) and TF32 (MathMode 1) convolutions went down the FP32
# SIMT branch although cuDNN runs them as tensor-core implicit GEMMs, like fp16. "tensor_core"
# (blink::feature_values) says the same as the two codes on the training rows and puts every
# tensor-core mode on the tensor-core side; the element size is in the byte counts.
_NOT_FOREST_INPUTS = ("dtype", "math_mode")

# DeepBench's gpu column -> blink.hardware name. The workbooks do not say which board variant
# ran; the DGX-1 V100 is SXM2 ("V100"), the P100 is taken as the PCIe part the table has.
DEEPBENCH_GPUS: dict[str, str] = {
    "Tesla P100": "P100",
    "Tesla V100": "V100",
    "Tesla T4": "T4",
    "GeForce GTX 1080 Ti": "GTX1080Ti",
    "TITAN Xp": "TITANXp",
    "TITAN X (Pascal)": "TITANX-Pascal",
}

# Board variants of one chip count as one GPU for held-out-GPU splits (a V100 PCIe in training
# says much about a V100 SXM2).
_CHIPS = {"V100-PCIe": "V100", "A100-PCIe-40GB": "A100-40GB"}

# Relative weight of DeepBench rows in the GEMM forest: 2016-2019 cuBLAS, host-timed with
# 1 us resolution, beside NeuSight's PyTorch 2.1 CUDA-event timings.
DEEPBENCH_GEMM_WEIGHT = 0.5
# DeepBench times are whole microseconds: below this the rounding alone is > 15%.
_DEEPBENCH_MIN_US = 4.0

_F32, _F16 = 6, 5  # c10::ScalarType
_INT, _BOOL, _INT_LIST, _NONE = 3, 5, 7, 0


def chip_of(gpu: str) -> str:
    """The chip a hardware-table GPU name stands for (the unit of held-out-GPU splits)."""
    return _CHIPS.get(gpu, gpu)


def public_root(root: str | Path | None = None) -> Path:
    """``shared/data/public`` (the folder holding neusight-train/, deepbench/, timm-rtx3090/)."""
    if root is not None:
        p = Path(root)
    else:
        ns = data_public.data_dir()
        if ns is None:
            raise FileNotFoundError(
                "the public data sets are not found (expected ../shared/data/public beside the "
                "repository or /work/shared/data/public); pass --data PATH")
        p = ns.parent
    if not (p / "neusight-train").is_dir():
        raise FileNotFoundError(f"{p}: no neusight-train/ folder; pass the shared/data/public "
                                "folder that holds the public data sets")
    return p


def dataset_files(root: Path) -> dict[str, list[Path]]:
    """The files each public data set contributes to training, by data set name."""
    ns = root / "neusight-train"
    files = [p for fam in data_public.FAMILIES for p in data_public.family_files(ns, fam)]
    return {
        "neusight-train": sorted(set(files)),
        "deepbench": [root / "deepbench" / "gemm.csv.gz", root / "deepbench" / "conv.csv.gz"],
        "timm-rtx3090": [root / "timm-rtx3090" /
                         "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv.gz"],
    }


@dataclass
class UnitSample:
    """One measured kernel: its features (from the C++ core), GPU, measurement and groups."""

    dataset: str     # neusight-train | deepbench
    family: str      # the data set's op family (bmm, linear, elem, ln, softmax, gemm, conv_fwd..)
    gpu: str         # blink.hardware name
    feats: dict[str, Any]
    measured_s: float
    batch: int       # the data's batch dimension (for batch-extrapolation splits)
    shape: str       # the row's shape key, equal on every GPU (for calibration splits)
    weight: float = 1.0
    op: str = ""     # the ATen op the row ran ("aten::native_layer_norm"): what its forest covers

    @property
    def kind(self) -> str:
        return str(self.feats["kind"])


def gpu_features(gpu: str) -> dict[str, float]:
    """The GPU fields of ARTIFACTS.md for a hardware-table GPU."""
    g = core_gpu_fields(gpu)
    return {
        "gpu_sm_count": float(g["sm_count"]), "gpu_clock_hz": float(g["clock_hz"]),
        "gpu_mem_bw": float(g["mem_bw"]), "gpu_l2_bytes": float(g["l2_bytes"]),
        "gpu_peak_fp32": float(g["peak_fp32"]), "gpu_peak_tf32": float(g["peak_tf32"]),
        "gpu_peak_bf16": float(g["peak_bf16"]), "gpu_peak_fp16": float(g["peak_fp16"]),
        "gpu_peak_fp8": float(g["peak_fp8"]), "gpu_cc": float(10 * g["cc_major"] + g["cc_minor"]),
    }


def feature_vector(feats: dict[str, Any], gpu: str) -> dict[str, float]:
    """The named numeric inputs of a unit on a GPU, as the C++ evaluator builds them:
    blink::feature_values (bools as 0/1) less _NOT_FOREST_INPUTS, analytic_time_s and the GPU
    fields. Non-finite values become NaN (XGBoost's missing value)."""
    out: dict[str, float] = {}
    for k, v in feats.items():
        if k in _NOT_FEATURES or k in _NOT_FOREST_INPUTS or k in ("op_id", "op"):
            continue
        x = float(v)
        out[k] = x if math.isfinite(x) else math.nan
    out.update(gpu_features(gpu))
    return out


# -- NeuSight -------------------------------------------------------------------------------
def load_neusight(root: Path, max_rows_per_file: int | None = None, seed: int = 0,
                  mixed_rows: int | None = None) -> list[UnitSample]:
    """NeuSight rows, costed by blink.data_public.predict: the per-GPU bmm/linear files sampled
    to `max_rows_per_file` each, the all-GPU elem/ln/softmax files to `mixed_rows` (None: all)."""
    from ..hardware import get_gpu

    ns = root / "neusight-train"
    out: list[UnitSample] = []
    canonical = {alias: get_gpu(alias).name for alias in data_public.DEVICES.values()}
    for fam in data_public.FAMILIES:
        cap = max_rows_per_file if fam in ("bmm", "linear") else mixed_rows
        rows = data_public.load_family(ns, fam, max_rows_per_file=cap, seed=seed)
        for r in rows:
            f = data_public.predict(r)
            if fam in ("bmm", "linear"):
                b = r.dims[0] if fam == "bmm" else r.dims[0] * r.dims[1]
            else:
                b = r.dims[0]
            out.append(UnitSample("neusight-train", fam, canonical[r.gpu], f, r.latency_s, int(b),
                                  f"{fam}:{r.op}:{'x'.join(map(str, r.dims))}",
                                  op=data_public.map_row(r).op_name))
    return out


# -- DeepBench ------------------------------------------------------------------------------
def _contig(shape: tuple[int, ...]) -> tuple[int, ...]:
    acc, out = 1, []
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def _channels_last(shape: tuple[int, int, int, int]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def deepbench_gemm_op(m: int, n: int, k: int, a_trans: str, b_trans: str,
                      dtype: int) -> tuple[str, list, list]:
    """cuBLAS column-major C(m x n) = op(A) op(B) as the aten::mm PyTorch would run for it.

    PyTorch's row-major mm X(M, K) @ Y(K, N) calls cuBLAS with the operands swapped
    (aten/src/ATen/native/cuda/Blas.cpp: C^T = Y^T X^T), so cuBLAS's (m, n, k) is
    aten::mm(X (n, k), Y (k, m)) -> (n, m), Y being cuBLAS's A and X its B; a transposed cuBLAS
    operand is a transposed (non-contiguous) view on the PyTorch side."""
    y_stride = (1, k) if a_trans == "T" else (m, 1)
    x_stride = (1, n) if b_trans == "T" else (k, 1)
    x = tensor_arg((n, k), dtype, x_stride, -1)
    y = tensor_arg((k, m), dtype, y_stride, -2)
    return "aten::mm", [x, y], [tensor_arg((n, m), dtype, None, 1)]


def deepbench_conv_op(r: dict[str, int], direction: str, dtype: int,
                      nhwc: bool) -> tuple[str, list, list]:
    """A DeepBench cuDNN convolution row as aten::convolution (fwd) or
    aten::convolution_backward with output_mask [1,0,0] (bwd_data) or [0,1,0] (bwd_filter)."""
    xs = (r["n"], r["c"], r["h"], r["w"])
    ws = (r["k"], r["c"], r["r"], r["s"])
    ys = (r["n"], r["k"], r["out_h"], r["out_w"])

    def t(shape: tuple[int, int, int, int], sid: int) -> tuple:
        return tensor_arg(shape, dtype, _channels_last(shape) if nhwc else _contig(shape), sid)

    stride = (_INT_LIST, [r["stride_h"], r["stride_w"]])
    pad = (_INT_LIST, [r["pad_h"], r["pad_w"]])
    dil = (_INT_LIST, [1, 1])
    outpad = (_INT_LIST, [0, 0])
    none = (_NONE, None)
    if direction == "fwd":
        return ("aten::convolution",
                [t(xs, -1), t(ws, -2), none, stride, pad, dil, (_BOOL, False), outpad,
                 (_INT, 1)],
                [t(ys, 1)])
    mask = [1, 0, 0] if direction == "bwd_data" else [0, 1, 0]
    outs = [t(xs, 1), none, none] if direction == "bwd_data" else [none, t(ws, 1), none]
    return ("aten::convolution_backward",
            [t(ys, -3), t(xs, -1), t(ws, -2), none, stride, pad, dil, (_BOOL, False), outpad,
             (_INT, 1), (_INT_LIST, mask)],
            outs)


def _deepbench_rows(path: Path) -> Iterable[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)


def _deepbench_training_rows(path: Path,
                             known: dict[str, str]) -> Iterable[tuple[dict[str, str], str, float]]:
    """(row, blink GPU name, time in us) of the DeepBench rows training uses: training-mode
    fp32 / fp16-tensor-core rows on a GPU of the table, at least _DEEPBENCH_MIN_US long."""
    for rec in _deepbench_rows(path):
        if rec["mode"] != "train" or rec["precision"] not in ("fp32", "fp16_tc"):
            continue
        gpu = known.get(rec["gpu"])
        t_us = float(rec["time_us"])
        if gpu is not None and t_us >= _DEEPBENCH_MIN_US:
            yield rec, gpu, t_us


def load_deepbench(root: Path, gpus: Iterable[str] | None = None) -> list[UnitSample]:
    """DeepBench GEMM and convolution training rows in fp32 and fp16_tc on the GPUs the
    hardware table knows (DEEPBENCH_GPUS that resolve), costed by the C++ core."""
    from ..hardware import get_gpu

    known: dict[str, str] = {}
    for col, name in DEEPBENCH_GPUS.items():
        try:
            known[col] = get_gpu(name).name
        except Exception:  # noqa: BLE001 - a GPU the table lacks contributes no rows
            continue
    if gpus is not None:
        keep = set(gpus)
        known = {c: n for c, n in known.items() if n in keep}
    out: list[UnitSample] = []
    db = root / "deepbench"
    for rec, gpu, t_us in _deepbench_training_rows(db / "gemm.csv.gz", known):
        m, n, k = int(rec["m"]), int(rec["n"]), int(rec["k"])
        dtype = _F32 if rec["precision"] == "fp32" else _F16
        op, ins, outs = deepbench_gemm_op(m, n, k, rec["a_trans"], rec["b_trans"], dtype)
        # Loop means: no boost window (blink.data_deepbench.predict).
        f = unit_features(op, ins, outs, gpu, boost_window_s=0.0)
        out.append(UnitSample("deepbench", "gemm", gpu, f, t_us * 1e-6, n,
                              f"gemm:{rec['precision']}:{m}x{n}x{k}:{rec['a_trans']}"
                              f"{rec['b_trans']}", DEEPBENCH_GEMM_WEIGHT, op=op))
    ints = ("n", "c", "h", "w", "k", "r", "s", "pad_h", "pad_w", "stride_h", "stride_w",
            "out_h", "out_w")
    for rec, gpu, t_us in _deepbench_training_rows(db / "conv.csv.gz", known):
        r = {c: int(rec[c]) for c in ints}
        fp16 = rec["precision"] == "fp16_tc"
        op, ins, outs = deepbench_conv_op(r, rec["direction"], _F16 if fp16 else _F32, fp16)
        # cuDNN TF32 does not exist before Ampere; the flag only matters on newer GPUs.
        # DeepBench picked algorithms with cudnnFind* (measured): cudnn.benchmark's choice.
        f = unit_features(op, ins, outs, gpu, cudnn_benchmark=True, boost_window_s=0.0)
        shape = "x".join(str(r[c]) for c in ints)
        out.append(UnitSample("deepbench", f"conv_{rec['direction']}", gpu, f, t_us * 1e-6,
                              r["n"], f"conv:{rec['precision']}:{rec['direction']}:{shape}",
                              op=op))
    return out


# NeuSight times one op between two CUDA events (shared/data/public/neusight-train/README): the
# second event waits for the host to dispatch the op (Python, the dispatcher, cuBLAS setup), so
# every row carries that host's fixed floor on top of the kernel: 24-47 us for torch.bmm and
# 37-72 us for nn.Linear (a module call, F.linear, addmm with bias) on its five machines. Blink
# predicts kernel time (what CUPTI measures and what a busy stream runs back to back), so the
# floor is a measurement-protocol term and is taken off. bmm and linear: per GPU, the 5th
# percentile of (measured - analytic) over the family's rows of the smallest 5% analytic time
# (kernels of a few us, whose measured time is almost all floor). Element-wise rows are large
# (20-750 MB streamed) but each op's rows on a GPU lie on one line, measured = floor +
# slope x analytic (RMS residual 0.1-1.3%, intercept standard error under 0.5 us): the floor is
# that line's intercept, per GPU and op (11-32 us: a bare ATen launch, no cuBLAS host work, so
# 2-19 us below the GPU's bmm floor; taking the bmm floor off made the V100 seem to stream at 97%
# of its spec bandwidth where the line's slope says 91-93%). Layer norm and softmax times are not
# linear in their size (the row length changes the kernel), so they take the median of the GPU's
# element-wise floors (the same kind of bare launch). Rows under NEUSIGHT_FLOOR_KEEP x their
# floor (a kernel shorter than the floor) say too little about the kernel and are dropped.
# Without this the forests learned the floor and added it to small kernels on every GPU, which
# DeepBench's and CUPTI's loop timings do not have.
NEUSIGHT_FLOOR_QUANTILE = 0.05
NEUSIGHT_FLOOR_KEEP = 2.0
_FLOOR_FAMILIES = ("bmm", "linear")
# An op's intercept is trusted from this many rows spanning this ratio of analytic times.
_LINE_MIN_ROWS = 30
_LINE_MIN_SPAN = 3.0


def neusight_op(r: UnitSample) -> str:
    """The NeuSight op name of a row (add, powu, gelu, ...; bmm / linear for the GEMM files)."""
    return r.shape.split(":")[1]


def _floor_key(r: UnitSample) -> str:
    """The floor a NeuSight row loses: its op's for element-wise rows, its family's otherwise."""
    return f"elem:{neusight_op(r)}" if r.family == "elem" else r.family


def _intercept(g: list[UnitSample]) -> float | None:
    """The intercept (s) of measured = floor + slope x analytic over rows of one op, or None
    when too few rows or too narrow a range of sizes pin it down."""
    ana = np.array([float(r.feats["analytic_time_s"]) for r in g])
    if len(g) < _LINE_MIN_ROWS or ana.max() < _LINE_MIN_SPAN * ana.min():
        return None
    meas = np.array([r.measured_s for r in g])
    c = np.linalg.lstsq(np.c_[np.ones_like(ana), ana], meas, rcond=None)[0]
    return max(0.0, float(c[0]))


def neusight_floors(rows: list[UnitSample]) -> dict[tuple[str, str], float]:
    """The event-timing floor (s) of each NeuSight (GPU, family) and (GPU, "elem:<op>"); see
    above. Element-wise ops whose line is not pinned down take the median of the GPU's op
    floors (its bmm floor when none is)."""
    out: dict[tuple[str, str], float] = {}
    ns = [r for r in rows if r.dataset == "neusight-train" and _usable(r)]
    for gpu in sorted({r.gpu for r in ns}):
        for fam in _FLOOR_FAMILIES:
            g = [r for r in ns if r.gpu == gpu and r.family == fam]
            if len(g) < 100:
                continue
            ana = np.array([float(r.feats["analytic_time_s"]) for r in g])
            meas = np.array([r.measured_s for r in g])
            small = ana <= np.quantile(ana, 0.05)
            out[(gpu, fam)] = max(0.0, float(np.quantile((meas - ana)[small],
                                                         NEUSIGHT_FLOOR_QUANTILE)))
        elem = [r for r in ns if r.gpu == gpu and r.family == "elem"]
        lines = {}
        for op in sorted({neusight_op(r) for r in elem}):
            f = _intercept([r for r in elem if neusight_op(r) == op])
            if f is not None:
                lines[op] = out[(gpu, f"elem:{op}")] = f
        bare = float(np.median(list(lines.values()))) if lines else out.get((gpu, "bmm"))
        if bare is None:
            continue
        for fam in sorted({r.family for r in ns if r.gpu == gpu} - set(_FLOOR_FAMILIES)):
            out[(gpu, fam)] = bare
    return out


def remove_neusight_floor(rows: list[UnitSample],
                          floors: dict[tuple[str, str], float]) -> list[UnitSample]:
    """NeuSight rows as kernel times (measured - their floor), the floor-dominated ones dropped;
    other rows unchanged."""
    out = []
    for r in rows:
        f = 0.0
        if r.dataset == "neusight-train":
            f = floors.get((r.gpu, _floor_key(r)), floors.get((r.gpu, r.family), 0.0))
        if f > 0.0:
            if r.measured_s < NEUSIGHT_FLOOR_KEEP * f:
                continue
            r = replace(r, measured_s=r.measured_s - f)
        out.append(r)
    return out


def load_units(root: Path, *, neusight_rows_per_file: int | None = 6000,
               neusight_mixed_rows: int | None = None, seed: int = 0,
               floors: dict[tuple[str, str], float] | None = None) -> list[UnitSample]:
    """All per-unit training rows (NeuSight as kernel times + DeepBench), in a fixed order.
    `floors` (a dict) receives the NeuSight floors that were taken off."""
    rows = load_neusight(root, neusight_rows_per_file, seed, neusight_mixed_rows)
    rows += load_deepbench(root)
    rows = [r for r in rows if _usable(r)]
    fl = neusight_floors(rows)
    if floors is not None:
        floors.update(fl)
    return remove_neusight_floor(rows, fl)


def _usable(r: UnitSample) -> bool:
    a = r.feats.get("analytic_time_s")
    return (isinstance(a, float) and math.isfinite(a) and a > 0 and r.measured_s > 0
            and bool(r.feats.get("matched", True)))


@dataclass
class KindTable:
    """The rows of one unit kind as arrays (X columns named by `features`)."""

    kind: str
    features: list[str]
    X: np.ndarray
    y: np.ndarray               # log(measured / analytic)
    measured_s: np.ndarray
    analytic_s: np.ndarray
    roofline_s: np.ndarray
    weight: np.ndarray
    gpu: np.ndarray             # hardware-table name (str)
    chip: np.ndarray            # chip_of(gpu)
    dataset: np.ndarray
    family: np.ndarray
    batch: np.ndarray
    shape: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, mask: np.ndarray) -> KindTable:
        return KindTable(self.kind, self.features, self.X[mask], self.y[mask],
                         self.measured_s[mask], self.analytic_s[mask], self.roofline_s[mask],
                         self.weight[mask], self.gpu[mask], self.chip[mask],
                         self.dataset[mask], self.family[mask], self.batch[mask],
                         self.shape[mask], dict(self.meta))


def tables_by_kind(rows: list[UnitSample]) -> dict[str, KindTable]:
    """Group rows by unit kind; each kind's feature list is the union of its rows' feature
    names in first-seen order, minus the ones constant over the kind's rows."""
    by: dict[str, list[UnitSample]] = {}
    for r in rows:
        by.setdefault(r.kind, []).append(r)
    out: dict[str, KindTable] = {}
    for kind in sorted(by):
        rs = by[kind]
        vecs = [feature_vector(r.feats, r.gpu) for r in rs]
        names: list[str] = []
        seen: set[str] = set()
        for v in vecs:
            for k in v:
                if k not in seen:
                    seen.add(k)
                    names.append(k)
        X = np.array([[v.get(k, math.nan) for k in names] for v in vecs], dtype=np.float64)
        keep = [j for j in range(len(names))
                if names[j] == "analytic_time_s" or np.unique(X[:, j][~np.isnan(X[:, j])]).size > 1]
        names = [names[j] for j in keep]
        X = X[:, keep]
        meas = np.array([r.measured_s for r in rs])
        ana = np.array([float(r.feats["analytic_time_s"]) for r in rs])
        out[kind] = KindTable(
            kind=kind, features=names, X=X, y=np.log(meas / ana), measured_s=meas,
            analytic_s=ana, roofline_s=np.array([float(r.feats["roofline_time_s"]) for r in rs]),
            weight=np.array([r.weight for r in rs]), gpu=np.array([r.gpu for r in rs]),
            chip=np.array([chip_of(r.gpu) for r in rs]),
            dataset=np.array([r.dataset for r in rs]), family=np.array([r.family for r in rs]),
            batch=np.array([r.batch for r in rs]), shape=np.array([r.shape for r in rs]),
            meta={"math_modes": [m for m in MATH_MODES
                                 if m in {str(r.feats.get("math_mode")) for r in rs}],
                  # the ops the forest may correct (blink::UnitModel::ops); "" rows: unknown
                  "ops": sorted({_C.unit_model_op_key(r.op) for r in rs if r.op})})
    return out


def shape_half(shapes: np.ndarray, seed: int = 0) -> np.ndarray:
    """A deterministic ~50/50 split by shape key (the same shape lands on the same side on
    every GPU): True for the calibration half."""
    salt = str(seed)
    return np.array([int(hashlib.sha256((salt + s).encode()).hexdigest()[:8], 16) % 2 == 0
                     for s in shapes])

