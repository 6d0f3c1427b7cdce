"""The environment a measurement was taken in: device, clocks, driver, library versions and
math settings. Recorded once per collection session and joined to every row by ``env_id``."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# Columns of the environment copied into every run row (the rest is in provenance.json).
ROW_FIELDS = ("gpu_name", "sm_count", "compute_capability", "sm_clock_mhz", "max_sm_clock_mhz",
              "driver", "cuda", "cudnn", "torch", "python", "blink", "cupti", "cpu")


def _nvidia_smi(index: int) -> dict[str, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    keys = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem",
            "clocks.applications.graphics", "power.limit", "persistence_mode", "pstate")
    try:
        out = subprocess.run([exe, f"--id={index}", f"--query-gpu={','.join(keys)}",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.split(",")]
    return dict(zip(keys, values, strict=True)) if len(values) == len(keys) else {}


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "[N/A]", "N/A") else None
    except ValueError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def capture(device: str) -> dict[str, Any]:
    """Everything that can change a measurement, for `device` ("cuda" or "cpu")."""
    from .. import __version__

    env: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "blink": __version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "tf32_matmul_default": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn_default": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cupti": None,
        "gpu_name": None, "sm_count": None, "compute_capability": None, "memory_bytes": None,
        "sm_clock_mhz": None, "max_sm_clock_mhz": None, "mem_clock_mhz": None,
        "driver": None, "power_limit_w": None, "persistence_mode": None,
    }
    if device == "cuda":
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        smi = _nvidia_smi(idx)
        env.update({
            "gpu_name": props.name,
            "sm_count": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
            else None,
            "driver": smi.get("driver_version"),
            "sm_clock_mhz": _float(smi.get("clocks.sm")),
            "max_sm_clock_mhz": _float(smi.get("clocks.max.sm")),
            "mem_clock_mhz": _float(smi.get("clocks.mem")),
            "power_limit_w": _float(smi.get("power.limit")),
            "persistence_mode": smi.get("persistence_mode"),
        })
        try:
            from .. import _cupti  # type: ignore[attr-defined]

            env["cupti"] = str(_cupti.library_api_version())
        except Exception:  # noqa: BLE001 - recorded as unavailable
            env["cupti"] = None
    return env


def env_id(env: dict[str, Any]) -> str:
    """A short id of the environment; volatile readings (current clocks) are left out."""
    stable = {k: v for k, v in env.items() if k not in ("sm_clock_mhz", "mem_clock_mhz")}
    return hashlib.sha1(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:12]


@contextmanager
def math_flags(tf32_matmul: bool, tf32_cudnn: bool) -> Iterator[None]:
    """Set the TF32 switches for one measurement and restore them afterwards."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = tf32_matmul
    torch.backends.cudnn.allow_tf32 = tf32_cudnn
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
