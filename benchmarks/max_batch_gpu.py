"""Predicted vs real largest batch under a memory budget, on a CUDA GPU (skips elsewhere).

    .venv/bin/python benchmarks/max_batch_gpu.py [--budget 16GiB] [--margin 0.05]

For each case blink.max_batch_size predicts the largest batch that fits the budget less the
margin. The real search then runs the same doubling-then-bisection on the GPU with the caching
allocator capped at the same capacity (torch.cuda.set_per_process_memory_fraction: torch's
malloc fails past allowed_memory_maximum and takes the same release-cached-blocks-and-retry
path the simulator models), a batch "fitting" when two real steps (warm-up, then the steady
state the prediction describes) raise no torch.OutOfMemoryError. The table gives both batches
and their ratio; no GPU data were available when this was written, so it has not been run.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

import blink
from blink.collect.presets import ModelRun, get_preset
from blink.collect.protocol import ModelWorkload
from blink.collect.runner import default_feature_gpu
from blink.plan import _search, parse_bytes
from blink.predict import CUDA_CONTEXT_BYTES

CASES = [
    ModelRun("torchvision:resnet18", 1, None, "fp32", "inference"),
    ModelRun("torchvision:resnet50", 1, None, "bf16", "train"),
    ModelRun("hf:gpt2", 1, 512, "bf16", "train"),
]


def real_fits(case: ModelRun, batch: int, device: torch.device) -> bool:
    run = ModelRun(case.model, batch, case.seq_len, case.dtype, case.mode, case.optimizer)
    w = None
    try:
        w = ModelWorkload(run, get_preset("smoke").protocol)
        call = w.materialize(device, seed=0)
        call()  # creates the optimizer state, as the steady-state prediction assumes
        call()
        torch.cuda.synchronize(device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        if w is not None:
            w.release()
        del w
        gc.collect()
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="16GiB")
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--max-batch", type=int, default=4096)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("max_batch_gpu: needs a CUDA GPU; skipped")
        return
    device = torch.device("cuda", 0)
    gpu = default_feature_gpu(device, sys.stderr)
    total = torch.cuda.get_device_properties(device).total_memory
    budget = parse_bytes(a.budget)
    usable = int(budget * (1 - a.margin))
    capacity = usable - CUDA_CONTEXT_BYTES
    torch.cuda.set_per_process_memory_fraction(capacity / total, device)
    print(f"{gpu}: budget {budget / 2**30:.1f} GiB, allocator capped at "
          f"{capacity / 2**30:.2f} GiB ({capacity / total:.3f} of {total / 2**30:.1f} GiB)")
    print(f"{'model':<22} {'mode':<9} {'dtype':<5} {'seq':>5} {'predicted':>9} {'real':>6} "
          f"{'pred/real':>9} {'probes':>6} {'s':>6}")
    for c in CASES:
        t0 = time.perf_counter()
        p = blink.max_batch_size(c.model, gpu=gpu, memory_budget=budget, mode=c.mode,
                                 dtype=c.dtype, seq_len=c.seq_len, safety_margin=a.margin,
                                 max_batch=a.max_batch)
        probes = [0]

        def fits(b: int, c: ModelRun = c, probes: list[int] = probes) -> bool:
            probes[0] += 1
            return real_fits(c, b, device)

        real, _ = _search(fits, a.max_batch, 40)
        ratio = p.batch_size / real if real else float("nan")
        print(f"{c.model:<22} {c.mode:<9} {c.dtype:<5} {c.seq_len or '':>5} {p.batch_size:>9} "
              f"{real:>6} {ratio:>9.3f} {probes[0]:>6} {time.perf_counter() - t0:>6.0f}",
              flush=True)


if __name__ == "__main__":
    main()
