"""kSerialLoopIterationS (csrc/include/blink/roofline.h) against the only public rows that run
PyTorch's looping NCHW bilinear-upsampling kernel.

    .venv/bin/python benchmarks/upsample_loop.py

Data: the public timm RTX 3090 AMP inference times (shared/data/public/timm-rtx3090, both
layouts, as blink's timm caches in data/derived hold them) of the models whose traces hold an
aten::upsample_bilinear2d on the looping path: EfficientFormerV2 (its stride-2 attention
upsamples 7x7 -> 14x14 over 1024 channels). These rows motivated the rule, so this is a
consistency check, not a held-out result.

Per row: the measured time, blink's analytic time without the loop bound (the upsampling
costed as streaming its bytes, as before the rule) and with it, and the time per loop step the
measurement implies: (measured - everything but the loops) / (steps per thread x waves). In the
NHWC run the upsampling input is still NCHW (the attention output is reshaped from a transposed
tensor, then added to the NHWC local branch: TensorIterator keeps the first operand's layout),
so that run loops too.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from blink import _C, hardware  # noqa: E402
from blink.cost import trace_features  # noqa: E402
from blink.train import timm_cache as tc  # noqa: E402

warnings.filterwarnings("ignore", message="Mapping deprecated model name")
OP = "aten::upsample_bilinear2d"
FAMILY = "efficientformerv2"


def _measured(mode: str) -> dict[str, tuple[int, int, float]]:
    """model -> (img, batch, measured ms) of FAMILY in `mode`'s timm cache."""
    return {r["model"]: (int(r["img_size"]), int(r["batch"]), float(r["measured_ms"]))
            for r in tc.load_cache(mode=mode) if r["model"].startswith(FAMILY)}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    gpu = hardware.get_gpu(tc.GPU)
    # the rule-free, streaming cost of the upsampling bytes
    stream_bw = gpu.memory_bandwidth_bytes_per_s * gpu.dram_efficiency
    step = float(_C.kSerialLoopIterationS)
    print(f"kSerialLoopIterationS = {step * 1e9:.0f} ns; RTX 3090 AMP inference, batch as "
          "benchmarked")
    hdr = (f"{'model':24s} {'layout':6s} {'meas ms':>8s} {'no loop':>8s} {'ratio':>6s} "
           f"{'loop':>8s} {'ratio':>6s} {'loops':>5s} {'implied ns/step':>15s}")
    print(hdr)
    print("-" * len(hdr))
    for mode, lay in (("inference", "NCHW"), ("inference-nhwc", "NHWC")):
        for name, (img, batch, meas) in sorted(_measured(mode).items()):
            t, _ = tc.build_model(name, batch, img, None, mode)
            rows = trace_features(t, tc.GPU, allow_tf32_matmul=True, allow_tf32_cudnn=True,
                                  cudnn_benchmark=True)
            total = sum(r["analytic_time_s"] for r in rows)
            ups = [r for r in rows if r["op"] == OP]
            loop_s = sum(r["analytic_time_s"] for r in ups)
            streamed = sum((r["bytes_read"] + r["bytes_written"]) / stream_bw for r in ups)
            rest = total - loop_s
            # a thread's loop: N x C steps (output elements / threads), in waves of threads
            steps = sum(r["numel"] / r["parallelism"] * r["waves"] for r in ups)
            implied = (meas / 1e3 - rest) / steps * 1e9 if steps else float("nan")
            before = (rest + streamed) * 1e3
            print(f"{name:24s} {lay:6s} {meas:8.1f} {before:8.1f} {before / meas:6.2f} "
                  f"{total * 1e3:8.1f} {total * 1e3 / meas:6.2f} {len(ups):5d} {implied:15.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
