"""The predictions the service made, kept in memory and in a small JSON file under the user's
cache directory, each shown next to a measured run where a collected dataset
(blink.collect.load_dataset) holds the same configuration: model, batch size, sequence length,
dtype, mode, and the GPU the run's features were computed for."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

DEFAULT_DATA_DIR = "data"


def default_history_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "blink", "history.json")


def _mode(mode: Any, grad_checkpointing: Any, kv_cache: Any = None) -> Any:
    """A run's mode, marked when its activation checkpointing was on or it was a generation step
    after cached tokens (other configurations)."""
    out = f"{mode}+grad_checkpointing" if grad_checkpointing else mode
    return f"{out}+kv_cache={int(kv_cache)}" if kv_cache else out


def _config_key(model: Any, batch: Any, seq: Any, dtype: Any, mode: Any, gpu: Any) -> str:
    return json.dumps([model, batch, seq, dtype, mode, gpu])


class History:
    def __init__(self, max_entries: int, path: str | None, datasets: list[str]) -> None:
        self.max_entries = max_entries
        self.path = default_history_path() if path is None else path
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []
        self.problems: list[str] = []
        if self.path and os.path.exists(self.path):
            try:
                with open(self.path, encoding="utf-8") as f:
                    doc = json.load(f)
                if doc.get("format") != "blink.history" or not isinstance(doc.get("entries"),
                                                                          list):
                    raise ValueError("not a blink history file")
                self._entries = [e for e in doc["entries"] if isinstance(e, dict)][-max_entries:]
            except (OSError, ValueError) as exc:
                self.problems.append(f"{self.path}: ignored ({exc}); a new history starts")
        self._measured: dict[str, dict[str, Any]] = {}
        self._datasets: list[dict[str, Any]] = []
        self._load_datasets(datasets)

    # -- measured runs -----------------------------------------------------------------------
    def _load_datasets(self, paths: list[str]) -> None:
        from ..collect.dataset import PROVENANCE, load_dataset
        from ..errors import BlinkError

        if not paths and os.path.isdir(DEFAULT_DATA_DIR):
            paths = sorted(os.path.join(DEFAULT_DATA_DIR, d) for d in os.listdir(DEFAULT_DATA_DIR)
                           if os.path.exists(os.path.join(DEFAULT_DATA_DIR, d, PROVENANCE)))
        for path in paths:
            try:
                ds = load_dataset(path)
            except (BlinkError, OSError, ValueError) as exc:
                self.problems.append(f"dataset {path}: {exc}")
                self._datasets.append({"path": path, "runs": 0, "error": str(exc)[:300]})
                continue
            n = 0
            for r in ds.runs:
                if r.get("kind") != "model" or r.get("status") != "ok":
                    continue
                if r.get("time_median_s") is None:
                    continue
                key = _config_key(r["model"], r["batch_size"], r["seq_len"], r["dtype"],
                                  _mode(r["mode"], r.get("grad_checkpointing"),
                                        r.get("kv_cache")),
                                  r["feature_gpu"])
                self._measured[key] = {
                    "dataset": path, "run_id": r["run_id"], "device": r.get("device"),
                    "gpu_name": r.get("gpu_name"), "time_ms": r["time_median_s"] * 1e3,
                    "peak_reserved_bytes": r.get("peak_reserved_bytes"),
                    "peak_allocated_bytes": r.get("peak_allocated_bytes")}
                n += 1
            self._datasets.append({"path": path, "runs": n, "device": ds.provenance.get("device"),
                                   "preset": ds.provenance.get("preset")})

    def measured_for(self, model: Any, batch: Any, seq: Any, dtype: Any, mode: Any,
                     gpu: Any) -> dict[str, Any] | None:
        return self._measured.get(_config_key(model, batch, seq, dtype, mode, gpu))

    def dataset_info(self) -> list[dict[str, Any]]:
        return list(self._datasets)

    # -- the history -------------------------------------------------------------------------
    def add(self, p: Any) -> None:
        entry = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": p.model,
            "gpu": p.gpu, "dtype": p.dtype,
            "mode": _mode(p.mode, getattr(p, "grad_checkpointing", False),
                          getattr(p, "kv_cache", None)),
            "batch_size": p.batch_size,
            "seq_len": p.seq_len, "time_ms": p.time_ms,
            "peak_reserved_bytes": p.peak_reserved_bytes, "nvidia_smi_bytes": p.nvidia_smi_bytes,
            "fits": p.fits,
        }
        with self._lock:
            self._entries.append(entry)
            del self._entries[:-self.max_entries]
            snapshot = list(self._entries)
        self._save(snapshot)

    def _save(self, entries: list[dict[str, Any]]) -> None:
        if not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"format": "blink.history", "version": 1, "entries": entries}, f)
            os.replace(tmp, self.path)
        except OSError as exc:
            # The history is a convenience: a read-only cache dir must not fail a prediction.
            self.problems.append(f"{self.path}: not saved ({exc})")

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            out = [dict(e) for e in self._entries]
        for e in out:
            e["measured"] = self.measured_for(e["model"], e["batch_size"], e["seq_len"],
                                              e["dtype"], e["mode"], e["gpu"])
        return out[::-1]  # newest first
