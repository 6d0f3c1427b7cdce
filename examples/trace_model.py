"""Trace a model on meta tensors: every ATen op with its shapes, module path and phase.

    python examples/trace_model.py [--out trace.json]
"""
from __future__ import annotations

import argparse

import torch

import blink


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="also write the trace as JSON")
    a = ap.parse_args()

    # a zoo model by name, one training step (forward, loss, backward, AdamW step)
    t = blink.trace_model("torchvision:resnet18", batch_size=8, mode="train", dtype="bf16")
    print(t.summary())

    # your own module: blink traces a meta copy, the original is never touched
    net = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                              torch.nn.Linear(2048, 512))
    with blink.trace(net, gpu="H200") as t2:
        net_meta = net.to("meta")
        net_meta(torch.empty(64, 512, device="meta")).sum().backward()
    print(t2.summary())
    if a.out:
        t.to_json(a.out)
        print(f"wrote {a.out}; read it back with blink.Trace.from_json({a.out!r})")


if __name__ == "__main__":
    main()
