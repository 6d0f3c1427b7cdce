"""Prediction speed: a plain meta-device run vs. blink's trace + predict of the same run, side by
side. Target: blink.predict <= 1.5x the plain run.

    .venv/bin/python benchmarks/predict_speed.py [--repeats 5]

"trace+cost" is what blink.predict_trace needs from C++ (trace, cut, features, timeline,
allocator replay); "predict" also builds the Python Prediction (unit rows, timeline dicts).
Model build and input creation are not timed (the same prepared model is reused).
"""
from __future__ import annotations

import argparse

import torch
from _common import CASES, median_seconds

from blink.cost import core_gpu_spec
from blink.dryrun import execute, prepare
from blink.hardware import get_gpu
from blink.predict import cublas_workspace_bytes, predict_trace
from blink.trace import cuda_sdpa, trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpu", default="H200")
    a = ap.parse_args()
    torch.manual_seed(0)
    spec = core_gpu_spec(a.gpu)
    ws = cublas_workspace_bytes(get_gpu(a.gpu))
    hdr = (f"{'model':<22} {'mode':<10} {'plain ms':>9} {'trace+cost ms':>14} {'predict ms':>11} "
           f"{'(trace+cost)/plain':>19} {'predict/plain':>14} {'units':>7} {'pred ms':>9}")
    print(f"target GPU {a.gpu}; median of {a.repeats}")
    print(hdr)
    print("-" * len(hdr))
    for name, kw in CASES:
        for mode in ("inference", "train"):
            p = prepare(name, mode=mode, **kw)

            def plain(p=p) -> None:
                with cuda_sdpa(a.gpu):
                    execute(p)

            def trace_cost(p=p) -> None:
                with trace(p.net, gpu=a.gpu, meta=p.meta) as t:
                    execute(p)
                n = t.native()
                n.cost(spec)
                n.memory(workspace_bytes=ws)

            out: dict = {}

            def full(p=p, out=out) -> None:
                with trace(p.net, gpu=a.gpu, meta=p.meta) as t:
                    execute(p)
                out["p"] = predict_trace(t, a.gpu)

            plain()
            tp = median_seconds(plain, a.repeats)
            tc = median_seconds(trace_cost, a.repeats)
            tf = median_seconds(full, a.repeats)
            pred = out["p"]
            print(f"{name:<22} {mode:<10} {tp * 1e3:>9.1f} {tc * 1e3:>14.1f} {tf * 1e3:>11.1f} "
                  f"{tc / tp:>18.2f}x {tf / tp:>13.2f}x {len(pred.units):>7} "
                  f"{pred.time_ms:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
