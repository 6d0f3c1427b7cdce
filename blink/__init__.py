"""Blink: predict how long a PyTorch model takes on a GPU and how much memory it needs.

    with blink.trace(model) as t:      # record a dry run of your own code on meta tensors
        model(x)
    t = blink.trace_model("torchvision:resnet50", batch_size=32, mode="train")
    p = blink.predict("timm:resnet50", batch_size=32, gpu="H100-SXM")

Attributes load on first use, so `import blink` (and `blink --help`) stays fast: torch, the
extension and the model libraries are imported only when something needs them.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from .errors import (
    BatchSizeError,
    BlinkError,
    ConfigError,
    DataDependentError,
    MissingMetaKernelError,
    TraceError,
    UnknownGPUError,
    UnknownModelError,
)

__version__ = "0.1.0"

# name -> module that defines it (imported on first access)
_LAZY = {
    "trace_model": "dryrun",
    "Prediction": "predict", "predict": "predict", "predict_trace": "predict",
    "Op": "trace", "StorageEvent": "trace", "TensorMeta": "trace", "Trace": "trace",
    "trace": "trace",
    "estimate_graph": "compile", "compile_report": "compile",
    "compile_backend": "compile",
    "compare": "plan", "max_batch_size": "plan", "optimize_batch": "plan",
}
_SUBMODULES = ("zoo", "models", "compile", "cost", "hardware", "dryrun", "predict", "cli", "plan",
               "learned", "train")

__all__ = [
    "BatchSizeError", "BlinkError", "ConfigError", "DataDependentError",
    "MissingMetaKernelError", "Op",
    "Prediction", "predict", "predict_trace", "estimate_graph", "compile_report",
    "compile_backend",
    "StorageEvent", "TensorMeta", "Trace", "TraceError", "UnknownGPUError", "UnknownModelError",
    "__version__", "compare", "max_batch_size", "optimize_batch", "trace", "trace_model", "zoo",
]


class _Package(types.ModuleType):
    # Importing blink.trace / blink.predict (the submodules) would set blink.trace to the
    # module; keep the names for the callables, as `from .trace import trace` used to.
    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("trace", "predict") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in ("_C", "_cupti"):  # the extensions link against torch's libraries: load it first
        import torch  # noqa: F401

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'blink' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
