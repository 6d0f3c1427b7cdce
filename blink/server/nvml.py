"""Live utilisation and memory of local NVIDIA GPUs through NVML (nvidia-ml-py), for the
dashboard. Where there is no NVIDIA driver or no GPU, says so instead."""
from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"init": None}  # None: not tried; str: why NVML is unavailable


def _init() -> str:
    if _state["init"] is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["init"] = ""
        except Exception as exc:  # noqa: BLE001 - any failure means "no NVML here"
            _state["init"] = f"no NVIDIA GPU or driver on this machine ({type(exc).__name__}: " \
                             f"{str(exc)[:120]})"
    return _state["init"]


def sample() -> dict[str, Any]:
    """{"available": bool, "reason": str, "gpus": [{index, name, util_percent, memory_used_bytes,
    memory_total_bytes, temperature_c, power_w}]}"""
    with _lock:
        reason = _init()
        if reason:
            return {"available": False, "reason": reason, "gpus": []}
        import pynvml

        out = []
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                util = pynvml.nvmlDeviceGetUtilizationRates(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                name = pynvml.nvmlDeviceGetName(h)
                try:
                    temp = float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
                    power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                except pynvml.NVMLError:
                    temp, power = None, None
                out.append({"index": i, "name": name if isinstance(name, str) else name.decode(),
                            "util_percent": float(util.gpu), "memory_used_bytes": int(mem.used),
                            "memory_total_bytes": int(mem.total), "temperature_c": temp,
                            "power_w": power})
        except pynvml.NVMLError as exc:
            return {"available": False, "reason": f"NVML error: {exc}", "gpus": []}
        if not out:
            return {"available": False, "reason": "NVML sees no GPU", "gpus": []}
        return {"available": True, "reason": "", "gpus": out}
