"""The public NeuSight data set's loader and op mapping (blink/data_public.py), on real rows.

Needs the data set at ../shared/data/public/neusight-train beside the repository (where CI has
it) or /work/shared/...; skipped without it. Reads a few hundred rows: each of the five file
kinds parses, every row maps to an ATen op the C++ rule table matches (no generic fallback), and
both predicted times are positive and finite.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from blink import data_public as dp

_REL = Path("shared") / "data" / "public" / "neusight-train"


def _find_root() -> Path | None:
    for base in (Path(__file__).resolve().parents[2], Path("/work")):
        if (base / _REL).is_dir():
            return base / _REL
    return None


ROOT = _find_root()
needs_data = pytest.mark.skipif(
    ROOT is None, reason=f"NeuSight public data set not found ({_REL} beside the repository "
                         "or under /work); it lives in the workspace's shared/ folder")

ELEM_OPS = {"add", "mul", "pow", "div", "addu", "mulu", "powu", "divu", "relu", "gelu", "tanh"}
KIND = {"bmm": "gemm", "linear": "gemm", "elem": "elementwise", "ln": "norm",
        "softmax": "softmax"}
ATEN = {"bmm": "aten::bmm", "linear": "aten::addmm", "ln": "aten::native_layer_norm",
        "softmax": "aten::_softmax"}


def test_data_dir_missing_root_is_none(tmp_path):
    assert dp.data_dir(tmp_path / "nope") is None
    assert dp.data_dir(tmp_path) == tmp_path


@needs_data
def test_data_dir_finds_the_set():
    assert dp.data_dir() is not None
    assert (dp.data_dir() / "README.md").is_file()


@needs_data
@pytest.mark.parametrize("family", dp.FAMILIES)
def test_each_file_kind_parses(family):
    rows = dp.load_family(ROOT, family, "Tesla T4", max_rows_per_file=40, seed=1)
    assert len(rows) == 40
    width = 4 if family in ("bmm", "linear") else 2
    for r in rows:
        assert r.family == family
        assert r.device == "Tesla T4" and r.gpu in dp.DEVICES.values()
        assert len(r.dims) == width and all(d >= 1 for d in r.dims)
        assert 1e-6 < r.latency_s < 100.0  # Latency is in ms in the CSV
        assert r.kernel and r.kernels
        assert all(g >= 1 for g in r.grid) and all(b >= 1 for b in r.block)
        if family == "elem":
            assert r.op in ELEM_OPS
        else:
            assert r.op == {"bmm": "bmm", "linear": "linear", "ln": "ln",
                            "softmax": "softmax"}[family]
    # sampling is deterministic and keeps file order
    again = dp.load_family(ROOT, family, "Tesla T4", max_rows_per_file=40, seed=1)
    assert again == rows


@needs_data
def test_elem_file_holds_all_ops_and_gpus():
    rows = dp.load_family(ROOT, "elem")
    assert {r.op for r in rows} == ELEM_OPS
    assert {r.device for r in rows} == set(dp.DEVICES)


def _sample() -> list[dp.Row]:
    # a few hundred rows of the mixed element-wise file (all ops, all GPUs) and some of the rest
    rows = dp.load_family(ROOT, "elem", max_rows_per_file=300, seed=0)
    for family in ("bmm", "linear"):
        rows += dp.load_family(ROOT, family, "NVIDIA A100-PCIE-40GB", max_rows_per_file=40)
    for family in ("ln", "softmax"):
        rows += dp.load_family(ROOT, family, max_rows_per_file=40)
    return rows


@needs_data
def test_every_row_maps_to_a_matched_op_with_positive_finite_times():
    rows = _sample()
    assert {r.family for r in rows} == set(dp.FAMILIES)
    for r in rows:
        m = dp.map_row(r)
        if r.family in ATEN:
            assert m.op_name == ATEN[r.family]
        f = dp.predict(r)
        assert f["matched"], f"{m.op_name} fell back to the generic rule"
        assert f["kind"] == KIND[r.family], (m.op_name, f["kind"])
        assert f["math_mode"] == "fp32_simt"
        for key in ("roofline_time_s", "analytic_time_s", "flops", "bytes_read",
                    "bytes_written"):
            assert math.isfinite(f[key]) and f[key] > 0, (m.op_name, r.dims, key, f[key])


@needs_data
def test_gemm_letters_follow_neusight():
    # NeuSight's bmm (B, M, N, K) is (B, M, N) @ (B, N, K); its linear is nn.Linear(N, K) on a
    # (B, M, N) input: addmm over B*M rows with the weight's transpose as a (1, N)-strided view.
    bmm = dp.load_family(ROOT, "bmm", "Tesla V100-PCIE-32GB", max_rows_per_file=5)
    for r in bmm:
        b, m, n, k = r.dims
        f = dp.predict(r)
        assert (f["batch"], f["m"], f["k"], f["n"]) == (b, m, n, k)
        assert f["flops"] == 2.0 * b * m * n * k
        assert f["bytes_written"] == 4.0 * b * m * k
    lin = dp.load_family(ROOT, "linear", "Tesla V100-PCIE-32GB", max_rows_per_file=5)
    for r in lin:
        b, m, n, k = r.dims
        f = dp.predict(r)
        assert (f["m"], f["k"], f["n"]) == (b * m, n, k)
        assert f["trans_b"] and not f["trans_a"]
        assert f["bytes_read"] == 4.0 * (k + b * m * n + n * k)  # bias, input, weight
        assert "_tn" in r.kernel or "_nn" in r.kernel


@needs_data
def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="unknown device"):
        dp.load_family(ROOT, "ln", "H100")
