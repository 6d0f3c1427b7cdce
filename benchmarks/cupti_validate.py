"""Validate blink's CUPTI tracer against torch.profiler on a few models (needs a CUDA GPU).

    python benchmarks/cupti_validate.py [--out checks.json] [--reps 5] [--quick]

For each model: the same training step (or inference forward) is traced `--reps` times by
torch.profiler (kineto) and `--reps` times by blink._cupti, in separate passes (one CUPTI
subscriber at a time). Units are the outermost ops with a CUDA kernel on both sides, in call
order; each unit's device time is the median over the passes. Checks, per model:

- kernel time summed over units agrees within 2% (TOLERANCE);
- every unit launched the same number of kernels/copies/memsets under both tracers;
- blink attributes every device activity of the step to a unit (none left unattributed);
- and, once: the tracer refuses to start inside torch.profiler, and torch.profiler still sees
  kernels after a blink trace (kineto re-registers its CUPTI callbacks).

Also reported, for the first GPU run to tell what cannot be checked elsewhere: the CUPTI
versions (headers built against, library loaded), launch API records per device activity (1.0
expected; 2.0 would mean the driver call under each runtime launch is counted too), records
CUPTI dropped or left incomplete, and buffers of another CUPTI client handed to blink.

--budget SECONDS: models not started by then are reported as skipped (the checks still run).

Exit status 0 when every check passes, 1 otherwise, 3 without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

# Keep CUPTI attached after each torch.profiler session (see blink/collect/cupti.py): this
# script alternates torch.profiler and blink traces back to back. Set before torch loads.
os.environ.setdefault("TEARDOWN_CUPTI", "0")

import torch  # noqa: E402

TOLERANCE = 0.02
MODELS = [
    ("builtin:mlp", 64, None, "fp32", "train"),
    ("builtin:convnet", 32, None, "fp32", "train"),
    ("builtin:gpt", 8, 256, "bf16", "train"),
    ("torchvision:resnet50", 32, None, "bf16", "train"),
    ("hf:gpt2", 4, 256, "bf16", "train"),
]


def _call(model: str, batch: int, seq: int | None, dtype: str, mode: str) -> tuple[Any, Any]:
    from blink.collect.presets import ModelRun, Protocol
    from blink.collect.protocol import ModelWorkload

    wl = ModelWorkload(ModelRun(model, batch, seq, dtype, mode), Protocol())
    return wl, wl.materialize(torch.device("cuda"), 0)


def _unit_names() -> set[str]:
    from blink.collect.cupti import UNIT_BY_RULE
    from blink.collect.measure import cuda_kernel_ops

    return cuda_kernel_ops() | set(UNIT_BY_RULE)


def profiler_units(call: Any, reps: int) -> list[list[tuple[str, float, int]]]:
    """Per traced call: (op, device seconds, device activities) of each outermost unit op."""
    from torch.profiler import ProfilerActivity, profile, record_function

    names = _unit_names()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for r in range(reps):
            with record_function(f"blink::rep{r}"):
                call()
            torch.cuda.synchronize()
    events = sorted(prof.events(), key=lambda e: (e.time_range.start, -e.time_range.end))
    reps_at = [e.time_range for e in events if e.name.startswith("blink::rep")]
    out: list[list[tuple[str, float, int]]] = [[] for _ in reps_at]

    def count(e: Any) -> int:
        return len(e.kernels) + sum(count(c) for c in e.cpu_children)

    for e in events:
        if e.name not in names or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        p = e.cpu_parent
        while p is not None and p.name not in names:
            p = p.cpu_parent
        if p is not None:
            continue
        rep = next((i for i, tr in enumerate(reps_at) if tr.start <= e.time_range.start <= tr.end),
                   None)
        if rep is None:
            continue  # autograd-thread ops are children of the rep range only by time
        n = count(e)
        if n == 0 and e.device_time_total == 0:
            continue
        out[rep].append((e.name, e.device_time_total * 1e-6, n))
    return out


def cupti_units(call: Any, reps: int) -> tuple[list[list[tuple[str, float, int]]], Any]:
    from blink.collect.cupti import UNIT_BY_RULE, CuptiTrace
    from blink.collect.measure import split_calls

    with CuptiTrace(UNIT_BY_RULE) as tr:
        for _ in range(reps):
            tr.mark()
            call(on_phase=tr.set_phase)
            torch.cuda.synchronize()
    s = tr.summary
    calls = [[(o.name, o.time_s, o.n_kernels + o.memcpy_n + o.memset_n) for o in c
              if o.n_kernels + o.memcpy_n + o.memset_n > 0] for c in split_calls(s)]
    return calls, s


def _tracer_diagnostics(s: Any) -> dict[str, Any]:
    """What only a real GPU shows: launch records per activity, CUPTI's own counters."""
    activities = sum(o.n_kernels + o.memcpy_n + o.memset_n for o in s.ops)
    launches = sum(o.launch_n for o in s.ops)
    return {"blink_kernels": s.n_kernels, "blink_ops_kept": len(s.ops),
            "launch_records_per_activity": round(launches / activities, 3) if activities else None,
            "ops_with_activity_but_no_launch": sum(
                1 for o in s.ops if o.n_kernels + o.memcpy_n + o.memset_n > 0 and o.launch_n == 0),
            "incomplete_records": s.extra.get("incomplete"),
            "foreign_buffers": s.extra.get("foreign_buffers")}


def _median_units(calls: list[list[tuple[str, float, int]]]) -> list[tuple[str, float, int]]:
    lengths = {len(c) for c in calls}
    if len(lengths) != 1:
        return calls[-1]
    return [(col[0][0], statistics.median(t for _, t, _ in col), col[0][2])
            for col in zip(*calls, strict=True)]


def validate_model(model: str, batch: int, seq: int | None, dtype: str, mode: str,
                   reps: int = 5) -> dict[str, Any]:
    wl, call = _call(model, batch, seq, dtype, mode)
    try:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        prof = _median_units(profiler_units(call, reps))
        ours_calls, summary = cupti_units(call, reps)
        ours = _median_units(ours_calls)
    finally:
        wl.release()
        torch.cuda.empty_cache()
    total_p = sum(t for _, t, _ in prof)
    total_o = sum(t for _, t, _ in ours)
    rel = (total_o - total_p) / total_p if total_p else float("inf")
    same_seq = [a[0] for a in prof] == [b[0] for b in ours]
    first_diff = next(([i, a[0], b[0]] for i, (a, b) in enumerate(zip(prof, ours, strict=False))
                       if a[0] != b[0]), None)
    count_mismatch = sum(1 for a, b in zip(prof, ours, strict=False) if a[2] != b[2])
    unit_rel = sorted(abs(b[1] - a[1]) / a[1] for a, b in zip(prof, ours, strict=False)
                      if a[0] == b[0] and a[1] >= 20e-6)
    ok = abs(rel) <= TOLERANCE and same_seq and count_mismatch == 0 \
        and summary.unattributed_n == 0 and summary.dropped == 0
    return {
        "model": model, "batch_size": batch, "seq_len": seq, "dtype": dtype, "mode": mode,
        "reps": reps, "units_profiler": len(prof), "units_blink": len(ours),
        "same_unit_sequence": same_seq, "first_difference": first_diff,
        "kernel_count_mismatches": count_mismatch,
        "device_time_profiler_s": total_p, "device_time_blink_s": total_o, "rel_diff": rel,
        "unit_rel_diff_median": statistics.median(unit_rel) if unit_rel else None,
        "unit_rel_diff_p90": unit_rel[int(0.9 * (len(unit_rel) - 1))] if unit_rel else None,
        "unattributed": summary.unattributed_n, "unattributed_top": summary.unattributed_top,
        "dropped_records": summary.dropped, "ok": ok, **_tracer_diagnostics(summary),
    }


def check_refuses_inside_profiler() -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from blink import _cupti  # type: ignore[attr-defined]
    from blink.collect.cupti import CuptiTrace
    from blink.errors import BlinkError

    msgs = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        for starter in (lambda: CuptiTrace().__enter__(), lambda: _cupti.start()):
            try:
                starter()
                msgs.append(None)
                _cupti.stop()
            except BlinkError as exc:
                msgs.append(str(exc))
    ok = all(m is not None and "torch.profiler" in m for m in msgs)
    return {"check": "refuses inside torch.profiler", "ok": ok, "messages": msgs}


def check_profiler_after_blink() -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from blink.collect.cupti import CuptiTrace

    x = torch.randn(512, 512, device="cuda")
    with CuptiTrace() as tr:
        (x @ x).sum()
    ours = tr.summary.n_kernels
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        (x @ x).sum()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    attached = sum(len(e.kernels) for e in events)  # kernels the profiler tied to an op
    return {"check": "torch.profiler works after a blink trace", "ok": ours > 0 and
            max(len(kernels), attached) > 0, "blink_kernels": ours,
            "profiler_kernels": len(kernels), "profiler_kernels_attached": attached}


def versions() -> dict[str, Any]:
    """The CUPTI this module was built against and the one loaded (one copy expected)."""
    from blink import _cupti  # type: ignore[attr-defined]

    loaded = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            loaded = sorted({line.split()[-1] for line in f if "libcupti" in line})
    except OSError:
        pass
    return {"check": "versions", "ok": len(loaded) <= 1, "build": _cupti.build_info(),
            "cupti_library_api_version": _cupti.library_api_version(),
            "libcupti_loaded": loaded, "torch": torch.__version__, "cuda": torch.version.cuda,
            "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI")}


def run(models: list[tuple], reps: int, budget: float | None = None) -> dict[str, Any]:
    from blink.collect.presets import missing_package

    report: dict[str, Any] = {"tolerance": TOLERANCE, "models": [], "checks": []}
    start = time.perf_counter()
    for spec in models:
        pkg = missing_package(spec[0])
        if pkg:
            report["models"].append({"model": spec[0], "skipped": f"{pkg} not installed"})
            continue
        if budget is not None and time.perf_counter() - start > budget:
            report["models"].append({"model": spec[0], "skipped": f"time budget {budget:g} s"})
            print(json.dumps(report["models"][-1]), flush=True)
            continue
        t0 = time.perf_counter()
        try:
            res = validate_model(*spec, reps=reps)
        except Exception as exc:  # noqa: BLE001 - reported, and fails the run
            res = {"model": spec[0], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        res["seconds"] = round(time.perf_counter() - t0, 1)
        report["models"].append(res)
        print(json.dumps(res), flush=True)
    for check in (versions, check_refuses_inside_profiler, check_profiler_after_blink):
        try:
            res = check()
        except Exception as exc:  # noqa: BLE001
            res = {"check": check.__name__, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report["checks"].append(res)
        print(json.dumps(res), flush=True)
    report["ok"] = all(m.get("ok", True) for m in report["models"]) and all(
        c["ok"] for c in report["checks"])
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="builtin models only")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="start no model after this many seconds")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cupti_validate: no CUDA device; nothing to validate", file=sys.stderr)
        return 3
    models = [m for m in MODELS if not a.quick or m[0].startswith("builtin:")]
    report = run(models, a.reps, a.budget)
    report["gpu"] = torch.cuda.get_device_name()
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"cupti_validate: {'PASS' if report['ok'] else 'FAIL'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
