"""The model-level timm set: blink's prediction for each benchmarked timm model, cached.

``timm-rtx3090`` (shared/data/public; read its README) holds whole-model AMP fp16 inference
step times of about 1,100 timm models on one RTX 3090. Each row is rebuilt here: the timm model
at random init on meta, at the benchmark's batch and image size, traced and predicted by blink
(``dtype="amp-fp16"``, inference, GPU "RTX 3090", TF32 on as timm's benchmark set it). Rows
whose built param count is more than 1% off the benchmark's are skipped (re-parameterised or
changed models). Tracing is the CPU-heavy part, so the results (analytic totals, FLOPs,
params, per-kind time sums) are cached in ``data/derived/timm_rtx3090_infer.csv.gz`` with a
provenance JSON beside it. Re-create after cost-model changes with::

    python -m blink.train.timm_cache            # or: blink train --refresh-timm

The training file (full SGD steps under AMP, torch 1.12) is cached the same way, traced as a
training step, in ``data/derived/timm_rtx3090_train.csv.gz``::

    python -m blink.train.timm_cache --mode train

The channels-last inference file (never trained on; benchmarks/timm_layouts.py --cached and
benchmarks/transpose_logo.py compare it with the NCHW one) goes to
``data/derived/timm_rtx3090_infer_nhwc.csv.gz``::

    python -m blink.train.timm_cache --mode inference-nhwc
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import functools
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..learned import MODEL_KINDS, model_summary

if TYPE_CHECKING:
    from ..predict import Prediction
    from ..trace import Trace

__all__ = ["CACHE_NAME", "KINDS", "MODES", "TRAIN_CACHE_NAME", "benchmark_path", "build_cache",
           "family_of", "load_cache", "predict_benchmark_trace", "select_models"]

CACHE_NAME = "timm_rtx3090_infer.csv.gz"
SOURCE_FILE = "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv.gz"
NHWC_CACHE_NAME = "timm_rtx3090_infer_nhwc.csv.gz"
NHWC_SOURCE_FILE = "benchmark-infer-amp-nhwc-pt240-cu124-rtx3090.csv.gz"
TRAIN_CACHE_NAME = "timm_rtx3090_train.csv.gz"
TRAIN_SOURCE_FILE = "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv.gz"
GPU = "RTX 3090"
# Unit kinds whose time sums are cached (blink::unit_kind_name), in column order.
KINDS = MODEL_KINDS
# Weight-source prefixes that are not architecture names (tf_efficientnet is efficientnet).
_SOURCE_PREFIX = re.compile(r"^(?:tf|gluon|legacy|ig|ssl|swsl|tv|hf)_")
PARAM_TOLERANCE = 0.01
DEFAULT_MAX_MODELS = 700


@dataclass(frozen=True)
class _Source:
    """One benchmark file of timm-rtx3090: its columns and how blink traces its step."""

    file: str
    cache: str
    prefix: str       # column prefix: infer_* | train_*
    trace_mode: str   # blink.dryrun mode: inference | train
    channels_last: bool = False  # the benchmark ran model and input channels-last (NHWC)
    # timm built its attention on F.scaled_dot_product_attention (timm.layers.use_fused_attn).
    # Not for the torch 1.12 training file: that torch has no SDPA, so timm computed attention
    # as q @ k^T, softmax, @ v; blink traces timm's same non-fused path instead of costing
    # flash kernels that never ran (deit_small training step: 1.23 -> 1.02 measured/predicted).
    fused_attention: bool = True
    # timm's fast norm (benchmark.py --fast-norm, timm.layers.set_fast_norm): under AMP its
    # norm layers (GroupNormAct, LayerNorm, LayerNorm2d, RmsNorm ...) run in the autocast dtype
    # instead of torch's fp32 force-cast (group_norm / layer_norm are on autocast's fp32 list:
    # a float32 copy in, float32 out, the next fp16 op casting back). The 2024 inference files
    # were measured that way, the 2022 training file was not: traced both ways, measured /
    # analytic for resnetv2_50d_gn (a GroupNorm twin of resnetv2_50d, 1.14) is 1.79 default vs
    # 1.06 fast in inference and 1.00 default vs 0.66 fast in training; resnetv2_50x1_bit 1.77
    # vs 1.06, convnext_tiny 1.13 vs 0.99, davit_tiny 1.21 vs 0.99, gcvit_tiny 1.23 vs 1.04,
    # maxvit_tiny_rw_224 1.12 vs 1.00, vit_small 1.06 vs 1.01 (eva02_small 0.96 vs 0.92 the
    # exception); training convnext_tiny 0.88 vs 0.79, vit_small 0.96 vs 0.93. A property of
    # how the rows were measured, not of the cost model: blink's users' default (no fast norm)
    # is what blink.predict traces.
    fast_norm: bool = False
    # The file was measured with torch 2.4, whose math SDPA (the only kernel for timm's 5-D
    # attentions: NesT, Twins-SVT's locally grouped attention, Hiera's mask units) ran in fp16
    # with a plain softmax; today's upcasts to fp32 and adds _safe_softmax's passes
    # (blink.sdpa torch24_math_sdpa). Traced the 2.4 way, measured / analytic at batch 1024:
    # nest_tiny 0.48 -> 0.97, nest_base 0.48 -> 0.93, twins_svt_small 0.79 -> 0.97, _large
    # 0.77 -> 0.89; Hiera 0.85-1.02 -> 1.03-1.18 (something else in it is costed short).
    torch24_math_sdpa: bool = False
    # The training file was measured with torch 1.12: timm's SGD ran its single-tensor loop
    # and the backward accumulated into zero-filled gradients (blink.dryrun torch112_sgd_step).
    torch112_sgd: bool = False
    # ... and with 2022's timm (0.6), whose ViT / DeiT / Twins / VOLO attention scaled the
    # (B, heads, N, N) scores, attn = (q @ k^T) * scale, where today's non-fused path scales q
    # (B, heads, N, head_dim) first: the same math, one N x N element-wise pass more forward
    # and backward (_timm_2022_attention_scale).
    timm_2022_attention_scale: bool = False


# The training file times forward + cross entropy under AMP, backward and an SGD step (timm's
# "sgd": Nesterov momentum 0.9, no weight decay; zero_grad() runs before the timer starts):
# blink traces the same step (mode "train", optimizer "sgd", torch112_sgd).
MODES = {
    "inference": _Source(SOURCE_FILE, CACHE_NAME, "infer", "inference", fast_norm=True,
                         torch24_math_sdpa=True),
    "train": _Source(TRAIN_SOURCE_FILE, TRAIN_CACHE_NAME, "train", "train",
                     fused_attention=False, torch112_sgd=True, timm_2022_attention_scale=True),
    # The same inference benchmark run channels-last (benchmark.py --channels-last): never
    # trained on; benchmarks/timm_layouts.py checks blink's layout costing against it.
    "inference-nhwc": _Source(NHWC_SOURCE_FILE, NHWC_CACHE_NAME, "infer", "inference",
                              channels_last=True, fast_norm=True, torch24_math_sdpa=True),
}


def _source(mode: str) -> _Source:
    if mode not in MODES:
        raise ValueError(f"timm cache mode {mode!r} is not one of {', '.join(MODES)}")
    return MODES[mode]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_cache_path(mode: str = "inference") -> Path:
    return repo_root() / "data" / "derived" / _source(mode).cache


def family_of(model: str) -> str:
    """The timm name's family prefix: its leading letters after a weight-source prefix
    (resnet50d -> resnet, tf_efficientnet_b3 -> efficientnet, vit_base_patch16_224 -> vit)."""
    m = re.match(r"[a-z]+", _SOURCE_PREFIX.sub("", model))
    return m.group(0) if m else model


def read_benchmark(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as fh:
        return list(csv.DictReader(fh))


def benchmark_path(data_root: Path, mode: str = "inference") -> Path:
    """The public timm-rtx3090 file of `mode`'s measurements under `data_root`."""
    return data_root / "timm-rtx3090" / _source(mode).file


def select_models(rows: list[dict[str, str]], max_models: int) -> list[dict[str, str]]:
    """A deterministic subsample spread over families: families in name order, round-robin,
    each family's models in the order of a hash of their name."""
    by: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by.setdefault(family_of(r["model"]), []).append(r)
    for fam in by:
        by[fam].sort(key=lambda r: hashlib.sha256(r["model"].encode()).hexdigest())
    out: list[dict[str, str]] = []
    depth = 0
    while len(out) < max_models and any(depth < len(v) for v in by.values()):
        for fam in sorted(by):
            if depth < len(by[fam]) and len(out) < max_models:
                out.append(by[fam][depth])
        depth += 1
    return sorted(out, key=lambda r: r["model"])


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "blink", "csrc"],
                               cwd=repo_root(), capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextlib.contextmanager
def _timm_fused_attention(enable: bool) -> Iterator[None]:
    """timm's global fused-attention switch set to `enable` while models are built (its
    attention modules read it in __init__), then put back as it was."""
    from timm.layers import config

    before = config._USE_FUSED_ATTN
    config.set_fused_attn(enable)
    try:
        yield
    finally:
        config._USE_FUSED_ATTN = before


@contextlib.contextmanager
def _timm_fast_norm(enable: bool) -> Iterator[None]:
    """timm's global fast-norm switch set to `enable` while models are built (its norm layers
    read it in __init__), then put back as it was."""
    from timm.layers import fast_norm

    before = fast_norm.is_fast_norm()
    fast_norm.set_fast_norm(enable)
    try:
        yield
    finally:
        fast_norm.set_fast_norm(before)


# timm modules whose non-fused attention scales q (q = q * self.scale; attn = q @ k^T) where
# the timm of mid-2022 scaled the scores (attn = (q @ k^T) * self.scale): vision_transformer's
# Attention (ViT, DeiT, PiT, ... today timm.layers.Attention), Twins' LocallyGroupedAttn and
# GlobalSubSampleAttn, VOLO's Attention. (CaiT, Swin and BEiT scaled q then as now.)
_SCORE_SCALED_2022 = (("timm.layers.attention", "Attention"),
                      ("timm.models.twins", "LocallyGroupedAttn"),
                      ("timm.models.twins", "GlobalSubSampleAttn"),
                      ("timm.models.volo", "Attention"))


@functools.cache
def _scale_scores_class() -> type:
    """The TorchFunctionMode _timm_2022_attention_scale enters around each hooked forward
    (built once: torch is imported lazily here). An instance defers the first `t * scale` to
    the matmul consuming t: (t @ x) * scale, the same math with the multiply on the matmul's
    output."""
    import torch
    from torch.overrides import TorchFunctionMode

    muls = (torch.Tensor.__mul__, torch.Tensor.mul, torch.mul)
    matmuls = (torch.Tensor.__matmul__, torch.Tensor.matmul, torch.matmul)

    class ScaleScores(TorchFunctionMode):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.scale = scale
            self.pending: Any = None
            self.done = False

        def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if not self.done and self.pending is None and func in muls and len(args) == 2 \
                    and isinstance(args[0], torch.Tensor) and isinstance(args[1], float) \
                    and args[1] == self.scale:
                self.pending = args[0]
                return args[0]
            if not self.done and self.pending is not None and func in matmuls \
                    and args[0] is self.pending:
                self.done = True
                return func(*args, **kwargs) * self.scale
            return func(*args, **kwargs)

    return ScaleScores


def _timm_2022_attention_scale(model: Any) -> None:
    """Hooks each module of `model` listed in _SCORE_SCALED_2022 so that its non-fused forward
    scales the attention scores, not q, as 2022's timm did; a RuntimeError from a forward where
    the q * scale -> matmul pattern is missing (timm changed: the list needs a look)."""
    import importlib

    classes = tuple(getattr(importlib.import_module(mod), cls) for mod, cls in _SCORE_SCALED_2022)

    def pre(module: Any, args: Any) -> None:
        mode = _scale_scores_class()(module.scale)
        module._blink_scale_scores = mode
        mode.__enter__()

    def post(module: Any, args: Any, out: Any) -> None:
        # always_call: a forward that raised leaves no mode behind (torch then warns of this
        # hook's error and re-raises the forward's own)
        mode = module.__dict__.pop("_blink_scale_scores")
        mode.__exit__(None, None, None)
        if not mode.done:
            raise RuntimeError(f"{type(module).__name__}: no q * scale -> q @ k^T to reorder")

    for m in model.modules():
        if isinstance(m, classes) and not m.fused_attn:
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post, always_call=True)


def build_model(name: str, batch: int, img: int, want_params: float | None = None,
                mode: str = "inference") -> tuple[Any, int]:
    """(trace, param count) of the timm model `name` at random init on meta, traced at (batch,
    3, img, img) as the benchmark ran it (AMP fp16 on the RTX 3090; an inference step, or a
    training step with SGD for mode "train"); raises ValueError when its param count is more
    than PARAM_TOLERANCE off `want_params`."""
    import timm
    import torch

    from ..dryrun import torch112_sgd_step, trace_model
    from ..sdpa import torch24_math_sdpa

    src = _source(mode)
    with torch.device("meta"), _timm_fused_attention(src.fused_attention), \
            _timm_fast_norm(src.fast_norm):
        model = timm.create_model(name, pretrained=False)
    params = sum(p.numel() for p in model.parameters())
    if want_params is not None and abs(params - want_params) > PARAM_TOLERANCE * want_params:
        raise ValueError(f"param count {params / 1e6:.2f}M != benchmark {want_params / 1e6:.2f}M")
    extra = {"optimizer": "sgd"} if src.trace_mode == "train" else {}
    if src.timm_2022_attention_scale:
        _timm_2022_attention_scale(model)
    with torch24_math_sdpa(src.torch24_math_sdpa), torch112_sgd_step(src.torch112_sgd):
        t = trace_model(model, input_shape=(batch, 3, img, img), batch_size=batch, gpu=GPU,
                        dtype="amp-fp16", mode=src.trace_mode, channels_last=src.channels_last,
                        **extra)
    return t, params


def predict_benchmark_trace(t: Trace) -> Prediction:
    """blink's analytic prediction of a build_model trace as timm's benchmark ran it."""
    from ..predict import predict_trace

    # timm's benchmark.py sets cudnn.benchmark and matmul.allow_tf32 = True. The cache holds
    # the analytic prediction (the trees' input), with the deterministic host table (the
    # benchmark's host is not this CPU).
    return predict_trace(t, GPU, allow_tf32_matmul=True, allow_tf32_cudnn=True,
                         cudnn_benchmark=True, host_time="table", predictor="analytic")


def predict_row(r: dict[str, str], on_trace: Any = None,
                mode: str = "inference") -> dict[str, Any]:
    """blink's prediction for one benchmark row of `mode`'s file (raises on a failed build,
    trace or param mismatch); on_trace(name, batch, img, trace) sees the trace of a kept row."""
    src = _source(mode)
    name = r["model"]
    bs, img = int(r[f"{src.prefix}_batch_size"]), int(r[f"{src.prefix}_img_size"])
    t, params = build_model(name, bs, img, float(r["param_count"]) * 1e6, mode)
    p = predict_benchmark_trace(t)
    out: dict[str, Any] = {
        "model": name, "family": family_of(name), "img_size": img, "batch": bs,
        "measured_ms": float(r[f"{src.prefix}_step_time"]),
        "param_count_m": float(r["param_count"]), "params": params,
        # the training file has no GMACs / activation columns
        "gmacs": float(r.get("infer_gmacs") or "nan"),
        "macts_m": float(r.get("infer_macts") or "nan"),
        # time_ms first only to keep the cache's column order (model_summary sets it too)
        "time_ms": p.time_ms, "lower_ms": p.lower_ms, **model_summary(p),
    }
    if on_trace is not None:  # only a row that is kept: the graphs stay aligned with the rows
        on_trace(name, bs, img, t)
    return out


def build_cache(data_root: Path, out: Path | None = None, max_models: int = DEFAULT_MAX_MODELS,
                log: Any = sys.stderr, on_trace: Any = None, mode: str = "inference") -> Path:
    """Trace and predict the selected benchmark rows of `mode`'s file; write the cache and its
    provenance. on_trace(name, batch, img, trace) sees each kept row's trace (the graph cache
    is built in the same pass by blink train --refresh-timm)."""
    import timm
    import torch

    source = _source(mode)
    src = benchmark_path(data_root, mode)
    rows = select_models(read_benchmark(src), max_models)
    out = out or default_cache_path(mode)
    out.parent.mkdir(parents=True, exist_ok=True)
    commit = _git_commit()  # the code that does the tracing, taken before it runs
    done: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    skipped_models: dict[str, str] = {}
    t0 = time.time()
    for i, r in enumerate(rows):
        try:
            done.append(predict_row(r, on_trace, mode))
        except Exception as exc:  # noqa: BLE001 - a model that cannot be rebuilt is skipped
            why = type(exc).__name__ + (": param count mismatch" if "param count" in str(exc)
                                        else "")
            skipped[why] += 1
            skipped_models[r["model"]] = f"{type(exc).__name__}: {str(exc)[:160]}"
        if log is not None and (i + 1) % 50 == 0:
            print(f"timm cache: {i + 1}/{len(rows)} models, {len(done)} kept, "
                  f"{time.time() - t0:.0f}s", file=log)
    cols = list(done[0].keys()) if done else ["model"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for d in done:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in d.items()})
    # mtime=0: the same rows give the same bytes.
    with open(out, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue().encode())
    from .data import sha256_file

    prov = {
        "format_version": 1, "file": out.name,
        "source": {"path": f"shared/data/public/timm-rtx3090/{source.file}",
                   "sha256": sha256_file(src)},
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "blink_commit": commit, "torch_version": torch.__version__,
        "timm_version": timm.__version__, "gpu": GPU, "dtype": "amp-fp16",
        "mode": source.trace_mode, "channels_last": source.channels_last,
        "timm_fused_attention": source.fused_attention, "timm_fast_norm": source.fast_norm,
        "torch24_math_sdpa": source.torch24_math_sdpa, "torch112_sgd": source.torch112_sgd,
        "timm_2022_attention_scale": source.timm_2022_attention_scale,
        "command": "python -m blink.train.timm_cache"
        + ("" if mode == "inference" else f" --mode {mode}")
        + ("" if max_models == DEFAULT_MAX_MODELS else f" --max-models {max_models}"),
        "selection": f"up to {max_models} of {len(read_benchmark(src))} rows, round-robin over "
                     "name families (select_models)",
        "param_tolerance": PARAM_TOLERANCE, "attempted": len(rows), "kept": len(done),
        "skipped": dict(sorted(skipped.items())), "skipped_models": skipped_models,
        "seconds": round(time.time() - t0, 1),
    }
    out.with_suffix("").with_suffix(".provenance.json").write_text(
        json.dumps(prov, indent=1, sort_keys=False) + "\n")
    return out


def load_cache(path: Path | None = None, mode: str = "inference") -> list[dict[str, Any]]:
    """The cached rows of `mode`, numbers parsed."""
    path = path or default_cache_path(mode)
    if not path.is_file():
        flag = "" if mode == "inference" else f" --mode {mode}"
        raise FileNotFoundError(f"{path}: no timm cache; create it with "
                                f"`python -m blink.train.timm_cache{flag}`")
    with gzip.open(path, "rt", newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for r in rows:
        d: dict[str, Any] = {}
        for k, v in r.items():
            if k in ("model", "family"):
                d[k] = v
            else:
                d[k] = float(v)
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    from .data import public_root

    ap = argparse.ArgumentParser(prog="python -m blink.train.timm_cache", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="the shared/data/public folder")
    ap.add_argument("--out", default=None, help=f"cache path (default data/derived/{CACHE_NAME})")
    ap.add_argument("--max-models", type=int, default=DEFAULT_MAX_MODELS)
    ap.add_argument("--mode", choices=sorted(MODES), default="inference",
                    help="which benchmark file: inference steps (default) or training steps")
    a = ap.parse_args(argv)
    path = build_cache(public_root(a.data), Path(a.out) if a.out else None, a.max_models,
                       mode=a.mode)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
