"""Predict time and memory, then plan: the largest batch that fits a budget, the batch with the
best throughput, and a model x GPU x dtype comparison.

    python examples/predict_and_plan.py [--plot sweep.png]
"""
from __future__ import annotations

import argparse

import blink


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", default=None, help="write the batch sweep plot (.png or .svg)")
    a = ap.parse_args()

    p = blink.predict("torchvision:resnet18", batch_size=32, gpu="A100-40GB", mode="train")
    print(p.table(max_rows=8))

    # largest batch whose predicted peak reserved memory + CUDA context fits 8 GiB less 5 %
    r = blink.max_batch_size("torchvision:resnet18", gpu="A100-40GB", memory_budget="8GiB",
                             mode="train")
    print(r)

    # throughput against batch size, the best batch within the same budget
    s = blink.optimize_batch("torchvision:resnet18", gpu="A100-40GB", memory_budget="8GiB",
                             mode="train")
    print(s)
    if a.plot:
        print("plot:", s.plot(a.plot))

    c = blink.compare(["torchvision:resnet18", "torchvision:mobilenet_v2"], ["H200", "T4"],
                      ["fp32", "bf16"], batch_size=32)
    print(c)


if __name__ == "__main__":
    main()
