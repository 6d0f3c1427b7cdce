"""`blink collect`: measure a preset on this machine into a dataset directory.

    blink collect --preset smoke --out out/smoke --device cpu
    blink collect --preset h200 --out out/h200 --time-budget 420      # on a GPU; resumable
    blink collect --validate out/h200                                 # check a dataset
"""
from __future__ import annotations

import argparse
import sys
from typing import Any


def add_collect_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `collect` on the `blink` command line (subparsers of blink.cli)."""
    from .presets import preset_names

    p = subparsers.add_parser(
        "collect", help="measure ground truth (times, peaks, per-unit kernels) into a dataset",
        description="Run a preset's configurations for real and write a dataset directory as "
                    "it goes. Re-running with the same --out resumes it without repeating "
                    "finished configurations.")
    p.add_argument("--preset", choices=preset_names(), help="what to collect")
    p.add_argument("--out", metavar="DIR", help="dataset directory (created, or resumed)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: GPU with the CUPTI tracer (default); cpu: the same pipeline "
                        "with CPU timings")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop starting new configurations when this much time is spent")
    p.add_argument("--gpu", default=None,
                   help="hardware-table GPU the unit features are computed for (default: the "
                        "GPU in use; H200 with --device cpu)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="run at most N configurations in this session")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--list", action="store_true", help="list the preset's configurations")
    p.add_argument("--validate", metavar="DIR", default=None,
                   help="check a dataset directory (schema, checksums, keys) and summarize it")
    p.set_defaults(func=run_collect)
    return p


def run_collect(a: argparse.Namespace) -> int:
    from ..errors import ConfigError

    if a.validate:
        from .dataset import load_dataset, summary

        print(summary(load_dataset(a.validate, allow_partial=True)))
        return 0
    if not a.preset:
        raise ConfigError("give --preset (smoke, h200 or full), or --validate DIR")
    if a.list:
        from .presets import get_preset, iter_available, run_id

        for cfg, why in iter_available(get_preset(a.preset)):
            print(f"{run_id(cfg)}  {cfg.describe()}{f'  (skipped: {why})' if why else ''}")
        return 0
    if not a.out:
        raise ConfigError("give --out DIR: the dataset directory to write (or resume)")
    if a.limit is not None and a.limit <= 0:
        raise ConfigError(f"--limit must be positive, got {a.limit}")
    from .runner import collect

    res = collect(a.preset, a.out, device=a.device, time_budget=a.time_budget, gpu=a.gpu,
                  limit=a.limit, progress=None if a.quiet else sys.stderr)
    failed = ", ".join(f"{n} {s}" for s, n in sorted(res.failed.items()))
    print(f"blink collect: {res.status}: {res.ran} configurations measured"
          f"{f' ({failed})' if failed else ''}, {res.resumed} already done"
          f"{f'; {res.reason}' if res.reason else ''}. Dataset: {res.path}")
    return 130 if res.reason == "interrupted" else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m blink.collect ...` (the same as `blink collect ...`)."""
    from ..errors import BlinkError

    parser = argparse.ArgumentParser(prog="blink")
    sub = parser.add_subparsers(dest="command", required=True)
    add_collect_parser(sub)
    args = parser.parse_args(["collect", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except BlinkError as exc:
        print(f"blink: error: {exc}", file=sys.stderr)
        return 2
