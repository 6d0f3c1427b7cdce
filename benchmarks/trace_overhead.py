"""Trace overhead: a plain meta-device run vs. the blink trace of the same run vs.
torch's FlopCounterMode over it, side by side. Target: blink <= 1.5x the plain run.

    .venv/bin/python benchmarks/trace_overhead.py [--repeats 5]

Each column is the median wall time of `--repeats` runs of the same prepared model (the model
build and input creation are not timed). "blink" records the trace in C++; "+ops" also builds
the Python Op objects (done lazily, only when a user reads `trace.ops`).
"""
from __future__ import annotations

import argparse

import torch
from _common import CASES, median_seconds
from torch.utils.flop_counter import FlopCounterMode

from blink.dryrun import execute, prepare
from blink.trace import cuda_sdpa, trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    hdr = (f"{'model':<22} {'mode':<10} {'plain ms':>9} {'blink ms':>9} {'+ops ms':>9} "
           f"{'flopctr ms':>10} {'blink/plain':>11} {'+ops/plain':>10} {'flopctr/plain':>13} "
           f"{'ops':>7}")
    print(hdr)
    print("-" * len(hdr))
    for name, kw in CASES:
        for mode in ("inference", "train"):
            p = prepare(name, mode=mode, **kw)

            def plain(p=p) -> None:
                # the same SDPA rerouting the trace applies, so both run the same kernels
                with cuda_sdpa("H200"):
                    execute(p)

            def traced(p=p) -> None:
                with trace(p.net, meta=p.meta):
                    execute(p)

            n_ops = [0]

            def traced_ops(p=p, n_ops=n_ops) -> None:
                with trace(p.net, meta=p.meta) as t:
                    execute(p)
                n_ops[0] = len(t.ops)

            def flopctr(p=p) -> None:
                with cuda_sdpa("H200"), FlopCounterMode(display=False):
                    execute(p)

            plain()  # warm caches (meta kernels, imports) once
            tp = median_seconds(plain, a.repeats)
            tb = median_seconds(traced, a.repeats)
            to = median_seconds(traced_ops, a.repeats)
            tf = median_seconds(flopctr, a.repeats)
            print(f"{name:<22} {mode:<10} {tp * 1e3:>9.1f} {tb * 1e3:>9.1f} {to * 1e3:>9.1f} "
                  f"{tf * 1e3:>10.1f} {tb / tp:>10.2f}x {to / tp:>9.2f}x {tf / tp:>12.2f}x "
                  f"{n_ops[0]:>7}", flush=True)


if __name__ == "__main__":
    main()
