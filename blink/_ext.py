"""Loads blink._C and turns a failed load into an error that says what to do."""
from __future__ import annotations

import json
import os
import sys
from types import ModuleType

import torch

from .errors import ExtensionLoadError

_BUILD_STAMP = os.path.join(os.path.dirname(__file__), "_build.json")


def _built_for() -> str:
    try:
        with open(_BUILD_STAMP, encoding="utf-8") as f:
            info = json.load(f)
        return f"torch {info.get('torch_version')} / Python {info.get('python_version')}"
    except (OSError, ValueError):
        return "an unknown torch / Python (no build stamp found)"


def load() -> ModuleType:
    try:
        from . import _C
    except ImportError as exc:
        running = f"torch {torch.__version__} / Python {sys.version.split()[0]}"
        raise ExtensionLoadError(
            f"blink's compiled extension blink._C could not be loaded ({exc}). It was built for "
            f"{_built_for()}; this process runs {running}. Rebuild it against the torch you run: "
            "`pip install --no-build-isolation -e .` in the blink checkout."
        ) from exc
    return _C
