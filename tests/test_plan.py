"""Batch planning (blink.plan) and the allocator's release-and-retry in the trace replay.

Every expectation is checked against an independent blink.predict call or derived in the test
from the caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp), never read back from
the planner's own output.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import blink
from blink.cli import main
from blink.errors import ConfigError, UnknownGPUError
from blink.plan import TimeLimitError, parse_bytes
from blink.predict import CUDA_CONTEXT_BYTES

MiB = 1 << 20
GiB = 1 << 30


def _usable(budget: int, margin: float = 0.05) -> int:
    return int(budget * (1 - margin))


# ---- max_batch_size -------------------------------------------------------------------------

def test_max_batch_fits_and_its_successor_does_not():
    budget = 2 * GiB
    r = blink.max_batch_size("torchvision:resnet18", gpu="A100-40GB", memory_budget="2GiB")
    b = r.batch_size
    assert b > 1
    assert r.budget_bytes == budget and r.usable_bytes == _usable(budget)
    # independent predictions at b and b + 1 against the same budget less the margin
    at = blink.predict("torchvision:resnet18", batch_size=b, gpu="A100-40GB",
                       memory_budget=_usable(budget))
    after = blink.predict("torchvision:resnet18", batch_size=b + 1, gpu="A100-40GB",
                          memory_budget=_usable(budget))
    assert at.fits and not after.fits
    assert at.peak_reserved_bytes + at.context_bytes <= _usable(budget)
    assert after.peak_reserved_bytes + after.context_bytes > _usable(budget)
    assert after.oom is not None and after.oom["request_bytes"] > 0
    assert r.peak_reserved_bytes == at.peak_reserved_bytes
    # by search: doubling to the first failure, then bisection; never more probes than that
    probed = [p.batch_size for p in r.probes]
    first_fail = next(p.batch_size for p in r.probes if not p.fits)
    assert first_fail & (first_fail - 1) == 0  # a power of two
    assert probed[: int(math.log2(first_fail)) + 1] == [2**i for i in
                                                        range(int(math.log2(first_fail)) + 1)]
    assert len(probed) <= 2 * int(math.log2(first_fail)) + 1
    assert b + 1 in probed and b in probed
    assert "largest batch" in r.table()


def test_max_batch_train_step_of_a_text_model():
    r = blink.max_batch_size("hf:bert-base", gpu="A100-40GB", memory_budget=6 * GiB,
                             mode="train", seq_len=128)
    assert r.batch_size >= 1 and r.mode == "train" and r.seq_len == 128
    nxt = blink.predict("hf:bert-base", batch_size=r.batch_size + 1, seq_len=128, mode="train",
                        gpu="A100-40GB", memory_budget=_usable(6 * GiB))
    assert not nxt.fits
    # a larger margin can only lower the answer
    r2 = blink.max_batch_size("hf:bert-base", gpu="A100-40GB", memory_budget=6 * GiB,
                              mode="train", seq_len=128, safety_margin=0.3)
    assert r2.batch_size < r.batch_size


def test_max_batch_of_your_own_module_with_an_input_shape_and_the_search_limit():
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    r = blink.max_batch_size(net, gpu="H200", input_shape=(1, 256), max_batch=64)
    assert r.batch_size == 64  # a tiny MLP fits any batch up to the limit
    assert [p.batch_size for p in r.probes] == [1, 2, 4, 8, 16, 32, 64]
    assert any("max_batch=64" in n for n in r.notes)
    # a limit that is not a power of two is probed itself
    r = blink.max_batch_size(net, gpu="H200", input_shape=(1, 256), max_batch=48)
    assert r.batch_size == 48 and r.probes[-1].batch_size == 48


def test_when_batch_1_does_not_fit_the_answer_is_0_and_says_why():
    # llama-7b's bf16 weights are ~12.6 GiB: an 8 GiB budget fails while placing them
    r = blink.max_batch_size("hf:llama-7b", gpu="H100-SXM", memory_budget="8GiB", dtype="bf16",
                             seq_len=16)
    assert r.batch_size == 0 and not r.fits and len(r.probes) == 1
    assert r.probes[0].oom["op"] is None  # failed before any op: the resident weights
    assert "placing the weights" in r.notes[0]
    assert "no batch fits" in r.table()


def test_plan_argument_errors_are_clear():
    with pytest.raises(ConfigError, match="input_shape"):
        blink.max_batch_size(torch.nn.Linear(4, 4), inputs=torch.zeros(2, 4))
    with pytest.raises(ConfigError, match="CUDA context"):
        blink.max_batch_size("torchvision:resnet18", memory_budget="256MiB")
    with pytest.raises(ConfigError, match="safety_margin"):
        blink.max_batch_size("torchvision:resnet18", safety_margin=1.5)
    with pytest.raises(ConfigError, match="max_batch"):
        blink.max_batch_size("torchvision:resnet18", max_batch=0)
    with pytest.raises(UnknownGPUError):
        blink.max_batch_size("torchvision:resnet18", gpu="H9000")
    with pytest.raises(ConfigError, match="batch_size"):
        blink.max_batch_size("torchvision:resnet18", batch_size=4)
    with pytest.raises(ConfigError, match="memory size"):
        blink.max_batch_size("torchvision:resnet18", memory_budget="lots")
    with pytest.raises(ConfigError, match="at most 64"):
        blink.optimize_batch("torchvision:resnet18", batch_sizes=list(range(1, 100)))
    with pytest.raises(TimeLimitError, match="time limit"):
        blink.max_batch_size("torchvision:resnet18", time_limit_s=1e-9)


def test_parse_bytes():
    assert parse_bytes("40GiB") == 40 * GiB
    assert parse_bytes("40G") == 40 * GiB
    assert parse_bytes("40 GB") == 40 * 10**9
    assert parse_bytes("1.5e9") == 1_500_000_000
    assert parse_bytes("512MiB") == 512 * MiB
    assert parse_bytes(123) == 123
    for bad in ["", "GiB", "-4GiB", "1e400", "4 parsecs", "nan"]:
        with pytest.raises(ConfigError):
            parse_bytes(bad)


# ---- optimize_batch and compare --------------------------------------------------------------

def test_optimize_batch_default_grid_and_best():
    s = blink.optimize_batch("torchvision:resnet18", gpu="A100-40GB", memory_budget="2GiB")
    sizes = [r.batch_size for r in s.rows]
    assert sizes == sorted(sizes)
    assert s.max_batch_size in sizes and s.max_batch_size + 1 in sizes
    assert all(r.fits == (r.batch_size <= s.max_batch_size) for r in s.rows)
    fitting = [r for r in s.rows if r.fits]
    assert s.best is not None and s.best.fits
    assert s.best.throughput == max(r.throughput for r in fitting)
    for r in s.rows:
        assert r.throughput == pytest.approx(r.batch_size * 1e3 / r.time_ms)
    assert "<- best" in s.table()
    d = json.loads(json.dumps(s.to_dict()))
    assert d["best"]["batch_size"] == s.best.batch_size


def test_optimize_batch_explicit_sizes_match_predict():
    # host_time="table": measured host time differs from trace to trace
    s = blink.optimize_batch("torchvision:resnet18", gpu="H200", batch_sizes=[16, 1, 4, 4],
                             host_time="table")
    assert [r.batch_size for r in s.rows] == [1, 4, 16]
    for r in s.rows:
        p = blink.predict("torchvision:resnet18", batch_size=r.batch_size, gpu="H200",
                          host_time="table")
        assert r.time_ms == pytest.approx(p.time_ms)
        assert r.peak_reserved_bytes == p.peak_reserved_bytes and r.fits
    assert s.max_batch_size is None


def test_compare_models_gpus_dtypes():
    c = blink.compare(["torchvision:resnet18", "torchvision:mobilenet_v2"], ["H200", "A100-40GB"],
                      ["fp32", "bf16"], batch_size=8, host_time="table")
    assert len(c.rows) == 8
    times = [r.time_ms for r in c.rows]
    assert times == sorted(times)
    assert c.rows[0].relative == pytest.approx(1.0)
    for r in c.rows:
        p = blink.predict(r.model, batch_size=8, gpu=r.gpu, dtype=r.dtype, host_time="table")
        assert r.time_ms == pytest.approx(p.time_ms)
        assert r.relative == pytest.approx(p.time_ms / times[0])
        assert r.throughput == pytest.approx(8e3 / p.time_ms)
    with pytest.raises(UnknownGPUError):
        blink.compare(["torchvision:resnet18"], ["H200", "nope"])
    # one seq_len for a mixed comparison: the text model takes it, the vision model ignores it
    mixed = blink.compare(["torchvision:resnet18", "hf:gpt2"], "H200", batch_size=2, seq_len=64,
                          host_time="table")
    seqs = {r.model: r.seq_len for r in mixed.rows}
    assert seqs == {"torchvision:resnet18": None, "hf:gpt2": 64}
    gpt2 = blink.predict("hf:gpt2", batch_size=2, seq_len=64, gpu="H200", host_time="table")
    assert next(r for r in mixed.rows if r.model == "hf:gpt2").time_ms == pytest.approx(
        gpt2.time_ms)
    with pytest.raises(ConfigError, match="at most"):
        blink.compare(["torchvision:resnet18"] * 65, ["H200"])


def test_cli_optimize_batch_table_json_and_plot(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    assert main(["optimize-batch", "torchvision:resnet18", "--gpu", "A100-40GB", "--budget",
                 "2GiB", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "largest batch that fits" in out and "<- best" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "sweep.svg"
    assert main(["optimize-batch", "torchvision:resnet18", "--batch-sizes", "1,2",
                 "--json", "-", "--plot", str(svg)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["batch_size"] for r in d["rows"]] == [1, 2]
    assert b"<svg" in svg.read_bytes()[:500]
    assert main(["optimize-batch", "torchvision:resnet18", "--budget", "lots"]) == 2
    assert "memory size" in capsys.readouterr().err


def test_cli_compare(capsys):
    assert main(["compare", "torchvision:resnet18", "--gpu", "H200", "--gpu", "A100-40GB",
                 "-b", "4"]) == 0
    out = capsys.readouterr().out
    assert "H200" in out and "A100-40GB" in out and "1.00x" in out
    # several GPUs / dtypes after one flag, as words or comma-separated: every combination
    assert main(["compare", "torchvision:resnet18", "--gpu", "H200", "A100-40GB",
                 "--dtype", "bf16,fp32", "-b", "4", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sorted((r["gpu"], r["dtype"]) for r in rows) == [
        ("A100-40GB", "bf16"), ("A100-40GB", "fp32"), ("H200", "bf16"), ("H200", "fp32")]


# ---- the allocator near the limit: release cached segments, retry, then OOM -----------------

def _fragmenting_trace() -> blink.Trace:
    """12 MiB a, 12 MiB b, free a, 20 MiB c: the freed 12 MiB segment cannot hold c."""
    with blink.trace() as t:
        a = torch.empty(12 * MiB, dtype=torch.uint8, device="meta")
        b = torch.empty(12 * MiB, dtype=torch.uint8, device="meta")
        del a
        c = torch.empty(20 * MiB, dtype=torch.uint8, device="meta")
        del b, c
    return t


def test_replay_releases_cached_segments_and_retries_before_oom():
    n = _fragmenting_trace().native()
    # Unlimited: segments of 12 + 12 + 20 MiB (sizes >= 10 MiB round to 2 MiB, nothing splits).
    free = n.memory()
    assert free["peak_reserved_bytes"] == 44 * MiB and free["num_alloc_retries"] == 0
    # Capacity 40 MiB: c's cudaMalloc (24 + 20 > 40) fails; release_cached_blocks() frees the
    # idle 12 MiB segment and the retry fits (12 + 20 <= 40): no OOM, peak 32 MiB.
    capped = n.memory(capacity_bytes=40 * MiB)
    assert not capped["oom"] and capped["num_ooms"] == 0
    assert capped["num_alloc_retries"] == 1
    assert capped["peak_reserved_bytes"] == 32 * MiB
    # Capacity 31 MiB: after the release 12 + 20 > 31 still: OOM at c's allocation, and the
    # replay stops there as the real run would (c's free and b's free never replay).
    oom = n.memory(capacity_bytes=31 * MiB)
    assert oom["oom"] and oom["num_ooms"] == 1 and oom["num_alloc_retries"] == 1
    assert oom["oom_request_bytes"] == 20 * MiB
    assert oom["oom_label"][0] == "aten::empty.memory_format"
    assert oom["events"] == free["events"] - 2
    assert oom["reserved_bytes"] == 12 * MiB  # b's segment; a's was released


def test_predict_fits_where_only_the_retry_makes_room():
    t = _fragmenting_trace()
    # a budget of 40 MiB beside the context: the unlimited peak (44 MiB) would not fit, but
    # the real allocator's retry makes it fit at 32 MiB
    p = blink.predict_trace(t, "H200", memory_budget=40 * MiB + CUDA_CONTEXT_BYTES)
    assert p.fits and p.oom is None and p.alloc_retries == 1
    assert p.peak_reserved_bytes == 32 * MiB
    q = blink.predict_trace(t, "H200", memory_budget=31 * MiB + CUDA_CONTEXT_BYTES)
    assert not q.fits and q.oom["request_bytes"] == 20 * MiB
    assert q.oom["reserved_bytes"] == 12 * MiB and q.alloc_retries == 1
    assert q.peak_reserved_bytes == 44 * MiB  # what the run would have needed
    assert "DOES NOT FIT: out of memory at aten::empty.memory_format" in q.table()
    with pytest.raises(ConfigError, match="memory_budget"):
        blink.predict_trace(t, "H200", memory_budget=CUDA_CONTEXT_BYTES)


def test_resident_weights_that_do_not_fit_are_an_oom_before_any_op():
    t = blink.trace_model("hf:llama-7b", batch_size=1, seq_len=16, dtype="bf16")
    n = t.native()
    full = n.memory()
    r = n.memory(capacity_bytes=full["resident_bytes"] // 2)
    assert r["oom"] and r["oom_resident"] and r["oom_op"] == -1 and r["oom_label"] is None
    assert r["events"] == 0
    with pytest.raises(blink.BlinkError, match="capacity_bytes"):
        n.memory(capacity_bytes=-1)


@pytest.mark.parametrize("expandable", [False, True], ids=["classic", "expandable"])
def test_trace_replay_with_a_capacity_matches_the_reference_allocator(expandable):
    """Random alloc/free streams as raw traces: the C++ replay against a capacity must stop at
    the same first OOM, with the same statistics, as the pure-Python reference allocator
    (tests/alloc_reference.py) run on the same stream until its first failed malloc."""
    import random

    from alloc_reference import STAT_KEYS, ReferenceAllocator

    from blink import _C

    rng = random.Random(11)
    sizes = [1, 512, 4096, 300 * 1024, MiB, MiB + 512, 3 * MiB, 9 * MiB, 12 * MiB, 25 * MiB]
    ooms = 0
    for case in range(150):
        live: list[int] = []
        allocs = []
        for sid in range(1, 61):  # storage ids > 0, as the trace reader requires
            if live and rng.random() < 0.4:
                allocs.append((live.pop(rng.randrange(len(live))), 0, -1, True, 0))
            allocs.append((sid, rng.choice(sizes) + rng.randrange(0, 2048), -1, False, 0))
            live.append(sid)
        capacity = rng.choice([24, 40, 64, 100, 160]) * MiB
        raw = {"names": [], "modules": [], "ops": [], "allocs": allocs, "externals": []}
        got = _C.trace_from_python(raw).memory(expandable_segments=expandable,
                                                capacity_bytes=capacity)
        ref = ReferenceAllocator(expandable_segments=expandable, capacity_bytes=capacity)
        events, failed_size = 0, 0
        for storage, nbytes, _op, is_free, _t in allocs:
            events += 1
            if is_free:
                ref.free(storage)
            elif not ref.malloc(storage, nbytes):
                failed_size = nbytes
                break
        want = ref.stats()
        assert {k: got[k] for k in STAT_KEYS} == want, (case, capacity)
        assert got["events"] == events and got["oom"] == bool(failed_size)
        assert got["oom_request_bytes"] == failed_size
        ooms += bool(failed_size)
    assert 20 < ooms < 150  # the capacities make both outcomes common
