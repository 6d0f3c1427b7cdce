"""`blink serve`: Blink as a REST service (FastAPI + uvicorn), and the dashboard's server.

    GET  /health  /gpus  /models  /limits  /history  /nvml
    POST /predict          {"model": "torchvision:resnet50", "batch_size": 32, "gpu": "H200"}
    POST /optimize-batch   {"model": "hf:gpt2", "seq_len": 1024, "mode": "train"}
    POST /compare          {"models": [...], "gpus": [...], "dtypes": [...], "batch_size": 8}

OpenAPI at /openapi.json (docs at /docs), generated from the typed request models in
schemas.py. Requests name models (blink.server.models.NAME_PATTERN) or send a transformers
config as a JSON object; nothing in a request is imported, evaluated or unpickled. Every bound
on one request's work is in Limits (limits.py), with its default; `blink serve --help` lists
them as options.
"""
from __future__ import annotations

from .limits import Limits

__all__ = ["Limits", "create_app", "serve"]


def create_app(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - lazy: FastAPI on first use
    from .app import create_app as make

    return make(*args, **kwargs)


def serve(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
    from .app import serve as run

    run(*args, **kwargs)
