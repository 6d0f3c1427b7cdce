"""Blink's square-GEMM rate against public torch.mm measurements on 20 GPUs, roofline beside.

    .venv/bin/python benchmarks/matmul_published.py        (~2 s)

Published (data/published/torch_mm_tflops.csv, its README says more):
github.com/zzc0721/torch-performance-test-data (database.md and ten issues, read 2026-12-06), a
community table of torch.mm TFLOP/s: its test.py times 30 back-to-back torch.mm of two n x n
matrices (n = 1024, 2048, 4096, 8192, 10240) after 6 warm-up calls and reports each dtype's
best n (2 n^3 FLOP per call). Each row is one contributor's machine (cloud containers and
desktops; PyTorch 2.2-2.8), so boards, clocks and cooling vary: rows of one GPU are shown as
their median. Only rows whose GPU is in Blink's hardware table are used (GeForce boards with
their stock 24 / 32 GB; the 48 GB conversions, the 4090D and laptop parts are left out). A
"fp32" figure above the board's FP32 peak ran TF32 (a container that turns it on) and is
dropped. They check GPUs that Blink's training data (NeuSight, DeepBench, the RTX 3090's timm
set) does not have; only the FP32 figures of the shared-datapath boards set a constant
(SIMT_GEMM_RATE_SHARED_DATAPATH, held out one board at a time at the end).

Blink: the same loop costed as Blink costs a long run (blink.cost.unit_features, aten::mm,
no boost window: the board's sustained clock), the best n, as TFLOP/s. Roofline: the dense
peak of the dtype at the boost clock (FP32 on CUDA cores, as torch's default
allow_tf32 = False runs it).
"""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

from blink.cost import tensor_arg, unit_features
from blink.hardware import SIMT_GEMM_RATE_SHARED_DATAPATH, fp32_shares_int_datapath, get_gpu

SIZES = (1024, 2048, 4096, 8192, 10240)
CLOCK_OFF = 0.10
DTYPES = {"fp32": 6, "fp16": 5, "bf16": 15}  # c10::ScalarType codes
DATA = Path(__file__).resolve().parents[1] / "data" / "published" / "torch_mm_tflops.csv"


# The rows SIMT_GEMM_RATE_SHARED_DATAPATH was fitted on; rows from other sources check it.
FIT_SOURCE = "database.md"


def load_published(path: Path = DATA) -> dict[str, list[tuple[str, tuple[float | None, ...]]]]:
    """hardware-table GPU -> [(source, (fp32, fp16, bf16) TFLOP/s) per contributor row]; None:
    not measured (data/published/README.md)."""
    out: dict[str, list[tuple[str, tuple[float | None, ...]]]] = {}
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            out.setdefault(r["gpu"], []).append(
                (r["source"], tuple(float(r[d]) if r[d] else None for d in DTYPES)))
    return out


PUBLISHED = load_published()


def measured(gpu: str, dtype: str, source: str | None = None) -> list[float]:
    """The published rates of a GPU and dtype (FP32 figures above the FP32 peak ran TF32),
    from one source only if `source` is given."""
    i = list(DTYPES).index(dtype)
    vals = [r[i] for src, r in PUBLISHED.get(gpu, [])
            if r[i] is not None and source in (None, src)]
    if dtype == "fp32":
        vals = [v for v in vals if v <= 1.15 * get_gpu(gpu).peak_flops["fp32"] / 1e12]
    return vals


def blink_tflops(gpu: str, dtype: str) -> float:
    """Blink's best rate over SIZES for torch.mm of two square matrices in a long loop."""
    code = DTYPES[dtype]
    best = 0.0
    for n in SIZES:
        a, b, out = (tensor_arg((n, n), code) for _ in range(3))
        f = unit_features("aten::mm", [a, b], [out], gpu, boost_window_s=0.0)
        best = max(best, 2.0 * n**3 / f["analytic_time_s"] / 1e12)
    return best


def peak_tflops(gpu: str, dtype: str) -> float:
    """The dtype's dense peak at the boost clock, 0 where the GPU has none."""
    return (get_gpu(gpu).peak_flops.get(dtype) or 0.0) / 1e12


def in_sample(gpu: str) -> bool:
    """Whether the GPU's table entry carries measured sustained ratios taken from these rows
    (blink/data/gpus.json "sustained"), so its cells check nothing."""
    return "torch-performance-test-data" in get_gpu(gpu).sustained_source


def main() -> int:
    print(__doc__.split("\n\n")[0].strip())
    print()
    print("rates in TFLOP/s; ratio = rate / published rate (above 1: predicted too fast); "
          "* = the GPU's sustained clock ratios were measured from these rows (in-sample)")
    print(f"{'gpu':<17} {'dtype':<5} {'rows':>4} {'published':>9} | {'blink':>7} {'ratio':>6} | "
          f"{'roofline':>8} {'ratio':>6}")
    print("-" * 73)
    errs: dict[str, list[tuple[float, float, bool]]] = {"tensor cores": [],
                                                        "fp32 (CUDA cores)": []}
    for gpu in PUBLISHED:
        for dtype in DTYPES:
            peak = peak_tflops(gpu, dtype)
            vals = measured(gpu, dtype)
            if not vals or not peak:
                continue
            pub = statistics.median(vals)
            ours = blink_tflops(gpu, dtype)
            fitted = in_sample(gpu)
            mark = "*" if fitted else " "
            print(f"{gpu:<16}{mark} {dtype:<5} {len(vals):>4} {pub:>9.1f} | {ours:>7.1f} "
                  f"{ours / pub:>6.2f} | {peak:>8.1f} {peak / pub:>6.2f}")
            key = "fp32 (CUDA cores)" if dtype == "fp32" else "tensor cores"
            # time ~ 1 / rate: |t_pred - t_pub| / t_pub = |pub / pred - 1|
            errs[key].append((abs(pub / ours - 1.0), abs(pub / peak - 1.0), fitted))
    print()
    print("time error |t_pred - t_published| / t_published per GPU x dtype cell")
    print(f"{'':<34} {'cells':>5} | {'blink MAPE':>10} {'median':>7} | {'roofline MAPE':>13} "
          f"{'median':>7}")
    for key, e in errs.items():
        for label, rows in ((key, e), (f"{key}, without *", [x for x in e if not x[2]])):
            b = [x[0] for x in rows]
            r = [x[1] for x in rows]
            print(f"{label:<34} {len(rows):>5} | {100 * statistics.fmean(b):>9.1f}% "
                  f"{100 * statistics.median(b):>6.1f}% | {100 * statistics.fmean(r):>12.1f}% "
                  f"{100 * statistics.median(r):>6.1f}%")
    _simt_rate_logo()
    return 0


def _simt_rate_logo() -> None:
    """The SIMT_GEMM_RATE_SHARED_DATAPATH fit (blink/hardware.py): on each shared-datapath board
    the power rule leaves at its highest clock, the rate that would make Blink's FP32 figure the
    published one. Fitted on FIT_SOURCE's rows: each board held out, the other boards' mean,
    and its error; boards only other sources measured are checks against the fitted boards'
    mean. A board whose tensor-core rate is off by more than CLOCK_OFF as well runs at another
    clock than the table says (no FP32 datapath there): shown, left out of the means."""
    fit: dict[str, float] = {}
    check: dict[str, float] = {}
    clock_off: dict[str, float] = {}
    for gpu in PUBLISHED:
        g = get_gpu(gpu)
        if not fp32_shares_int_datapath(g.compute_capability):
            continue
        if g.sustained_fp32_ratio < g.max_clock_ratio:
            continue  # held below its clock by the power rule: the rate does not set its time
        tc = measured(gpu, "bf16") or measured(gpu, "fp16")
        if not measured(gpu, "fp32") or not tc:
            continue
        per_rate = g.simt_gemm_rate / blink_tflops(gpu, "fp32")
        in_fit = measured(gpu, "fp32", FIT_SOURCE)
        target = fit if in_fit else check
        target[gpu] = per_rate * statistics.median(in_fit or measured(gpu, "fp32"))
        tc_ratio = blink_tflops(gpu, "bf16") / statistics.median(tc)
        if abs(tc_ratio - 1.0) > CLOCK_OFF:
            clock_off[gpu] = tc_ratio
    used = {k: v for k, v in fit.items() if k not in clock_off}
    if len(used) < 2:
        return
    print()
    print(f"SIMT_GEMM_RATE_SHARED_DATAPATH = {SIMT_GEMM_RATE_SHARED_DATAPATH:g}: the rate each "
          f"board implies; fitted on {FIT_SOURCE}, each held out (the others' mean)")
    print(f"{'gpu':<16} {'implied':>7} {'held out':>8} {'error':>7}")
    for gpu, r in {**fit, **check}.items():
        if gpu in clock_off:
            print(f"{gpu:<16} {r:>7.3f}  left out: Blink's bf16 rate is {clock_off[gpu]:.2f}x the "
                  "published (its clock is off)")
            continue
        others = statistics.fmean(v for k, v in used.items() if k != gpu)
        what = "" if gpu in fit else "  (check: not in the fit)"
        print(f"{gpu:<16} {r:>7.3f} {others:>8.3f} {100 * (others / r - 1):>+6.1f}%{what}")
    print(f"{'mean of the fit':<16} {statistics.fmean(used.values()):>7.3f}")

if __name__ == "__main__":
    raise SystemExit(main())
