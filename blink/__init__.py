"""Blink: predict how long a PyTorch model takes on a GPU and how much memory it needs.

    with blink.trace(model) as t:      # record a dry run of your own code on meta tensors
        model(x)
    t = blink.trace_model("torchvision:resnet50", batch_size=32, mode="train")
"""
from __future__ import annotations

from . import zoo
from .dryrun import trace_model
from .errors import (
    BlinkError,
    ConfigError,
    DataDependentError,
    MissingMetaKernelError,
    TraceError,
    UnknownGPUError,
    UnknownModelError,
)
from .plan import compare, max_batch_size, optimize_batch
from .predict import Prediction, predict, predict_trace
from .trace import Op, StorageEvent, TensorMeta, Trace, trace

__version__ = "0.1.0"
__all__ = [
    "BlinkError", "ConfigError", "DataDependentError", "MissingMetaKernelError", "Op",
    "Prediction", "predict", "predict_trace",
    "StorageEvent", "TensorMeta", "Trace", "TraceError", "UnknownGPUError", "UnknownModelError",
    "__version__", "compare", "max_batch_size", "optimize_batch", "trace", "trace_model", "zoo",
]
