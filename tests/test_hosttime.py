"""Host time measured during the dry run (issue 9, item 7): timestamps in the trace, the gaps
between ops as the caller's work, and the deterministic table mode beside it.

Times on a shared CPU vary: these tests check structure (a 2 ms sleep shows as >= 2 ms, more
Python work gives more host time), never exact values.
"""
from __future__ import annotations

import json
import time

import pytest
import torch

import blink
from blink.errors import ConfigError
from blink.hosttime import tracer_overhead
from blink.predict import predict_trace


class SleepBetween(torch.nn.Module):
    """Two ops with a 2 ms sleep between them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x)
        time.sleep(0.002)
        return torch.tanh(a)


class WorkBetween(torch.nn.Module):
    """Two ops with 2 ms of Python work (CPU time on this thread) between them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x)
        until = time.thread_time() + 0.002
        n = 0
        while time.thread_time() < until:
            n += 1
        return torch.tanh(a)


def mlp(blocks: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _top(t: blink.Trace, name: str) -> blink.trace.Op:  # type: ignore[name-defined]
    return next(op for op in t.ops if op.parent < 0 and op.name == name)


def test_ops_carry_monotone_timestamps_nested_in_their_parents():
    t = blink.trace_model(mlp(3), input_shape=(4, 32), mode="train", optimizer="sgd")
    assert t.has_timestamps
    starts = [op.t_start_ns for op in t.ops]
    assert all(s >= 0 for s in starts)
    for op in t.ops:
        assert op.t_end_ns >= op.t_start_ns and op.cpu_end_ns >= op.cpu_start_ns >= 0
        if op.parent >= 0:
            parent = t.ops[op.parent]
            assert parent.t_start_ns <= op.t_start_ns <= op.t_end_ns <= parent.t_end_ns
            if parent.thread == op.thread:
                assert parent.cpu_start_ns <= op.cpu_start_ns <= op.cpu_end_ns <= parent.cpu_end_ns
    by_thread: dict[int, list[int]] = {}
    for op in t.ops:
        by_thread.setdefault(op.thread, []).append(op.t_start_ns)
    assert all(v == sorted(v) for v in by_thread.values())  # ids follow start order


def test_python_work_between_two_ops_is_a_host_gap():
    t = blink.trace_model(WorkBetween(), input_shape=(8, 16))
    relu, tanh = _top(t, "aten::relu"), _top(t, "aten::tanh")
    assert tanh.cpu_start_ns - relu.cpu_end_ns >= 2_000_000
    assert tanh.t_start_ns - relu.t_end_ns >= 2_000_000  # wall time is at least CPU time
    measured = predict_trace(t, "H100-SXM", host_time="measured")
    table = predict_trace(t, "H100-SXM", host_time="table")
    assert measured.host_time == "measured" and table.host_time == "table"
    row = next(e for e in measured.timeline if e["op"] == "aten::tanh")
    assert row["caller_s"] >= 2e-3
    assert row["dispatch_s"] > 0
    assert row["host_end_s"] - row["host_start_s"] == pytest.approx(
        row["caller_s"] + row["dispatch_s"])
    assert measured.time_ms >= 2.0
    # the table knows nothing of the Python work
    assert next(e for e in table.timeline if e["op"] == "aten::tanh")["caller_s"] < 1e-4
    assert table.time_ms < 1.0


def test_a_sleep_counts_on_the_wall_clock_only():
    t = blink.trace_model(SleepBetween(), input_shape=(8, 16))
    relu, tanh = _top(t, "aten::relu"), _top(t, "aten::tanh")
    assert tanh.t_start_ns - relu.t_end_ns >= 2_000_000
    wall = predict_trace(t, "H100-SXM", host_time="wall")
    cpu = predict_trace(t, "H100-SXM", host_time="measured")
    assert next(e for e in wall.timeline if e["op"] == "aten::tanh")["caller_s"] >= 2e-3
    # a sleeping thread uses no CPU: the default (CPU time) does not count the sleep
    assert next(e for e in cpu.timeline if e["op"] == "aten::tanh")["caller_s"] < 1e-3
    assert wall.host_time == "wall"


def test_more_python_work_more_host_time():
    small = blink.predict(mlp(2), input_shape=(4, 32), gpu="H100-SXM")
    large = blink.predict(mlp(16), input_shape=(4, 32), gpu="H100-SXM")
    assert large.host_ms > 3 * small.host_ms
    # both launch-bound at batch 4: the host decides the time
    assert large.time_ms >= large.host_ms * 0.99


def test_training_step_counts_backward_and_optimizer_host_work():
    p = blink.predict(mlp(4), input_shape=(4, 32), mode="train", gpu="H100-SXM")
    per_phase: dict[str, float] = {}
    for e in p.timeline:
        per_phase[e["phase"]] = per_phase.get(e["phase"], 0.0) + e["caller_s"]
    assert set(per_phase) == {"forward", "backward", "optimizer"}
    assert all(v > 0 for v in per_phase.values())


def test_table_mode_is_deterministic_and_counts_module_calls():
    a = blink.predict(mlp(4), input_shape=(4, 32), host_time="table")
    b = blink.predict(mlp(4), input_shape=(4, 32), host_time="table")
    assert a.host_ms == b.host_ms and a.time_ms == b.time_ms
    calls = [e["caller_s"] for e in a.timeline]
    python_call = blink._C.host_dispatch_time_s("aten::relu") - blink._C.cuda_dispatch_time_s(
        "aten::relu")
    # every op pays the Python call; the first op of each new module also pays its __call__
    assert min(calls) == pytest.approx(python_call)
    assert sum(1 for c in calls if c > python_call * 1.01) >= 4


def test_saved_trace_keeps_timestamps_and_old_format_still_loads(tmp_path):
    t = blink.trace_model(WorkBetween(), input_shape=(8, 16))
    path = tmp_path / "t.json"
    t.to_json(path)
    loaded = blink.Trace.from_json(path)
    assert loaded.has_timestamps
    assert [op.t_start_ns for op in loaded.ops] == [op.t_start_ns for op in t.ops]
    # re-costing a saved trace is deterministic: the same measured gaps
    assert predict_trace(loaded, "T4").host_ms == predict_trace(loaded, "T4").host_ms

    doc = json.loads(path.read_text())
    doc["format_version"] = 2
    doc["ops"] = [r[:13] for r in doc["ops"]]
    old = tmp_path / "v2.json"
    old.write_text(json.dumps(doc))
    v2 = blink.Trace.from_json(old)
    assert not v2.has_timestamps and all(op.t_start_ns == -1 for op in v2.ops)
    p = predict_trace(v2, "T4", host_time="measured")  # asked for, not available: the table
    assert p.host_time == "table" and any("format 2" in n for n in p.notes)
    # written back, it is a version-3 file with "not recorded" stamps
    again = json.loads(v2.to_json())
    assert again["format_version"] == 3 and all(len(r) == 17 for r in again["ops"])

    doc["ops"][0] = doc["ops"][0][:12]
    old.write_text(json.dumps(doc))
    with pytest.raises(blink.BlinkError, match="op record 0"):
        blink.Trace.from_json(old)


def test_timing_only_trace_records_no_arguments():
    net = mlp(2).to("meta")
    with blink.trace(net, timing_only=True) as t:
        net(torch.empty(4, 32, device="meta"))
    assert t.ops and all(not op.inputs and not op.outputs for op in t.ops)
    assert all(op.t_end_ns >= op.t_start_ns >= 0 for op in t.ops)
    assert all(op.cpu_end_ns >= op.cpu_start_ns >= 0 for op in t.ops)


def test_calibrated_tracer_overhead_is_small_and_non_negative():
    cal = tracer_overhead()
    assert 0 <= cal.tracer_gap_overhead_s < 50e-6
    assert 0 <= cal.module_hook_s < 50e-6
    assert cal.full_gap_s >= cal.timing_gap_s or cal.tracer_gap_overhead_s == 0


def test_bad_host_time_is_rejected():
    with pytest.raises(ConfigError, match="host_time"):
        blink.predict(mlp(1), input_shape=(2, 32), host_time="stopwatch")


def test_blink_autocast_python_mode_is_not_charged_as_host_time():
    from blink.hosttime import autocast_overhead_s

    assert autocast_overhead_s("amp-bf16") > 0  # the emulation's Python is measurable ...
    fp32 = blink.predict(mlp(16), input_shape=(4, 32), host_time="measured")
    amp = blink.predict(mlp(16), input_shape=(4, 32), dtype="amp-bf16", host_time="measured")
    assert len(amp.timeline) > len(fp32.timeline)  # the casts are ops of their own
    # ... and taken out: per op, an amp step costs the host about what an fp32 one does
    per_op = [p.host_ms / len(p.timeline) for p in (fp32, amp)]
    assert per_op[1] < 1.5 * per_op[0]
    assert any("blink.autocast" in n for n in amp.notes)


def test_cli_host_time_flag(tmp_path):
    from blink.cli import main

    out = tmp_path / "p.json"
    assert main(["predict", "torchvision:resnet18", "-b", "1", "--gpu", "T4", "--host-time",
                 "table", "--json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["host_time"] == "table"
    assert all("caller_s" in e and "dispatch_s" in e for e in doc["timeline"])


def test_cost_engine_checks_its_host_options():
    t = blink.trace_model(mlp(1), input_shape=(2, 32))
    native = t.native()
    from blink.cost import core_gpu_spec

    spec = core_gpu_spec("T4")
    with pytest.raises(blink.BlinkError, match="host_time"):
        native.cost(spec, False, True, "bogus")
    with pytest.raises(blink.BlinkError, match="overheads"):
        native.cost(spec, False, True, "measured", -1e-6, 0.0, 0.0)
    # more overhead subtracted, never more host time
    a = native.cost(spec, False, True, "measured", 0.0, 0.0, 0.0)["host_s"]
    b = native.cost(spec, False, True, "measured", 5e-6, 0.0, 0.0)["host_s"]
    assert b <= a
