"""Host time per op as the dry run measures it, beside the table, and a sanity check on timm.

    .venv/bin/python benchmarks/host_time.py [--skip-timm]

Part 1: launch-bound models (batch 1, inference and a training step): issued ops, host time
per op with host_time="measured" (this CPU's time in the caller between ops, CPU-time clock),
"wall" (steady clock) and "table" (constants), and the calibrated tracer overhead subtracted.
The figures describe the CPU that runs this script, and its load.

Part 2 (a sanity check, not a fit): whole-model inference step times of small timm models on
an RTX 3090 (shared/data/public/timm-rtx3090, AMP fp16, NCHW, batch 256-1024, so mostly
GPU-bound): predicted time with measured and with table host time against the measured step.
Host time should stay well below the step at these batches; the GPU side is not this script's
subject.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import sys
import time
from pathlib import Path

import blink
from blink.hosttime import tracer_overhead

LAUNCH_BOUND = [
    ("torchvision:resnet18", {"batch_size": 1}),
    ("torchvision:resnet50", {"batch_size": 1}),
    ("torchvision:mobilenet_v3_large", {"batch_size": 1}),
    ("timm:convnext_tiny", {"batch_size": 1}),
    ("hf:bert-base", {"batch_size": 1, "seq_len": 128}),
    ("torchvision:resnet18", {"batch_size": 1, "mode": "train"}),
    ("hf:bert-base", {"batch_size": 1, "seq_len": 128, "mode": "train"}),
]
TIMM_MODELS = ["mobilenetv3_small_050", "lcnet_050", "resnet18", "efficientnet_b0",
               "convnext_tiny", "resnet50"]
TIMM_FILE = Path("/work/shared/data/public/timm-rtx3090/"
                 "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv.gz")


def part1() -> None:
    cal = tracer_overhead()
    print(f"tracer overhead subtracted per gap: {cal.tracer_gap_overhead_s * 1e6:.2f} us "
          f"(median gap full {cal.full_gap_s * 1e6:.2f} us vs timestamps only "
          f"{cal.timing_gap_s * 1e6:.2f} us); per module hook {cal.module_hook_s * 1e6:.2f} us")
    print(f"{'model':<32} {'mode':<9} {'issues':>6} | {'measured':>9} {'wall':>9} {'table':>9}"
          f" ms | {'us/op meas':>10} {'table':>6}")
    for name, kw in LAUNCH_BOUND:
        res = {m: blink.predict(name, gpu="H100-SXM", host_time=m, **kw)
               for m in ("measured", "wall", "table")}
        n = len(res["table"].timeline)
        print(f"{name:<32} {kw.get('mode', 'inference'):<9} {n:>6} | "
              f"{res['measured'].host_ms:>9.3f} {res['wall'].host_ms:>9.3f} "
              f"{res['table'].host_ms:>9.3f}    | {res['measured'].host_ms * 1e3 / n:>10.1f} "
              f"{res['table'].host_ms * 1e3 / n:>6.1f}")


def part2() -> None:
    import dataclasses

    import timm

    from blink.hardware import get_gpu
    from blink.predict import predict_trace

    gpu = get_gpu("RTX3090")
    at_boost = dataclasses.replace(gpu, sustained_fp32_ratio=1.0, sustained_tc_ratio=1.0)
    rows = {}
    with gzip.open(TIMM_FILE, "rt", newline="") as fh:
        for r in csv.DictReader(fh):
            rows[r["model"]] = r
    print(f"\ntimm on RTX 3090, amp fp16 NCHW; pred / meas in brackets; 'at boost' = sustained "
          f"ratio 1 instead of {gpu.sustained_tc_ratio:.2f}")
    print(f"{'model':<24} {'batch':>5} {'img':>4} {'meas ms':>8} | {'measured host':>15} "
          f"{'host ms':>8} | {'table host':>15} {'host ms':>8} | {'at boost':>15}")
    for name in TIMM_MODELS:
        r = rows.get(name)
        if r is None:
            continue
        net = timm.create_model(name, pretrained=False)
        params = sum(p.numel() for p in net.parameters()) / 1e6
        if abs(params - float(r["param_count"])) > 0.02 * float(r["param_count"]):
            continue  # the installed timm builds another model than was measured
        b, img = int(r["infer_batch_size"]), int(r["infer_img_size"])
        meas = float(r["infer_step_time"])
        t = blink.trace_model(net, input_shape=(b, 3, img, img), dtype="amp-fp16",
                              gpu="RTX3090", warmup=True)
        m = predict_trace(t, gpu, host_time="measured")
        tab = predict_trace(t, gpu, host_time="table")
        boost = predict_trace(t, at_boost, host_time="table")
        print(f"{name:<24} {b:>5} {img:>4} {meas:>8.2f} | {m.time_ms:>8.2f} "
              f"({m.time_ms / meas:.2f}) {m.host_ms:>8.2f} | {tab.time_ms:>8.2f} "
              f"({tab.time_ms / meas:.2f}) {tab.host_ms:>8.2f} | {boost.time_ms:>8.2f} "
              f"({boost.time_ms / meas:.2f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-timm", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    part1()
    if not args.skip_timm and TIMM_FILE.is_file():
        part2()
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
