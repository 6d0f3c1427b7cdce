"""Blink's exceptions. Every error Blink raises on purpose is a BlinkError."""
from __future__ import annotations


class BlinkError(Exception):
    """Base class; the C++ core's blink::Error arrives as a subclass of this type."""


class ConfigError(BlinkError, ValueError):
    """A bad argument: unknown name, bad shape, dtype or batch size."""


class BatchSizeError(ConfigError):
    """A batch size no GPU could hold (its inputs alone exceed every GPU's memory, or a tensor
    size overflows); the message names the batch size. Planners searching batch sizes can
    treat it as "does not fit"."""


class UnknownGPUError(ConfigError, KeyError):
    """A GPU name that is not in the hardware table."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AmbiguousGPUError(UnknownGPUError):
    """A GPU name that fits several entries of the hardware table ("A100", "RTX PRO 6000");
    the message lists them, best first."""


class UnknownModelError(ConfigError, KeyError):
    """A zoo name that Blink does not know."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ExtensionLoadError(BlinkError, ImportError):
    """blink._C is missing or was built for another torch / Python."""


class TraceError(BlinkError, RuntimeError):
    """The model could not be dry-run; names the op and the module path."""

    def __init__(self, message: str, *, op: str | None = None, module: str | None = None) -> None:
        super().__init__(message)
        self.op = op
        self.module = module


class DataDependentError(TraceError):
    """An op whose output shape depends on tensor values (nonzero, masks, .item())."""


class MissingMetaKernelError(TraceError):
    """An op (often a custom one) with no meta kernel, so it cannot run in a dry run."""


class DatasetError(BlinkError, ValueError):
    """A collected dataset (blink collect's output) that is missing, truncated, corrupted or of
    another schema version; the message names the file, and the line or column when known."""


class ArtifactError(BlinkError, ValueError):
    """A shipped predictor artifact under models/ (card.json, a forest, the conformal table, the
    GNN) that is missing, corrupt, of another format or feature-schema version, or inconsistent
    with its card; the message names the file and what to do."""
