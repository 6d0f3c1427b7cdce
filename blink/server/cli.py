"""`blink serve` and `blink dashboard` on the command line (imports nothing heavy)."""
from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from .limits import Limits


def _add_common(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=port, help=f"port (default {port})")
    p.add_argument("--history", default=None, metavar="PATH",
                   help="JSON file of past predictions (default: ~/.cache/blink/history.json; "
                        "'' keeps them in memory only)")
    p.add_argument("--dataset", action="append", default=None, metavar="DIR",
                   help="collected dataset to show measured values from (repeatable; default: "
                        "the datasets under ./data)")
    g = p.add_argument_group("limits on one request's work")
    for f in fields(Limits):
        g.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       metavar="N", help=f"{f.metadata['help']} (default {f.default})")


def _limits(a: argparse.Namespace) -> Limits:
    from ..errors import ConfigError

    try:
        return Limits(**{f.name: getattr(a, f.name) for f in fields(Limits)})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _run(a: argparse.Namespace) -> int:
    from . import serve

    serve(a.host, a.port, _limits(a), history_path=a.history, datasets=a.dataset)
    return 0


def _run_dashboard(a: argparse.Namespace) -> int:
    print(f"blink dashboard: open http://{a.host}:{a.port}/dashboard/", flush=True)
    return _run(a)


def add_server_parsers(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="run the REST service (FastAPI + uvicorn)",
                              description="Serve /predict, /optimize-batch, /compare and the "
                                          "catalogue over HTTP, with an OpenAPI schema at "
                                          "/openapi.json and the dashboard at /dashboard/.")
    _add_common(p, 8765)
    p.set_defaults(func=_run)
    p = subparsers.add_parser("dashboard", help="run the web dashboard (the service plus its "
                                                "page at /dashboard/)")
    _add_common(p, 8765)
    p.set_defaults(func=_run_dashboard)
