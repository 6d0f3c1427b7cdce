"""What to collect: run configurations (a model step or one op) and the named presets.

Every configuration has a stable ``run_id`` (a hash of its fields and the seed), which is how a
half-done output directory is resumed without repeating work.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from types import ModuleType
from typing import Any

from ..errors import ConfigError

SEED = 0


def _ops_module() -> ModuleType:
    # Imported on use, since it imports torch: `blink --help` lists the preset names without it.
    from . import ops

    return ops


@dataclass(frozen=True)
class ModelRun:
    """One inference forward or training step of a zoo / builtin model."""

    model: str
    batch_size: int
    seq_len: int | None = None
    dtype: str = "fp32"  # fp32 | bf16 (parameters and inputs)
    mode: str = "inference"  # inference | train
    optimizer: str = "adamw"
    grad_checkpointing: bool = False  # the model's own activation checkpointing (train)
    kv_cache: int | None = None  # a generation step after this many cached tokens (inference)

    kind = "model"

    def fields(self) -> dict[str, Any]:
        out = {"kind": self.kind, "model": self.model, "batch_size": self.batch_size,
               "seq_len": self.seq_len, "dtype": self.dtype, "mode": self.mode,
               "optimizer": self.optimizer if self.mode == "train" else None}
        if self.grad_checkpointing:  # (absent otherwise: earlier runs keep their ids)
            out["grad_checkpointing"] = True
        if self.kv_cache:
            out["kv_cache"] = self.kv_cache
        return out

    def describe(self) -> str:
        seq = f" s={self.seq_len}" if self.seq_len else ""
        ckpt = " ckpt" if self.grad_checkpointing else ""
        kv = f" kv={self.kv_cache}" if self.kv_cache else ""
        return f"{self.model} b={self.batch_size}{seq}{kv} {self.dtype} {self.mode}{ckpt}"


@dataclass(frozen=True)
class OpRun:
    """One call of a single op (see blink.collect.ops) at one shape point."""

    family: str
    params: tuple[tuple[str, int], ...]
    dtype: str = "fp32"  # fp32 | tf32 | bf16

    kind = "op"

    @property
    def param_dict(self) -> dict[str, int]:
        return dict(self.params)

    def fields(self) -> dict[str, Any]:
        return {"kind": self.kind, "op": self.family, "params": self.param_dict,
                "dtype": self.dtype}

    def describe(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.params)
        return f"op {self.family}({shape}) {self.dtype}"


RunConfig = ModelRun | OpRun


def run_id(cfg: RunConfig, seed: int = SEED) -> str:
    text = json.dumps({**cfg.fields(), "seed": seed}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Protocol:
    """How each configuration is measured (recorded in the dataset's provenance)."""

    warmup_min: int = 2             # warm-up calls at least ...
    warmup_s: float = 0.5           # ... and at least this long (model steps)
    samples: int = 15               # timed samples (fewer when a call is slow; >= 3)
    min_sample_s: float = 2e-3      # a sample repeats the call until it lasts this long
    time_per_config_s: float = 3.0  # target time for the timed samples of a model step
    op_warmup_s: float = 0.05       # the same two for single ops
    op_time_s: float = 0.25
    model_trace_reps: int = 1       # calls traced per model configuration
    op_trace_reps: int = 5          # calls traced per op configuration (median per unit)
    memory_history: bool = False    # also record the allocator's event history (GPU)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    devices: tuple[str, ...]
    protocol: Protocol
    models: tuple[ModelRun, ...] = ()
    ops: tuple[OpRun, ...] = ()
    needs: dict[str, str] = field(default_factory=dict)  # model prefix -> python package

    def configs(self) -> list[RunConfig]:
        """Models (round-robin over model names) and ops (round-robin over families and
        dtypes) interleaved in proportion, so that a run cut short by its time budget covers
        every model and op family a little rather than a few completely."""
        models = _round_robin(self.models, lambda m: m.model)
        ops = _round_robin(self.ops, lambda o: f"{o.family}/{o.dtype}")
        if not models or not ops:
            return [*models, *ops]
        out: list[RunConfig] = []
        per_model = len(ops) / len(models)
        taken = 0
        for i, m in enumerate(models):
            out.append(m)
            upto = round((i + 1) * per_model)
            out.extend(ops[taken:upto])
            taken = upto
        return out


def _round_robin(items: tuple, key: Any) -> list:
    groups: dict[str, list] = {}
    for x in items:
        groups.setdefault(key(x), []).append(x)
    return [x for group in zip_longest(*groups.values()) for x in group if x is not None]


_PACKAGES = {"torchvision:": "torchvision", "timm:": "timm", "hf:": "transformers"}


def missing_package(model: str) -> str | None:
    """The package a model needs that is not installed here, or None."""
    for prefix, pkg in _PACKAGES.items():
        if model.startswith(prefix) and importlib.util.find_spec(pkg) is None:
            return pkg
    return None


def _models(names: list[str], batches: list[int], dtypes: list[str], modes: list[str],
            seqs: list[int | None] | None = None) -> list[ModelRun]:
    out = []
    for name in names:
        for mode in modes:
            for dtype in dtypes:
                for b in batches:
                    for s in (seqs or [None]):
                        out.append(ModelRun(name, b, s, dtype, mode))
    return out


_TF32_FAMILIES = ("mm", "bmm", "linear", "conv2d")  # where TF32 changes the kernel


def _ops(families: dict[str, int], dtypes: list[str], *, scale: float = 1.0,
         seed: int = SEED) -> list[OpRun]:
    out = []
    for family, n in families.items():
        for dtype in dtypes:
            if dtype == "tf32" and family not in _TF32_FAMILIES:
                continue  # the same kernels as fp32
            if dtype != "bf16" and family in _ops_module().BF16_ONLY:
                continue
            for p in _ops_module().grid(family, n, seed=seed, scale=scale):
                out.append(OpRun(family, tuple(sorted(p.items())), dtype))
    return out


def _smoke() -> Preset:
    models = [
        ModelRun("builtin:mlp", 4, None, "fp32", "inference"),
        ModelRun("builtin:convnet", 1, None, "fp32", "inference"),
        ModelRun("builtin:gpt", 1, 32, "fp32", "inference"),
        ModelRun("builtin:mlp", 4, None, "fp32", "train"),
        ModelRun("builtin:convnet", 2, None, "fp32", "train"),
        ModelRun("builtin:gpt", 1, 32, "fp32", "train"),
    ]
    fams = {f: 1 for f in ("mm", "linear", "conv2d", "sdpa", "layer_norm", "softmax", "add",
                           "sum")}
    fams["mm"] = 2
    return Preset(
        "smoke", "the whole pipeline in well under two minutes on a 2-core CPU (CI)",
        ("cpu", "cuda"),
        Protocol(warmup_min=1, warmup_s=0.0, samples=3, min_sample_s=0.0,
                 time_per_config_s=0.2, op_warmup_s=0.0, op_time_s=0.05,
                 model_trace_reps=1, op_trace_reps=2, memory_history=True),
        tuple(models), tuple(_ops(fams, ["fp32"], scale=0.02)))


_VISION = ["torchvision:resnet50", "torchvision:mobilenet_v2", "torchvision:vit_b_16",
           "torchvision:convnext_tiny"]
_TEXT = ["hf:gpt2", "hf:bert-base", "hf:llama-1b"]
_BUILTIN = ["builtin:mlp", "builtin:convnet", "builtin:gnnet", "builtin:gpt"]


def _h200() -> Preset:
    """Sized to finish in under 8 minutes on an H200 host (estimated, not yet measured: a model
    configuration ~2-5 s, most of it the dry run on the CPU; an op ~0.3 s)."""
    models = (_models(["builtin:convnet", "builtin:mlp"], [1, 32, 256], ["fp32", "bf16"],
                      ["inference", "train"])
              + _models(["builtin:gpt"], [1, 16], ["bf16", "fp32"], ["inference", "train"],
                        [128, 1024])
              + _models(["torchvision:resnet50", "torchvision:vit_b_16"], [1, 64],
                        ["bf16", "fp32"], ["inference", "train"])
              # Depthwise and narrow 1x1 convolutions on a datacentre GPU with today's cuDNN:
              # NVIDIA's published A100 EfficientNet tables (PyTorch 1.9, cuDNN 8.1) run 1.4-1.6x
              # Blink's time in TF32 and AMP, inference and training, while its V100 inference
              # rows are within 3-10% (README, benchmarks/models_published.py); fp32 here is
              # TF32 in cuDNN (PyTorch's default), NCHW.
              + _models(["torchvision:efficientnet_b0"], [64, 256], ["fp32", "amp-fp16", "bf16"],
                        ["inference"])
              + _models(["hf:gpt2", "hf:bert-base"], [1, 8], ["bf16"],
                        ["inference", "train"], [128, 512])
              # AMP with group norm against the same-sized batch-norm net: the per-unit times of
              # autocast's fp32 group norm and the casts around it (timm's ResNetV2-GN / BiT rows
              # on the RTX 3090 run at 0.53-0.63x of Blink's analytic time, other rows at 0.88x:
              # benchmarks/timm_group_norm.py).
              + _models(["builtin:gnnet", "builtin:convnet"], [64, 256], ["amp-fp16"],
                        ["inference"])
              + _models(["builtin:gnnet"], [64], ["amp-fp16"], ["train"])
              # transformers' own activation checkpointing: backward re-runs each layer
              + [ModelRun(m, 8, 512, "bf16", "train", grad_checkpointing=True)
                 for m in ("hf:gpt2", "hf:bert-base")]
              # a mixture of experts (64 experts, 8 per token: torch._grouped_mm), decode-sized
              # and prefill-sized
              + _models(["hf:olmoe-1b-7b"], [1, 8], ["bf16"], ["inference"], [512])
              + _models(["hf:olmoe-1b-7b"], [4], ["bf16"], ["train"], [512])
              # decode steps: one token after 2,048 in transformers' DynamicCache
              + [ModelRun(m, b, 1, "bf16", "inference", kv_cache=2048)
                 for m in ("hf:llama-1b", "hf:olmoe-1b-7b") for b in (1, 32)])
    fams = {f: 12 for f in _ops_module().FAMILIES}
    fams.update({"mm": 40, "linear": 24, "conv2d": 24, "sdpa": 24, "bmm": 16})
    fams.update({f: 8 for f in ("add", "mul", "gelu", "relu", "sum", "mean")})
    # Row norms over transformer widths with many rows: NeuSight's layer norms (H 512-1023)
    # take ~1 us per row per SM on all five of its boards, where Blink's DRAM-bound time says
    # 2.4-3.4x less on the H100 / H200 (README); the random grid has few such points. First in
    # their families' queues, so that a run its budget cuts short still times them.
    ops = [OpRun(family, (("cols", cols), ("rows", rows)), dtype)
           for family in ("layer_norm", "rms_norm") for rows in (8192, 65536)
           for cols in (768, 1024, 4096) for dtype in ("fp32", "bf16")]
    ops += _ops(fams, ["bf16", "fp32", "tf32"])
    return Preset("h200", "one short session on an H200: builtin models and resnet50 / ViT / "
                  "GPT-2 / BERT at a few batch sizes, and op sweeps (under 8 minutes unbounded)",
                  ("cuda",), Protocol(memory_history=True, samples=10, time_per_config_s=1.0),
                  tuple(models), tuple(ops))


def _full() -> Preset:
    models = (_models(_BUILTIN + _VISION, [1, 2, 4, 8, 16, 32, 64, 128, 256], ["fp32", "bf16"],
                      ["inference", "train"])
              + _models(_TEXT, [1, 2, 4, 8, 16, 32, 64], ["fp32", "bf16"],
                        ["inference", "train"], [128, 256, 512, 1024]))
    fams = {f: 200 for f in _ops_module().FAMILIES}
    fams.update({"mm": 600, "linear": 400, "conv2d": 400, "sdpa": 300, "bmm": 300})
    return Preset("full", "the zoo from batch 1 to 256, sequence lengths 128-1024, fp32 and "
                  "bf16, inference and training, and the full op grids (hours; resumable)",
                  ("cuda",), Protocol(memory_history=True), tuple(models),
                  tuple(_ops(fams, ["bf16", "fp32", "tf32"])))


_PRESETS = {"smoke": _smoke, "h200": _h200, "full": _full}


def preset_names() -> list[str]:
    return list(_PRESETS)


def get_preset(name: str) -> Preset:
    if name not in _PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(_PRESETS)}")
    return _PRESETS[name]()


def iter_available(preset: Preset) -> Iterator[tuple[RunConfig, str | None]]:
    """Each configuration with the reason it cannot run here (a missing package) or None."""
    for cfg in preset.configs():
        reason = None
        if isinstance(cfg, ModelRun):
            pkg = missing_package(cfg.model)
            if pkg:
                reason = f"{pkg} is not installed"
        yield cfg, reason
