"""`python -m blink.info`: versions, build options and what is available."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys


def collect() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "blink": None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
    }
    try:
        from . import __version__
        from ._ext import load

        info["blink"] = __version__
        built = load().build_info()
        info["extension"] = "loaded"
        info["built_for_torch"] = built["torch_version"]
        info["built_for_python"] = built["python_version"]
        info["compiler"] = built["compiler"]
        info["cxx_standard"] = built["cplusplus"]
    except Exception as exc:  # noqa: BLE001 - info must print whatever it can
        info["extension"] = f"NOT LOADED: {exc}"
    info["cupti_module"] = (
        "available" if importlib.util.find_spec("blink._cupti") is not None
        else "not built (optional; needs CUDA + CUPTI headers at build time)"
    )
    # Versions from package metadata: importing timm / transformers would take seconds.
    for mod in ("torchvision", "timm", "transformers", "xgboost"):
        try:
            info[mod] = importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            info[mod] = "not installed"
    try:
        from .hardware import list_gpus

        info["gpus_known"] = len(list_gpus())
    except Exception as exc:  # noqa: BLE001
        info["gpus_known"] = f"error: {exc}"
    # Whether this process can see a GPU, without initialising CUDA ourselves.
    info["cuda_initialized"] = torch.cuda.is_initialized()
    return info


def main() -> int:
    info = collect()
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")
    return 0 if info.get("extension") == "loaded" else 1


if __name__ == "__main__":
    raise SystemExit(main())
