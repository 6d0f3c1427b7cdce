"""Ground-truth collection: run models and single ops for real, time them, record per-unit
kernel times (CUPTI on a GPU), peaks and the environment, and write a versioned dataset.

    blink collect --preset smoke --out out/smoke --device cpu      # the pipeline on a CPU
    from blink.collect import load_dataset; ds = load_dataset("data/...")

Modules: presets (what), protocol (how, per configuration), measure (timers, memory, traces),
cupti (the blink._cupti wrapper), match (dry-run units <-> measured ops), dataset (schema,
writer, loader), runner (the loop), cli.
"""
from __future__ import annotations

from .dataset import Dataset, load_dataset, read_history, validate_dataset

__all__ = ["Dataset", "load_dataset", "read_history", "validate_dataset"]
