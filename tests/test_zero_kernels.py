"""No kernel costed at zero (issue 9, item 4), shown over PyTorch's OpInfo database.

Every OpInfo op is traced on meta with a few of its own sample inputs (forward, and forward +
backward where it supports autograd) and costed on a real GPU spec. Two claims are checked:

* every sample that traces on meta is costed: no unit fails, every unit has features;
* no op that launches a CUDA kernel gets 0 time. Without a GPU, "launches a kernel" is read off
  the trace: an op that hands back a tensor whose storage was allocated while the op ran, with
  elements in it, wrote those elements, and on CUDA writing takes a kernel. Allocation-only ops
  (empty and friends, resize_) are the one kind that returns fresh storage without writing it.

Rule-level tests below check the sort / selection / scan / factory formulas against the bytes
their CUDA algorithms must move.
"""
from __future__ import annotations

import collections
import math
import warnings
from dataclasses import dataclass, field

import pytest
import torch

from blink import cost
from blink.trace import trace

GPU = "H100"

# Ops that return fresh storage without writing it: the CUDA caching allocator hands out memory
# and no kernel runs.
ALLOC_ONLY = frozenset({
    "aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
    "aten::new_empty_strided", "aten::empty_permuted", "aten::resize_", "aten::resize_as_",
})

# Ops allowed to write fresh storage at zero cost, with the reason.
EXCEPTIONS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu":
        "a CPU-only kernel (no CUDA registration): it never runs on a GPU",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        "a CPU-only kernel (no CUDA registration): it never runs on a GPU",
}

# In-place ops that change only a tensor's metadata (no kernel), and the dropout family, which
# OpInfo samples with training=False or p=0, where it returns its input untouched.
INPLACE_NO_KERNEL = {
    **{name: "changes the view's metadata only" for name in (
        "aten::as_strided_", "aten::squeeze_", "aten::unsqueeze_", "aten::transpose_",
        "aten::t_", "aten::swapdims_", "aten::swapaxes_", "aten::resize_", "aten::resize_as_",
        "aten::set_", "aten::detach_", "aten::requires_grad_")},
    **{name: "a no-op for the training=False / p=0 samples OpInfo includes" for name in (
        "aten::dropout_", "aten::feature_dropout_", "aten::alpha_dropout_",
        "aten::feature_alpha_dropout_")},
}

SAMPLES_PER_OP = 2


@dataclass
class Survey:
    costed: int = 0
    not_traceable: int = 0
    unit_errors: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    zero: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    ops_seen: set[str] = field(default_factory=set)


def _dtype_for(op) -> torch.dtype | None:
    dtypes = op.supported_dtypes("cuda")
    for d in (torch.float32, torch.int64, torch.bool, torch.complex64):
        if d in dtypes:
            return d
    return next(iter(dtypes), None)


def _grad_outputs(out: object) -> list[torch.Tensor]:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]


def _check_sample(survey: Survey, name: str, t) -> None:
    # The C++ costing predict_trace runs (features + analytic time per unit), without the
    # memory simulation and report building it adds.
    units = t.native().cost(cost.core_gpu_spec(GPU), False, True)["units"]
    for u in units:
        if u[10]:  # the unit's error
            survey.unit_errors[u[11][0]].add(f"{name}: {u[10][:160]}")
    ops = t.ops
    user = {o.id for o in t.user_ops()}
    owner: dict[int, int] = {}
    for o in ops:
        if o.id in user:
            owner[o.id] = o.id
        elif o.parent >= 0 and o.parent in owner:
            owner[o.id] = owner[o.parent]
    allocated: dict[int, set[int]] = collections.defaultdict(set)
    for ev in t.allocations:
        if not ev.is_free and ev.op in owner:
            allocated[owner[ev.op]].add(ev.storage)
    gpu_ms: collections.Counter[int] = collections.Counter()
    for u in units:
        if u[0] in owner:
            gpu_ms[owner[u[0]]] += u[2]  # (op id, kind, time_s, ...)
    for oid in user:
        op = ops[oid]
        survey.ops_seen.add(op.name)
        if op.name in ALLOC_ONLY:
            continue
        wrote = [x for x in op.tensors("outputs") if x.storage in allocated[oid] and x.numel > 0]
        if wrote and gpu_ms[oid] <= 0:
            survey.zero[op.name].add(f"{name} ({op.phase})")
        # An in-place op writes into its (first) input, which it hands back.
        if (op.name.endswith("_") and op.name not in INPLACE_NO_KERNEL and gpu_ms[oid] <= 0
                and any(x.numel > 0 for x in op.tensors("outputs"))):
            survey.zero[op.name].add(f"{name} (in-place)")


@pytest.fixture(scope="module")
def survey() -> Survey:
    from torch.testing._internal.common_methods_invocations import op_db

    s = Survey()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            dtype = _dtype_for(op)
            if dtype is None:
                continue
            modes = [False]
            if op.supports_autograd and (dtype.is_floating_point or dtype.is_complex):
                modes.append(True)
            for backward in modes:
                try:
                    samples = list(op.sample_inputs("meta", dtype, requires_grad=backward))
                except Exception:  # noqa: BLE001 - an OpInfo that cannot make meta samples
                    continue
                for sample in samples[:1 if backward else SAMPLES_PER_OP]:
                    try:
                        with trace(None, gpu=GPU) as t:
                            out = op(sample.input, *sample.args, **sample.kwargs)
                            if backward:
                                outs = _grad_outputs(out)
                                if not outs:
                                    continue
                                sum(o.float().abs().sum() for o in outs).backward()
                    except Exception:  # noqa: BLE001 - not traceable on meta: out of scope
                        s.not_traceable += 1
                        continue
                    _check_sample(s, op.name, t)
                    s.costed += 1
            inplace = op.inplace_variant
            if inplace is None:
                continue
            try:
                samples = list(op.sample_inputs("meta", dtype, requires_grad=False))
            except Exception:  # noqa: BLE001
                continue
            for sample in samples[:1]:
                try:
                    x = sample.input.clone() if isinstance(sample.input, torch.Tensor) \
                        else sample.input
                    with trace(None, gpu=GPU) as t:
                        inplace(x, *sample.args, **sample.kwargs)
                except Exception:  # noqa: BLE001 - not traceable on meta (or not in-place-able)
                    s.not_traceable += 1
                    continue
                _check_sample(s, op.name, t)
                s.costed += 1
    return s


def test_the_survey_covers_the_database(survey: Survey) -> None:
    # ~1800 samples over ~700 OpInfos; a collapse here would make the rest vacuous.
    assert survey.costed > 1500, survey.costed
    assert survey.costed > 10 * survey.not_traceable


def test_every_traced_sample_is_costed(survey: Survey) -> None:
    assert not survey.unit_errors, dict(survey.unit_errors)


def test_no_kernel_costed_at_zero(survey: Survey) -> None:
    unexpected = {k: sorted(v)[:4] for k, v in survey.zero.items() if k not in EXCEPTIONS}
    assert not unexpected, unexpected


def test_exceptions_are_still_needed(survey: Survey) -> None:
    # An exception whose op is costed now should leave the list.
    costed = [k for k in EXCEPTIONS if k in survey.ops_seen and k not in survey.zero]
    assert not costed, costed
    # So should one the survey no longer reaches, on the torch the list was made for: torch
    # 2.11's OpInfo samples of SDPA on meta never reach the CPU flash kernel.
    if torch.__version__ >= (2, 14):
        gone = [k for k in EXCEPTIONS if k not in survey.ops_seen]
        assert not gone, gone


# ---- rule level: bytes and launches the CUDA algorithms need ---------------------------------

F32, I64 = 6, 4


def _t(shape: tuple[int, ...], dtype: int = F32, storage: int = 0) -> tuple[int, tuple]:
    return cost.tensor_arg(shape, dtype, storage=storage)


def _traced_unit(fn) -> dict:
    with trace(None, gpu=GPU) as t:
        fn()
    # The input's own torch.empty is a unit without a kernel; the op under test is the other.
    rows = [r for r in cost.trace_features(t, GPU) if r["kernels"] > 0]
    assert len(rows) == 1, [r["op"] for r in rows]
    return rows[0]


def test_large_sort_is_a_multi_pass_radix_sort() -> None:
    n = 1 << 20  # one slice longer than 4096: cub radix sort of (float32 key, int64 index)
    row = _traced_unit(lambda: torch.sort(torch.empty(n, device="meta")))
    passes = 32 // 8  # 8 key bits per onesweep pass
    per_pass = 2 * n * (4 + 8)  # read and write keys + indices
    assert row["op"].startswith("aten::sort")
    assert row["bytes_read"] + row["bytes_written"] >= passes * per_pass
    assert row["kernels"] >= passes
    # Memory-bound: at least the DRAM time of those passes on the target GPU.
    bw = cost.get_gpu(GPU).memory_bandwidth_bytes_per_s
    assert row["analytic_time_s"] >= passes * per_pass / bw


def test_short_rows_sort_in_shared_memory_with_one_pass() -> None:
    rows, n = 4096, 512  # slices <= 4096: copy, index fill, one in-place key/value sort
    row = _traced_unit(lambda: torch.sort(torch.empty(rows, n, device="meta"), dim=-1))
    total = rows * n
    assert row["kernels"] == 3
    # Compulsory traffic (read the input, write values and indices) at most ~3x: no radix passes.
    compulsory = total * 4 + total * (4 + 8)
    assert compulsory <= row["bytes_read"] + row["bytes_written"] <= 3 * compulsory
    assert row["outer"] == rows and row["inner"] == n


def test_sort_costs_more_than_a_copy_of_the_same_tensor() -> None:
    x = (1 << 22,)
    sort = _traced_unit(lambda: torch.sort(torch.empty(x, device="meta")))
    copy = _traced_unit(lambda: torch.empty(x, device="meta").clone())
    assert sort["analytic_time_s"] > 4 * copy["analytic_time_s"]


def test_cumsum_is_one_pass() -> None:
    row = _traced_unit(lambda: torch.cumsum(torch.empty(256, 4096, device="meta"), dim=1))
    assert row["bytes_read"] == row["bytes_written"] == 256 * 4096 * 4
    assert row["kernels"] == 1


def test_cummax_writes_values_and_indices() -> None:
    row = _traced_unit(lambda: torch.cummax(torch.empty(64, 1000, device="meta"), dim=0))
    assert row["bytes_read"] == 64 * 1000 * 4
    assert row["bytes_written"] == 64 * 1000 * (4 + 8)


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(1000, 1000, device="meta"),
    lambda: torch.ones(1000, 1000, device="meta"),
    lambda: torch.full((1000, 1000), 2.0, device="meta"),
    lambda: torch.rand(1000, 1000, device="meta"),
    lambda: torch.randn(1000, 1000, device="meta"),
    lambda: torch.empty(3, device="meta").new_zeros(1000, 1000),
])
def test_factories_are_write_only(make) -> None:
    row = _traced_unit(make)
    assert row["bytes_read"] == 0
    assert row["bytes_written"] == 1000 * 1000 * 4
    assert row["analytic_time_s"] > 0


def test_median_of_everything_runs_one_block() -> None:
    # median() is one slice: gatherMedian runs one CTA, so it is far slower than a reduction
    # of the same tensor that spreads over the whole GPU.
    n = 1 << 24
    med = _traced_unit(lambda: torch.median(torch.empty(n, device="meta")))
    red = _traced_unit(lambda: torch.empty(n, device="meta").amax())
    assert med["tiles"] == 1
    assert med["analytic_time_s"] > 10 * red["analytic_time_s"]


def test_topk_multiblock_passes_read_the_input_per_digit() -> None:
    n = 1 << 24  # one long slice: the multi-block radix select, 8 bits per pass
    row = _traced_unit(lambda: torch.topk(torch.empty(n, device="meta"), 10))
    assert row["bytes_read"] >= (32 // 8) * n * 4


def test_index_backward_sorts_the_indices() -> None:
    # x[idx] backward is index_put_(accumulate=True): radix-sorts the int64 indices first.
    src = torch.empty(100_000, 64, device="meta", requires_grad=True)
    idx = torch.empty(50_000, dtype=torch.long, device="meta")
    with trace(None, gpu=GPU) as t:
        src[idx].sum().backward()
    rows = [r for r in cost.trace_features(t, GPU) if r["op"].startswith("aten::index_put")]
    assert len(rows) == 1
    assert rows[0]["kernels"] >= 3 + math.ceil(math.log2(100_000 * 64) / 8)
    # At least: the gathered rows read and written once, and the sort passes over 16-byte pairs.
    assert rows[0]["bytes_read"] >= 50_000 * 64 * 4 + 2 * 50_000 * 16


def test_embedding_is_a_gather_of_the_looked_up_rows() -> None:
    w = torch.empty(50_000, 512, device="meta")
    idx = torch.empty(8, 128, dtype=torch.long, device="meta")
    row = _traced_unit(lambda: torch.nn.functional.embedding(idx, w))
    assert row["op"] == "aten::embedding"
    rows_read = 8 * 128 * 512 * 4
    assert rows_read <= row["bytes_read"] < 2 * rows_read  # not the 100 MB table
    assert row["bytes_written"] == rows_read
