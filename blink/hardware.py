"""The GPU hardware table: peak FLOP/s, memory, bandwidth and cache of the GPUs Blink models.

The built-in table is ``blink/data/gpus.json`` (package data). Every peak FLOP/s figure in it is
DENSE: NVIDIA datasheets often print 2:4-structured-sparsity figures, which are twice the dense
rate and are never used here.

Look a GPU up with :func:`get_gpu` (canonical name or alias, case-insensitive, ignoring spaces,
underscores and hyphens, e.g. ``get_gpu("NVIDIA H200")`` or ``get_gpu("h100 sxm")``). Add your
own GPUs with :func:`register_gpu_file` or the ``BLINK_GPU_FILE`` environment variable (one path,
or several separated by ``os.pathsep``), read on the first lookup. A user file has the schema of
the built-in one: either ``{"format_version": 1, "gpus": [...]}`` or a single GPU object.

This module is pure Python: it imports neither torch nor the compiled extension.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .errors import AmbiguousGPUError, ConfigError, UnknownGPUError

__all__ = [
    "FORMAT_VERSION",
    "BOOST_WINDOW_S",
    "PROCESS_ENERGY_SCALE",
    "SUSTAINED_W_PER_TFLOP_16NM",
    "GPU_FILE_ENV",
    "PEAK_FLOPS_KEYS",
    "GPUSpec",
    "get_gpu",
    "list_gpus",
    "register_gpu_file",
]

FORMAT_VERSION = 1
GPU_FILE_ENV = "BLINK_GPU_FILE"
PEAK_FLOPS_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
# peak_flops keys that every GPU must give a number for; the others may be null or absent.
_REQUIRED_PEAKS = ("fp32", "fp16")
FORM_FACTORS = ("SXM", "PCIe")

# ---- sustained throughput under dense math (issue 9, item 3) -------------------------------
# A board at its power cap cannot hold its boost clock under dense math: the clock settles where
# the board's power equals the math's power draw. Blink's rule, one place, one fitted constant:
#
#     demand = peak_fp32 [TFLOP/s at boost] x energy_scale(process) / board_power [W]
#     ratio  = min(max_clock, 1 / (SUSTAINED_W_PER_TFLOP_16NM x demand))
#
# i.e. a board sustains at most board_power / (W_per_TFLOP x energy_scale) TFLOP/s of dense
# FP32 math, and never more than its highest clock: boost, or on a GeForce board (its
# "boost_clock_kind" is "typical") TYPICAL_BOOST_HEADROOM x boost (below). Power is taken as
# linear in clock (P = k f): the public data below do not resolve the voltage term. The base
# clock is NOT a floor: the NeuSight P4 sustains less than its listed base clock (0.67 of
# boost against 886 / 1063 MHz).
#
# GPU Boost reacts to average power over a window, so a short, isolated burst runs at boost
# before the clock falls: BOOST_WINDOW_S is how long an isolated kernel holds boost before the
# ratio applies. NeuSight times each shape as the fastest 5 of 25 repeats after host-side set-up
# (an idle GPU), and on its T4 compute-bound SGEMMs of 0.1-1 ms run ~1.5x faster than the
# sustained ratio allows, those of 30 ms and more at it. Fitted below on NeuSight kernel times
# (its event floor taken off, as blink train does): 0.25 ms. Until 2026-12-05 the fit compared
# against the raw latencies, whose 15-70 us floor made every short kernel look slow, and found 0.
# Loops of repeats run at the ratio throughout: a model step (csrc/core/cost_model.cpp) and
# DeepBench's loop means (blink/data_deepbench.py) are costed with no window.
#
# SUSTAINED_W_PER_TFLOP_16NM: board watts per sustained FP32 TFLOP/s on a 16 nm-class die.
# Fitted to the public NeuSight FP32 GEMM set (shared/data/public/neusight-train: bmm + linear,
# rows of >= 2e10 FLOP, P4 / P100 / T4 / V100-PCIe / A100-PCIe-40GB): per GPU the observed ratio
# is the 95th percentile of measured FLOP/s / datasheet peak / kSimtGemmBaseEfficiency (0.88,
# csrc/include/blink/kernel_plan.h), and the constant minimises the squared log error of the
# clamped rule over the GPUs (only the P4 and T4 are power-limited, so only they pin it; the rest
# bound it). Held out one GPU at a time (fit on four, report the fifth):
# benchmarks/sustained_logo.py, which prints the fit, the held-out ratios and the held-out
# accuracy. Fit on all five: 21.15 W and a 0.25 ms window. Held out (fit on the other four): T4
# predicted 0.535 of boost (observed 0.488), P4 0.616 (observed 0.674); P100, V100-PCIe and
# A100-PCIe-40GB predicted 1 (observed 0.92-1). BOOST_WINDOW_S is fitted after the constant: the
# grid value with the lowest median APE of the analytic time over the training GPUs' bmm +
# linear kernel times (0.25 ms in four folds, 1 ms with the T4 held out). Held-out kernel-time
# MAPE, at boost -> with the fold's ratio and window (benchmarks/results/sustained_logo.txt): T4
# bmm 29.7 -> 25.2%, linear 43.9 -> 25.4%; P4 bmm 17.4 -> 18.4%, linear 53.5 -> 39.0% (the P4's
# nn.Linear kernels, unlike its bmm, slow down the longer they run, to 0.2 of boost: the ratio
# and window do not explain it).
SUSTAINED_W_PER_TFLOP_16NM = 21.15
BOOST_WINDOW_S = 0.25e-3
# Tensor-core math draws far less energy per FLOP than FP32 FMAs on CUDA cores (one MMA
# instruction does 64-512 multiply-adds with one operand fetch), so a board's power cap binds
# tensor-core math at a higher clock: its demand is the dense FP16 tensor-core peak (FP32
# accumulate) x TC_ENERGY_PER_FLOP in place of the FP32 peak. Fitted to the public DeepBench
# fp16 tensor-core GEMM rows (shared/data/public/deepbench; cuBLAS, CUDA 10): the T4 (70 W, the
# only power-capped tensor-core GPU there) against the V100 (300 W, holds boost) over kernels
# of >= 3 ms (sustained_logo.LONG_KERNEL_S), where the ratio rules: the constant that gives
# the T4 the V100's median measured / analytic (so the kernel-efficiency model cancels). benchmarks/
# sustained_logo.py prints the fit and the check the fit never saw: the RTX 3090's whole-model
# timm times (shared/data/public/timm-rtx3090), all tensor-core math, which the FP32 rule at
# the full FP32 peak's demand would throttle to 0.85.
TC_ENERGY_PER_FLOP = 0.086
# Dynamic energy per FP32 operation relative to TSMC 16FF, from the foundries' published
# iso-speed power reductions (estimates; the rule's weakest input beyond 12 nm, where no public
# measurement here can check it): TSMC 12FFC "up to 25% lower power than 16FFC" (NVIDIA's
# 12FFN: 0.8); Samsung 10LPE ~40% below 14LPE and 8LPP ~10% below 10LPP (0.55); TSMC N7 "up to
# 60-65% lower power than 16FF+" (0.35); N5 "30% lower power than N7" (4N, an N5-class node:
# 0.25); N4P a few % below N5 (4NP: 0.23).
PROCESS_ENERGY_SCALE: dict[str, float] = {
    "TSMC 16FF": 1.0,
    "TSMC 12FFN": 0.8,
    "Samsung 8N": 0.55,
    "TSMC N7": 0.35,
    "TSMC 4N": 0.25,
    "TSMC 4NP": 0.23,
}

# What a datasheet's boost clock means. Data-centre parts (Tesla, A100, H100 ...) list their
# maximum application clock, which GPU Boost does not exceed ("max"). GeForce and TITAN boards
# list a typical clock under load: GPU Boost runs them above it while power and temperature
# allow ("typical"), so their highest clock is TYPICAL_BOOST_HEADROOM x boost. An estimate from
# public stock-clock observations (not fitted to any data set here): NVIDIA's RTX 4090 FE demo
# at 2810-2850 MHz against its listed 2520 (1.12-1.13), and the RTX 3090 Ti at 2000-2050 MHz
# against 1860 (1.08-1.10), both at stock (tweaktown.com, 2022-09-22). The power rule still caps
# dense math below it, so only work under the cap (tensor-core math on most boards) runs faster.
# The check: timm-rtx3090 (the RTX 3090's AMP models, all tensor-core GEMMs and convolutions)
# in blink evaluate, held-out families; DeepBench's Pascal GeForce boards are FP32 at their cap.
TYPICAL_BOOST_HEADROOM = 1.10
BOOST_CLOCK_KINDS = ("max", "typical")

# DRAM_EFFICIENCY: the fraction of the datasheet DRAM bandwidth a streaming kernel reaches
# (PyTorch's vectorized_elementwise_kernel, aten/src/ATen/native/cuda/CUDALoops.cuh: every
# memory-bound unit's rate, GpuSpec::dram_efficiency in the C++ core; refresh, ECC, bus
# turnarounds and row switches take the rest), by architecture. Measured on the public NeuSight
# element-wise rows (shared/data/public/neusight-train; PyTorch 2.1, CUDA 12.1): on each GPU each
# op's time is its event floor + bytes / rate to 0.2-1.8% RMS over 20-750 MB
# (blink.train.data.neusight_floors), so the rate is the line's slope; the median over a chip's
# 11 ops: V100-PCIe 91% of spec, A100-PCIe-40GB 89%, P100 74%, P4 75%, T4 74% (every op within
# 3 points of its chip's median but the P100's scalar pow). Two groups, read off those chips:
# Pascal (sm_6x) and Turing (sm_75) stream at 74%, Volta (sm_70), Ampere and later at 90%. The
# memory type does not split them (the P100's HBM2 streams like the P4's GDDR5). Each group's
# value is the mean of its chips, and held out one chip at a time (its group's value from the
# others) it changes by at most 0.01 (benchmarks/dram_efficiency_logo.py prints the slopes, the
# held-out values and the element-wise error before / after). Ada, Hopper and Blackwell have no
# public per-kernel rows here and take Volta / Ampere's value; the RTX 3090's (sm_86, GDDR6X)
# whole-model times, which no fit of this value saw, are its check (blink evaluate, analytic).
# Until 2026-12-05 every GPU had 0.85. A table entry may give its own "dram_efficiency" (a
# measured copy rate over the datasheet bandwidth).
DRAM_EFFICIENCY_PASCAL_TURING = 0.74
DRAM_EFFICIENCY_VOLTA_ON = 0.90


# SIMT_GEMM_RATE_SHARED_DATAPATH: the share of its listed FP32 peak an SGEMM main loop keeps
# on an SM whose FP32 lanes are half shared with INT32 (GA10x, AD10x and GB20x, the GeForce /
# workstation dies: sm_86, sm_87, sm_89, sm_12x; NVIDIA's GA102 whitepaper: each SM
# sub-partition has 16 FP32 lanes and 16 that run FP32 or INT32 per clock, and the listed peak
# counts both). An SGEMM also issues shared-memory loads, address and loop arithmetic, and the
# shared lanes and issue slots those take do no FMAs, so the doubled peak is out of reach;
# A100 (sm_80) and datacentre Blackwell keep 1, Hopper has its own (SIMT_GEMM_RATE_SM90).
# GpuSpec::simt_gemm_rate in the C++ core (gemm_cost.cpp, on top of kSimtGemmBaseEfficiency);
# the power rule charges dense FP32 math at this share of the peak (its FLOPs draw the power).
# Fitted on public torch.mm rates (data/published/torch_mm_tflops.csv; benchmarks/
# matmul_published.py prints the fit): on each such board the power rule leaves at its highest
# clock, the share that puts Blink's FP32 rate on the published one: RTX 3090 0.72, RTX 4090
# 0.69, RTX PRO 6000 0.71; held out one at a time (the others' mean) each is off by at most
# 4.4%; the A10G, whose public row was added after the fit, implies 0.76 (Blink 8% slow
# there). The L40S (0.59) and RTX 5090 (0.68) were left out of the mean because Blink's
# tensor-core rate on them was off as well (1.15x and 0.89x the published), so their clock, not
# the FP32 datapath, is what the table missed there (the L40S entry has since taken measured
# ratios from its row, which also takes it out of the fit). Before this rule Blink put these boards'
# FP32 GEMMs 1.07-1.47x too fast (the RTX 3090's only through a power throttle that its FP32
# math, at this share, does not reach: it now holds its clock).
SIMT_GEMM_RATE_SHARED_DATAPATH = 0.70


# SIMT_GEMM_RATE_SM90: the same share on Hopper, whose FP32 lanes are dedicated but 32 per
# scheduler (A100: 16), so an SGEMM's FFMAs want every issue slot and lose those its loads and
# address arithmetic take. Fitted on the public torch.mm FP32 rows of an H100 SXM (52.1
# TFLOP/s) and an H200 (51.3): 0.895 / 0.882 of what kSimtGemmBaseEfficiency alone gives at
# their boost clock (both hold it under the power rule, and Blink's tensor-core rate in the
# same rows is within 4%, so the clock is right). One die (GH100) in two boards: nothing is
# held out. Datacentre Blackwell's row (B200, 0.98) does not show it and keeps 1.
SIMT_GEMM_RATE_SM90 = 0.89


def fp32_shares_int_datapath(compute_capability: tuple[int, int]) -> bool:
    """Whether an SM of this compute capability runs half its FP32 lanes on a datapath shared
    with INT32 (see SIMT_GEMM_RATE_SHARED_DATAPATH)."""
    major, minor = compute_capability
    return (major == 8 and minor >= 6) or major == 12


def simt_gemm_rate_rule(compute_capability: tuple[int, int]) -> float:
    """The share of the listed FP32 peak an SGEMM main loop keeps on this compute capability."""
    if fp32_shares_int_datapath(compute_capability):
        return SIMT_GEMM_RATE_SHARED_DATAPATH
    return SIMT_GEMM_RATE_SM90 if compute_capability[0] == 9 else 1.0


def dram_efficiency_rule(compute_capability: tuple[int, int]) -> float:
    """The DRAM_EFFICIENCY rule's streaming rate, over the datasheet bandwidth, of a GPU of this
    compute capability."""
    major, minor = compute_capability
    if major < 7 or (major, minor) == (7, 5):
        return DRAM_EFFICIENCY_PASCAL_TURING
    return DRAM_EFFICIENCY_VOLTA_ON


def _max_clock_ratio(boost_clock_kind: str) -> float:
    """The highest clock of a board whose listed boost is of this kind, over that boost."""
    return TYPICAL_BOOST_HEADROOM if boost_clock_kind == "typical" else 1.0


_BUILTIN_ORIGIN = "the built-in GPU table (blink/data/gpus.json)"
_HOW_TO_ADD = (
    "To add a GPU, describe it in a JSON file with the schema of blink/data/gpus.json (a single "
    'GPU object, or {"format_version": 1, "gpus": [...]}) and call '
    "blink.hardware.register_gpu_file(path), or set the environment variable "
    f"{GPU_FILE_ENV} to the file's path (several paths separated by {os.pathsep!r})."
)

# dtype spellings accepted by GPUSpec.peak_flops_for -> the peak_flops key.
# fmt: off
_DTYPE_KEYS: dict[str, str] = {
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "tf32": "tf32", "tfloat32": "tf32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
    "int8": "int8", "i8": "int8",
}
# fmt: on

_ARCH_RE = re.compile(r"^sm_(\d+)([a-z]?)$")
_SEPARATORS_RE = re.compile(r"[\s_\-]+")
# Vendor words that may be dropped when a name does not match as written ("RTX 4090").
_VENDOR_WORDS = ("nvidia", "geforce", "tesla")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU of the hardware table. Units: bytes, bytes/s, FLOP/s (ops/s for int8), MHz, W.

    ``peak_flops`` maps each of :data:`PEAK_FLOPS_KEYS` to a DENSE peak (None where the GPU has
    no such mode): ``fp32`` is the CUDA-core (SIMT) rate; ``tf32``, ``fp16``, ``bf16``, ``fp8``
    and ``int8`` are tensor-core rates with FP32 accumulate where the vendor distinguishes;
    ``fp64`` is the vector (non-tensor) rate. On GPUs without fp16 tensor cores
    (``fp16_tensor_core`` False: P100, P4) ``fp16`` is the CUDA-core rate. Treat it as read-only.
    """

    name: str
    aliases: tuple[str, ...]
    arch: str
    compute_capability: tuple[int, int]
    sm_count: int
    boost_clock_mhz: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    l2_bytes: int
    form_factor: str
    tdp_w: float
    peak_flops: dict[str, float | None] = field(hash=False)
    fp16_tensor_core: bool = True
    source: tuple[str, ...] = ()
    notes: str = ""
    memory_note: str = ""
    origin: str = field(default=_BUILTIN_ORIGIN, compare=False)
    # Sustained throughput under dense math (see SUSTAINED_W_PER_TFLOP_16NM). base_clock_mhz:
    # the clock guaranteed at board power (None: not published). process: the foundry node,
    # a key of PROCESS_ENERGY_SCALE ("" = unknown: the power rule is not applied).
    base_clock_mhz: float | None = None
    process: str = ""
    # Fraction of the datasheet peak held under dense FP32 SIMT math / tensor-core math, and
    # how each was obtained (a measurement, a vendor figure, or the power rule's derivation).
    sustained_fp32_ratio: float = 1.0
    sustained_tc_ratio: float = 1.0
    sustained_source: str = ""
    # "max": the listed boost is the highest clock; "typical": GPU Boost runs above it
    # (GeForce; see TYPICAL_BOOST_HEADROOM). The sustained ratios are fractions of the listed
    # boost, at most max_clock_ratio.
    boost_clock_kind: str = "max"
    # Fraction of the datasheet bandwidth a streaming kernel reaches (DRAM_EFFICIENCY).
    dram_efficiency: float = DRAM_EFFICIENCY_VOLTA_ON
    # Share of the listed FP32 peak an SGEMM main loop keeps (simt_gemm_rate_rule).
    simt_gemm_rate: float = 1.0

    @property
    def max_clock_ratio(self) -> float:
        """The highest clock the board runs at, as a fraction of its listed boost."""
        return _max_clock_ratio(self.boost_clock_kind)

    @property
    def sustained_fp32_clock_mhz(self) -> float:
        """The clock dense FP32 math runs at: boost x sustained_fp32_ratio."""
        return self.boost_clock_mhz * self.sustained_fp32_ratio

    def peak_flops_for(self, dtype: str, tensor_cores: bool = True) -> float:
        """Dense peak FLOP/s for ``dtype`` ("fp32", "tf32", "bf16", "fp16", "fp8", "int8",
        "fp64"; torch spellings such as "float16" or "torch.bfloat16" work too).

        With ``tensor_cores=True`` (matmul-class work): "fp32" is the CUDA-core rate (PyTorch
        does not use TF32 unless asked); "tf32", "bf16", "fp16", "fp8" and "int8" are the
        tensor-core rates (on P100/P4, which have no tensor cores, "fp16" is the CUDA-core rate).
        With ``tensor_cores=False`` (elementwise work on CUDA cores): "fp32" and "tf32" give the
        FP32 rate, and so do "fp16" and "bf16", because PyTorch's elementwise kernels compute
        half-precision values in float; "fp64" gives the FP64 rate; fp8 and int8 have none.

        Raises ConfigError for an unknown dtype or one this GPU does not support.
        """
        key = _dtype_key(dtype)
        if not tensor_cores:
            if key in ("fp32", "tf32", "fp16", "bf16"):
                key = "fp32"
            elif key != "fp64":
                raise ConfigError(
                    f"GPU {self.name!r}: Blink has no CUDA-core (tensor_cores=False) rate for "
                    f"{key}; {key} arithmetic runs on tensor cores only."
                )
        value = self.peak_flops.get(key)
        if value is None:
            raise ConfigError(
                f"GPU {self.name!r} ({self.arch}) has no {key} {_unit_name(key)} "
                f"(peak_flops[{key!r}] is null in {self.origin}). {_dtype_hint(key)}"
            )
        return float(value)


def _unit_name(key: str) -> str:
    return "CUDA-core rate" if key in ("fp32", "fp64") else "tensor-core support"


def _dtype_hint(key: str) -> str:
    hints = {
        "tf32": "TF32 needs sm_80 (Ampere) or newer; use 'fp32'.",
        "bf16": "BF16 tensor cores need sm_80 (Ampere) or newer; use 'fp16' or 'fp32'.",
        "fp8": "FP8 tensor cores need sm_89 (Ada) or newer; use 'bf16' or 'fp16'.",
        "int8": "Use 'fp16' instead.",
    }
    return hints.get(key, "")


def _dtype_key(dtype: object) -> str:
    text = str(dtype).strip().lower()
    text = text.removeprefix("torch.")
    key = _DTYPE_KEYS.get(text)
    if key is None:
        known = ", ".join(sorted(_DTYPE_KEYS))
        raise ConfigError(f"unknown dtype {dtype!r} for a peak FLOP/s lookup; known: {known}")
    return key


def _normalize(name: str) -> str:
    """Lookup key: lowercase, with spaces, underscores and hyphens removed."""
    return _SEPARATORS_RE.sub("", name.strip().lower())


def _strip_vendor_words(name: str) -> str:
    """Lookup key without the words NVIDIA, GeForce and Tesla."""
    words = [w for w in _SEPARATORS_RE.split(name.strip().lower()) if w]
    return "".join(w for w in words if w not in _VENDOR_WORDS)


def _strip_vendor_words_of_key(key: str) -> str:
    """Like _strip_vendor_words, for an already normalized key (vendor words as prefixes)."""
    changed = True
    while changed:
        changed = False
        for word in _VENDOR_WORDS:
            if key.startswith(word) and len(key) > len(word):
                key = key[len(word) :]
                changed = True
    return key


# --------------------------------------------------------------------------------------------
# Validation of a GPU file
# --------------------------------------------------------------------------------------------


class _Where:
    """Formats 'file, GPU, field' prefixes for validation errors."""

    def __init__(self, origin: str, gpu: str | None = None) -> None:
        self.origin = origin
        self.gpu = gpu

    def error(self, message: str, field_name: str | None = None) -> ConfigError:
        parts = [self.origin]
        if self.gpu is not None:
            parts.append(f"GPU {self.gpu}")
        if field_name is not None:
            parts.append(f"field {field_name!r}")
        return ConfigError(f"{': '.join(parts)}: {message}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive_number(where: _Where, obj: Mapping[str, Any], key: str) -> float:
    value = obj[key]
    if not _is_number(value):
        raise where.error(f"must be a number, got {type(value).__name__} {value!r}", key)
    if not math.isfinite(value) or value <= 0:
        raise where.error(f"must be a positive finite number, got {value!r}", key)
    return float(value)


def _positive_int(where: _Where, obj: Mapping[str, Any], key: str) -> int:
    value = obj[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise where.error(f"must be an integer, got {type(value).__name__} {value!r}", key)
    if value <= 0:
        raise where.error(f"must be a positive integer, got {value!r}", key)
    return value


def _string(where: _Where, obj: Mapping[str, Any], key: str, *, nonempty: bool = False) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise where.error(f"must be a string, got {type(value).__name__} {value!r}", key)
    if nonempty and not value.strip():
        raise where.error("must not be empty", key)
    return value


def _string_list(where: _Where, obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise where.error(f"must be a list of non-empty strings, got {value!r}", key)
    return tuple(v.strip() for v in value)


_REQUIRED_FIELDS = (
    "name",
    "arch",
    "compute_capability",
    "sm_count",
    "boost_clock_mhz",
    "memory_bytes",
    "memory_bandwidth_bytes_per_s",
    "l2_bytes",
    "form_factor",
    "tdp_w",
    "peak_flops",
)
_OPTIONAL_FIELDS = ("aliases", "source", "notes", "memory_note", "fp16_tensor_core",
                    "base_clock_mhz", "process", "sustained", "boost_clock_kind",
                    "dram_efficiency")
# Keys of an entry's optional "sustained" object: measured or vendor ratios that replace the
# power rule's, with the source they come from (required with either ratio).
_SUSTAINED_KEYS = ("fp32_ratio", "tc_ratio", "source")


def _parse_peak_flops(where: _Where, raw: object) -> dict[str, float | None]:
    if not isinstance(raw, dict):
        raise where.error(
            f"must be an object mapping {', '.join(PEAK_FLOPS_KEYS)} to FLOP/s, got {raw!r}",
            "peak_flops",
        )
    unknown = sorted(k for k in raw if k not in PEAK_FLOPS_KEYS and not k.startswith("_"))
    if unknown:
        raise where.error(
            f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(PEAK_FLOPS_KEYS)} "
            "(dense figures only: no sparsity variants)",
            "peak_flops",
        )
    peaks: dict[str, float | None] = {}
    for key in PEAK_FLOPS_KEYS:
        label = f"peak_flops.{key}"
        value = raw.get(key)
        if value is None:
            if key in _REQUIRED_PEAKS:
                missing = "is missing" if key not in raw else "must not be null"
                raise where.error(f"{missing}; every GPU needs a {key} figure", label)
            peaks[key] = None
            continue
        if not _is_number(value):
            raise where.error(
                f"must be a number of FLOP/s or null, got {type(value).__name__} {value!r}",
                label,
            )
        if not math.isfinite(value) or value <= 0:
            raise where.error(f"must be a positive FLOP/s figure or null, got {value!r}", label)
        peaks[key] = float(value)
    return peaks


def _parse_gpu(raw: object, origin: str, index: int) -> GPUSpec:
    where = _Where(origin, f"#{index}")
    if not isinstance(raw, dict):
        raise where.error(f"a GPU entry must be a JSON object, got {type(raw).__name__}")
    name_value = raw.get("name")
    if isinstance(name_value, str) and name_value.strip():
        where = _Where(origin, repr(name_value.strip()))
    missing = [k for k in _REQUIRED_FIELDS if k not in raw]
    if missing:
        raise where.error(
            f"missing required field(s) {', '.join(repr(k) for k in missing)}; required: "
            f"{', '.join(_REQUIRED_FIELDS)}"
        )
    unknown = sorted(
        k
        for k in raw
        if k not in _REQUIRED_FIELDS and k not in _OPTIONAL_FIELDS and not k.startswith("_")
    )
    if unknown:
        raise where.error(
            f"unknown field(s) {', '.join(repr(k) for k in unknown)}; allowed: "
            f"{', '.join(_REQUIRED_FIELDS + _OPTIONAL_FIELDS)} (keys starting with '_' are "
            "comments)"
        )

    name = _string(where, raw, "name", nonempty=True).strip()
    arch = _string(where, raw, "arch", nonempty=True).strip()
    arch_match = _ARCH_RE.match(arch)
    if arch_match is None:
        raise where.error(f"must look like 'sm_90' or 'sm_90a', got {arch!r}", "arch")

    cc = raw["compute_capability"]
    if (
        not isinstance(cc, list)
        or len(cc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc)
    ):
        raise where.error(
            f"must be [major, minor] with non-negative integers, got {cc!r}", "compute_capability"
        )
    if arch_match.group(1) != f"{cc[0]}{cc[1]}":
        raise where.error(
            f"{arch!r} does not match compute_capability {cc!r} (expected 'sm_{cc[0]}{cc[1]}')",
            "arch",
        )

    form_factor = _string(where, raw, "form_factor")
    if form_factor not in FORM_FACTORS:
        raise where.error(
            f"must be one of {', '.join(FORM_FACTORS)}, got {form_factor!r}", "form_factor"
        )

    fp16_tc = raw.get("fp16_tensor_core", True)
    if not isinstance(fp16_tc, bool):
        raise where.error(f"must be true or false, got {fp16_tc!r}", "fp16_tensor_core")

    aliases = _string_list(where, raw, "aliases") if "aliases" in raw else ()
    base_clock = None
    if raw.get("base_clock_mhz") is not None:
        base_clock = _positive_number(where, raw, "base_clock_mhz")
        if base_clock > _positive_number(where, raw, "boost_clock_mhz"):
            raise where.error(
                f"{base_clock:g} MHz is above boost_clock_mhz {raw['boost_clock_mhz']!r}",
                "base_clock_mhz",
            )
    process = _string(where, raw, "process").strip() if "process" in raw else ""
    if process and process not in PROCESS_ENERGY_SCALE:
        raise where.error(
            f"unknown process {process!r}; known: {', '.join(PROCESS_ENERGY_SCALE)} (or leave "
            "it out: the power rule is then not applied)",
            "process",
        )
    source = _string_list(where, raw, "source") if "source" in raw else ()
    notes = _string(where, raw, "notes") if "notes" in raw else ""
    memory_note = _string(where, raw, "memory_note") if "memory_note" in raw else ""

    peaks = _parse_peak_flops(where, raw["peak_flops"])
    tdp_w = _positive_number(where, raw, "tdp_w")
    boost = _positive_number(where, raw, "boost_clock_mhz")
    boost_kind = raw.get("boost_clock_kind", "max")
    if boost_kind not in BOOST_CLOCK_KINDS:
        raise where.error(
            f"must be one of {', '.join(repr(k) for k in BOOST_CLOCK_KINDS)} ('typical': a "
            f"GeForce board whose GPU Boost runs above the listed clock), got {boost_kind!r}",
            "boost_clock_kind",
        )
    max_clock = _max_clock_ratio(boost_kind)
    simt_rate = simt_gemm_rate_rule((cc[0], cc[1]))
    fp32_ratio, tc_ratio, sustained_source = _sustained(
        where, raw.get("sustained"), peaks["fp32"],
        (peaks["fp16"] or peaks["bf16"]) if fp16_tc else None, tdp_w, boost, process, max_clock,
        simt_rate,
    )
    return GPUSpec(
        name=name,
        aliases=tuple(a.lower() for a in aliases),
        arch=arch,
        compute_capability=(cc[0], cc[1]),
        sm_count=_positive_int(where, raw, "sm_count"),
        boost_clock_mhz=boost,
        memory_bytes=_positive_int(where, raw, "memory_bytes"),
        memory_bandwidth_bytes_per_s=_positive_number(where, raw, "memory_bandwidth_bytes_per_s"),
        l2_bytes=_positive_int(where, raw, "l2_bytes"),
        form_factor=form_factor,
        tdp_w=tdp_w,
        peak_flops=peaks,
        fp16_tensor_core=fp16_tc,
        source=source,
        notes=notes,
        memory_note=memory_note,
        origin=origin,
        base_clock_mhz=base_clock,
        process=process,
        sustained_fp32_ratio=fp32_ratio,
        sustained_tc_ratio=tc_ratio,
        sustained_source=sustained_source,
        boost_clock_kind=boost_kind,
        dram_efficiency=_dram_efficiency(where, raw, (cc[0], cc[1])),
        simt_gemm_rate=simt_rate,
    )


def power_rule_ratio(
    peak_fp32: float,
    tdp_w: float,
    process: str,
    w_per_tflop_16nm: float = SUSTAINED_W_PER_TFLOP_16NM,
    max_clock: float = 1.0,
) -> float:
    """The fraction of boost a board holds under dense math by the power rule (see
    SUSTAINED_W_PER_TFLOP_16NM), at most `max_clock` (the board's highest clock over its listed
    boost: TYPICAL_BOOST_HEADROOM on a GeForce board); `max_clock` when the process is unknown."""
    scale = PROCESS_ENERGY_SCALE.get(process)
    if scale is None:
        return max_clock
    demand = peak_fp32 / 1e12 * scale / tdp_w
    ratio = 1.0 / (w_per_tflop_16nm * demand)
    return min(max_clock, ratio)


def _dram_efficiency(where: _Where, raw: Mapping[str, Any], cc: tuple[int, int]) -> float:
    """An entry's "dram_efficiency" where it gives one, else the DRAM_EFFICIENCY rule's."""
    if "dram_efficiency" not in raw:
        return dram_efficiency_rule(cc)
    value = raw["dram_efficiency"]
    if not _is_number(value) or not (0.3 <= value <= 1.0):
        raise where.error(
            f"must be a number in [0.3, 1] (a copy kernel's measured bandwidth over "
            f"memory_bandwidth_bytes_per_s), got {value!r}", "dram_efficiency")
    return float(value)


def _sustained(
    where: _Where,
    raw: object,
    peak_fp32: float | None,
    peak_tc: float | None,
    tdp_w: float,
    boost: float,
    process: str,
    max_clock: float = 1.0,
    simt_rate: float = 1.0,
) -> tuple[float, float, str]:
    """(fp32 ratio, tensor-core ratio, source) of an entry: its "sustained" object where it
    gives them, else the power rule: FP32 math at the demand of the FP32 peak x `simt_rate`
    (the share dense FP32 math reaches, simt_gemm_rate_rule), tensor-core math at
    the dense FP16 tensor-core peak x TC_ENERGY_PER_FLOP (`peak_tc` None: no tensor cores, the
    FP32 ratio for both). `max_clock`: the highest clock over the listed boost (the ratios' cap)."""
    rule = power_rule_ratio((peak_fp32 or 0.0) * simt_rate, tdp_w, process, max_clock=max_clock)
    tc_rule = (power_rule_ratio(peak_tc * TC_ENERGY_PER_FLOP, tdp_w, process,
                                max_clock=max_clock) if peak_tc else rule)

    def what(r: float) -> str:
        if r == 1.0:
            return "holds boost"
        above = " (GPU Boost above the listed clock)" if r > 1.0 else ""
        return f"{r:.3f} of boost = {r * boost:.0f} MHz{above}"

    if process:
        tc = (f"; tensor cores: {peak_tc / 1e12:.1f} TFLOP/s x {TC_ENERGY_PER_FLOP:g} -> "
              f"{what(tc_rule)}" if peak_tc else "")
        share = f" x {simt_rate:g} reached" if simt_rate != 1.0 else ""
        derived = (
            f"estimate: power rule (blink/hardware.py): {tdp_w:g} W, "
            f"{(peak_fp32 or 0.0) / 1e12:.2f} FP32 TFLOP/s{share} at {boost:g} MHz, {process} "
            f"(energy scale {PROCESS_ENERGY_SCALE[process]:g}) -> {what(rule)}{tc}"
        )
    else:
        derived = ("no process given: assumed to hold its highest clock (power rule not "
                   "applied)")
    if raw is None:
        return rule, tc_rule, derived
    if not isinstance(raw, dict):
        raise where.error(f"must be an object with {', '.join(_SUSTAINED_KEYS)}", "sustained")
    unknown = sorted(k for k in raw if k not in _SUSTAINED_KEYS and not k.startswith("_"))
    if unknown:
        raise where.error(
            f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_SUSTAINED_KEYS)}",
            "sustained",
        )
    ratios = []
    for key, default in (("fp32_ratio", rule), ("tc_ratio", tc_rule)):
        value = raw.get(key)
        if value is None:
            ratios.append(default)
            continue
        if not _is_number(value) or not (0.0 < value <= max_clock):
            raise where.error(f"must be a number in (0, {max_clock:g}], got {value!r}",
                              f"sustained.{key}")
        ratios.append(float(value))
    src = raw.get("source")
    if not isinstance(src, str) or not src.strip():
        raise where.error("must say where the sustained ratios come from", "sustained.source")
    return ratios[0], ratios[1], f"{src.strip()}; otherwise {derived}"


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _parse_document(text: str, origin: str) -> list[GPUSpec]:
    """Validates a whole GPU file; returns its GPUs (nothing is registered here)."""
    try:
        doc = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{origin}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError as exc:  # duplicate key
        raise ConfigError(f"{origin}: invalid JSON object: {exc}") from None

    where = _Where(origin)
    if isinstance(doc, dict) and "gpus" in doc:
        if "format_version" not in doc:
            raise where.error(
                f"missing; a file with a 'gpus' list must say \"format_version\": {FORMAT_VERSION}",
                "format_version",
            )
        version = doc["format_version"]
        if type(version) is not int or version != FORMAT_VERSION:
            raise where.error(
                f"unsupported value {version!r}; this Blink reads format_version {FORMAT_VERSION}",
                "format_version",
            )
        unknown = sorted(
            k for k in doc if k not in ("format_version", "gpus") and not k.startswith("_")
        )
        if unknown:
            raise where.error(f"unknown top-level key(s) {', '.join(map(repr, unknown))}")
        entries = doc["gpus"]
        if not isinstance(entries, list) or not entries:
            raise where.error("must be a non-empty list of GPU objects", "gpus")
    elif isinstance(doc, dict) and "name" in doc:
        entries = [doc]
    else:
        raise where.error(
            'expected {"format_version": 1, "gpus": [...]} or a single GPU object with a '
            f"'name', got {type(doc).__name__}"
            + (f" with keys {sorted(doc)}" if isinstance(doc, dict) else "")
        )

    specs = [_parse_gpu(entry, origin, i) for i, entry in enumerate(entries)]
    names: dict[str, str] = {}
    for spec in specs:
        key = _normalize(spec.name)
        if key in names:
            raise where.error(f"GPU {spec.name!r} appears twice (also as {names[key]!r})")
        names[key] = spec.name
    owners = dict(names)
    for spec in specs:
        for alias in spec.aliases:
            key = _normalize(alias)
            owner = owners.setdefault(key, spec.name)
            if not key or owner != spec.name:
                raise where.error(
                    f"alias {alias!r} of GPU {spec.name!r} "
                    + ("is empty" if not key else f"also names GPU {owner!r}")
                )
    return specs


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.specs: dict[str, GPUSpec] = {}  # canonical name -> spec
        self.keys: dict[str, str] = {}  # normalized name or alias -> canonical name
        self.builtin_loaded = False
        self.env_loaded = False

    def ensure_loaded(self) -> None:
        with self.lock:
            if not self.builtin_loaded:
                text = (
                    resources.files(__package__ or "blink")
                    .joinpath("data")
                    .joinpath("gpus.json")
                    .read_text(encoding="utf-8")
                )
                self._add_all(_parse_document(text, _BUILTIN_ORIGIN), warn=False)
                self.builtin_loaded = True
            if not self.env_loaded:
                # All files are validated before any is added; on an error nothing is added and
                # the next lookup raises the same error again.
                paths = os.environ.get(GPU_FILE_ENV, "").split(os.pathsep)
                parsed = [
                    _read_gpu_file(p.strip(), via=f"the environment variable {GPU_FILE_ENV}")
                    for p in paths
                    if p.strip()
                ]
                for specs in parsed:
                    self._add_all(specs, warn=True)
                self.env_loaded = True

    def _add_all(self, specs: list[GPUSpec], warn: bool) -> None:
        for spec in specs:
            # Only a GPU with the same canonical name is replaced; a name or alias that is an
            # alias of another GPU just moves to the new one.
            key = _normalize(spec.name)
            old = next((g for g in self.specs.values() if _normalize(g.name) == key), None)
            if old is not None:
                if warn:
                    warnings.warn(
                        f"{spec.origin}: GPU {spec.name!r} overrides GPU {old.name!r} from "
                        f"{old.origin}",
                        stacklevel=3,
                    )
                self._remove(old.name)
            for label in (spec.name, *spec.aliases):
                owner = self.keys.get(_normalize(label))
                if owner is not None and owner != spec.name and warn:
                    warnings.warn(
                        f"{spec.origin}: {label!r} now names GPU {spec.name!r} instead of "
                        f"{owner!r}",
                        stacklevel=3,
                    )
            self.specs[spec.name] = spec
            for label in (spec.name, *spec.aliases):
                self.keys[_normalize(label)] = spec.name

    def _remove(self, name: str) -> None:
        del self.specs[name]
        for key in [k for k, owner in self.keys.items() if owner == name]:
            del self.keys[key]

    def lookup(self, name: str) -> GPUSpec | None:
        canonical = self.keys.get(_normalize(name))
        if canonical is None:
            # Second chance without vendor words: "NVIDIA RTX 4090" -> "rtx 4090".
            wanted = _strip_vendor_words(name)
            owners = {
                owner
                for key, owner in self.keys.items()
                if wanted and (key == wanted or _strip_vendor_words_of_key(key) == wanted)
            }
            if len(owners) == 1:
                canonical = owners.pop()
        return None if canonical is None else self.specs[canonical]


def _read_gpu_file(path: str | os.PathLike[str], via: str | None = None) -> list[GPUSpec]:
    origin = f"GPU file {os.fspath(path)!r}" + (f" (from {via})" if via else "")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{origin}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{origin}: cannot be read ({exc})") from None
    return _parse_document(text, origin)


_REGISTRY = _Registry()


def _reset_for_tests() -> None:
    """Forget registered files and the environment: the next lookup reloads everything."""
    global _REGISTRY
    _REGISTRY = _Registry()


def list_gpus() -> list[str]:
    """Canonical names of all known GPUs (built-in and registered), sorted."""
    _REGISTRY.ensure_loaded()
    return sorted(_REGISTRY.specs, key=str.lower)


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """The GPU called ``name``: a canonical name ("H100-SXM") or an alias, such as the string
    ``torch.cuda.get_device_name()`` returns ("NVIDIA H100 80GB HBM3"). Case, spaces,
    underscores and hyphens do not matter. A GPUSpec is returned as is.

    Raises UnknownGPUError (a ConfigError and KeyError) listing the known GPUs.
    """
    if isinstance(name, GPUSpec):
        return name
    if not isinstance(name, str):
        raise ConfigError(f"a GPU name must be a string, got {type(name).__name__} {name!r}")
    _REGISTRY.ensure_loaded()
    spec = _REGISTRY.lookup(name)
    if spec is not None:
        return spec
    known = sorted(_REGISTRY.specs, key=str.lower)
    partial = _partial_matches(name, [_REGISTRY.specs[k] for k in known])
    partial_keys = {_normalize(k) for k in partial}
    close = difflib.get_close_matches(
        _normalize(name), [_normalize(k) for k in known], n=3, cutoff=0.6
    )
    by_key = {_normalize(k): k for k in known}
    # Prefix / token matches first ("A100" -> the A100 entries), then fuzzy ones.
    suggestions = partial + [by_key[c] for c in close if c not in partial_keys]
    if len(partial) > 1:
        listed = "; ".join(_describe(_REGISTRY.specs[k]) for k in partial)
        raise AmbiguousGPUError(
            f"GPU name {name!r} is ambiguous: it fits {len(partial)} GPUs: {listed}. Pass one "
            f"of {', '.join(partial)} (or a full name such as torch.cuda.get_device_name() "
            "returns)."
        )
    hint = f" Did you mean {', '.join(suggestions)}?" if suggestions else ""
    raise UnknownGPUError(
        f"Unknown GPU {name!r}.{hint} Known GPUs: {', '.join(known)}. {_HOW_TO_ADD}"
    )


def _tokens(label: str) -> list[str]:
    words = [w for w in _SEPARATORS_RE.split(label.strip().lower()) if w]
    return [w for w in words if w not in _VENDOR_WORDS]


def _partial_matches(name: str, specs: list[GPUSpec]) -> list[str]:
    """Canonical names of the GPUs one of whose names or aliases starts with `name` or holds
    all of its words (vendor words and separators ignored), in table order."""
    want = _strip_vendor_words(name)
    want_tokens = set(_tokens(name))
    if not want:
        return []
    out = []
    for spec in specs:
        for label in (spec.name, *spec.aliases):
            if _strip_vendor_words(label).startswith(want) or (
                want_tokens and want_tokens <= set(_tokens(label))
            ):
                out.append(spec.name)
                break
    return out


def _describe(spec: GPUSpec) -> str:
    mem = spec.memory_bytes / 2**30
    return f"{spec.name} ({spec.form_factor}, {mem:.0f} GB, {spec.tdp_w:g} W)"


def register_gpu_file(path: str | os.PathLike[str]) -> list[str]:
    """Loads GPUs from a JSON file and returns their canonical names.

    The file is either ``{"format_version": 1, "gpus": [GPU, ...]}`` or a single GPU object,
    with the fields of blink/data/gpus.json. Every field is validated before anything is added;
    errors are ConfigError naming the file, the GPU and the field. A GPU with the name of a
    known one replaces it, with a warning.
    """
    specs = _read_gpu_file(path)
    registry = _REGISTRY
    with registry.lock:
        registry.ensure_loaded()
        registry._add_all(specs, warn=True)
    return [spec.name for spec in specs]
