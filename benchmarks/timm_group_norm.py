"""Group norm under AMP: what the public RTX 3090 rows say about the fp32 group norm and the
casts that CUDA autocast puts around it.

    .venv/bin/python benchmarks/timm_group_norm.py          (~3 minutes on 2 cores)

Data: the public timm RTX 3090 AMP NCHW inference times (shared/data/public/timm-rtx3090, as
blink's timm cache in data/derived holds them), torch 2.4. `group_norm` is on CUDA autocast's
fp32 list (aten/src/ATen/autocast_mode.h), so under AMP every group norm after an fp16
convolution reads a float32 copy of its input, writes float32, its activation runs in float32
and the next convolution casts back to fp16: blink's trace holds exactly that program, and
charges those kernels their bytes.

Per model with an nn.GroupNorm: measured / analytic, the share of the analytic time in group
norms and in dtype-casting copies, and measured / (analytic less both). Beside them, the
median measured / analytic of every row without a group norm.

The first finding: the rows ran in about the time their program would take without the fp32
group norms and casts (resnetv2_50d_gn at batch 1024: 372 ms measured, while its casts,
float32 group norms and float32 ReLUs alone move ~285 GB, 0.30 s at the full 936 GB/s). The
cause: the 2024 inference files were measured with timm's fast norm (benchmark.py
--fast-norm), whose GroupNormAct / LayerNorm layers run in the autocast dtype. The timm cache
now traces the inference rows that way (blink/train/timm_cache.py _Source.fast_norm, with the
evidence), so this table shows what is left once the program matches: the group norms run in
fp16 and there are no casts around them. The training file (torch 1.12) was measured without
it. The GPU preset (`builtin:gnnet` under amp-fp16, benchmarks/collect_gpu.sh) measures the
default fp32 path's kernels one by one.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from blink.trace import TensorMeta  # noqa: E402
from blink.train import timm_cache as tc  # noqa: E402

warnings.filterwarnings("ignore")


def _has_group_norm(name: str) -> bool:
    import timm

    with torch.device("meta"):
        m = timm.create_model(name, pretrained=False)
    return any(isinstance(x, torch.nn.GroupNorm) for x in m.modules())


def _split(name: str, batch: int, img: int) -> tuple[float, float, float]:
    """(analytic ms, group-norm ms, dtype-cast copy ms) of one benchmark row."""
    t, _ = tc.build_model(name, batch, img, None, "inference")
    p = tc.predict_benchmark_trace(t)
    ops = {o.id: o for o in t.ops}
    gn = cast = 0.0
    for u in p.units:
        o = ops.get(u.op_id)
        if o is None:
            continue
        if "group_norm" in u.op:
            gn += u.time_ms
        elif u.kind == "copy":
            ins = [x for x in o.inputs if isinstance(x, TensorMeta)]
            outs = [x for x in o.outputs if isinstance(x, TensorMeta)]
            src = ins[1] if len(ins) >= 2 else (ins[0] if ins else None)
            dst = ins[0] if len(ins) >= 2 else (outs[0] if outs else None)
            if src is not None and dst is not None and src.dtype != dst.dtype:
                cast += u.time_ms
    return p.time_ms, gn, cast


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rows = tc.load_cache(mode="inference")
    names = sorted({r["model"] for r in rows})
    gn_models = {n for n in names if _has_group_norm(n)}
    others = [r["measured_ms"] / r["time_ms"] for r in rows if r["model"] not in gn_models]
    print("RTX 3090, AMP fp16 NCHW inference (torch 2.4), batch as benchmarked; analytic times")
    hdr = (f"{'model':30s} {'img':>4s} {'batch':>5s} {'meas ms':>8s} {'analytic':>8s} "
           f"{'meas/ana':>8s} {'gn':>5s} {'casts':>5s} {'meas/(ana-gn-casts)':>19s}")
    print(hdr)
    print("-" * len(hdr))
    with_, without = [], []
    for r in sorted((r for r in rows if r["model"] in gn_models),
                    key=lambda r: (r["model"], r["img_size"])):
        ana, gn, cast = _split(r["model"], int(r["batch"]), int(r["img_size"]))
        meas = float(r["measured_ms"])
        with_.append(meas / ana)
        without.append(meas / (ana - gn - cast))
        print(f"{r['model']:30s} {int(r['img_size']):4d} {int(r['batch']):5d} {meas:8.1f} "
              f"{ana:8.1f} {meas / ana:8.2f} {gn / ana:5.2f} {cast / ana:5.2f} {without[-1]:19.2f}")
    print()
    print(f"median measured / analytic: rows without group norm {statistics.median(others):.2f} "
          f"(n={len(others)}); rows with it {statistics.median(with_):.2f} (n={len(with_)}), "
          f"{statistics.median(without):.2f} with their group norms and casts taken out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
