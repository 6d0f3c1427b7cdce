"""GEMM rates on GPUs Blink's training data lacks, against public torch.mm measurements
(data/published/torch_mm_tflops.csv), and the tensor-core rules those boards exercise."""
from __future__ import annotations

import copy
import json
import statistics
import sys
from pathlib import Path

import pytest

# Every test starts from the built-in GPU table only (test_hardware's autouse fixture).
from test_hardware import fresh_registry  # noqa: F401

from blink import hardware
from blink.cost import tensor_arg, unit_features

# The benchmark's reader of the published rows and its rate over the same square sizes, so the
# test checks what benchmarks/matmul_published.py reports.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from matmul_published import blink_tflops, measured  # noqa: E402

DTYPE_CODES = {"fp32": 6, "fp16": 5, "bf16": 15}


def published(gpu: str, dtype: str) -> float:
    """Median published rate (TFLOP/s) of a GPU and dtype."""
    return statistics.median(measured(gpu, dtype))


def mm_time(gpu: str, m: int, n: int, k: int, dtype: str) -> float:
    """Analytic time of one aten::mm in a long loop (no boost window)."""
    c = DTYPE_CODES[dtype]
    return unit_features("aten::mm", [tensor_arg((m, k), c), tensor_arg((k, n), c)],
                         [tensor_arg((m, n), c)], gpu, boost_window_s=0.0)["analytic_time_s"]


def test_tensor_core_gemm_rates_match_public_measurements_on_unseen_gpus():
    # Hopper, datacentre Blackwell, A100 and the GeForce boards (half-rate FP32 accumulate):
    # none of them in Blink's per-kernel training data, none of these rows fitted.
    cells = [(g, d) for g in ("A100-80GB", "H100-SXM", "H200", "B200", "RTX3090", "RTX4090")
             for d in ("fp16", "bf16")]
    ratios = {c: blink_tflops(*c) / published(*c) for c in cells}
    assert all(0.9 <= r <= 1.1 for r in ratios.values()), ratios
    roofline = [hardware.get_gpu(g).peak_flops[d] / 1e12 / published(g, d) for g, d in cells]
    assert statistics.median(abs(r - 1) for r in ratios.values()) < 0.5 * statistics.median(
        abs(r - 1) for r in roofline)


def test_fp32_gemm_on_shared_datapath_boards_matches_public_measurements():
    # GA102 / AD102 / GB202 list an FP32 peak that counts lanes shared with INT32; SGEMM reaches
    # ~70% of it. Before SIMT_GEMM_RATE_SHARED_DATAPATH Blink put the RTX 4090's 1.37x too fast.
    for gpu in ("RTX3090", "RTX4090", "RTX5090", "RTX-PRO-6000-WS"):
        g = hardware.get_gpu(gpu)
        assert hardware.fp32_shares_int_datapath(g.compute_capability)
        assert g.simt_gemm_rate == hardware.SIMT_GEMM_RATE_SHARED_DATAPATH < 1.0
        assert blink_tflops(gpu, "fp32") / published(gpu, "fp32") == pytest.approx(1.0, abs=0.06)
    # Hopper's 32 FP32 lanes per scheduler want every issue slot (SIMT_GEMM_RATE_SM90, fitted
    # on these two rows of one die); A100, datacentre Blackwell, Volta and Turing keep 1.
    for gpu in ("H100-SXM", "H200"):
        assert hardware.get_gpu(gpu).simt_gemm_rate == hardware.SIMT_GEMM_RATE_SM90 < 1.0
        assert blink_tflops(gpu, "fp32") / published(gpu, "fp32") == pytest.approx(1.0, abs=0.03)
    for gpu in ("A100-40GB", "B200", "V100", "T4"):
        assert hardware.get_gpu(gpu).simt_gemm_rate == 1.0
    # The power rule charges what the FP32 math reaches: the stock RTX 3090 holds its clock.
    assert hardware.get_gpu("RTX3090").sustained_fp32_ratio == hardware.TYPICAL_BOOST_HEADROOM


def _full_rate_twin(tmp_path: Path) -> str:
    """An RTX 3090 whose tensor cores ran at the A100's per-SM rate (4x its FP32-accumulate
    rate): the design point of the tile table, at the same clocks, SMs and memory."""
    from importlib import resources

    doc = json.loads(resources.files("blink").joinpath("data").joinpath("gpus.json")
                     .read_text("utf-8"))
    e = copy.deepcopy(next(g for g in doc["gpus"] if g["name"] == "RTX3090"))
    e["name"], e["aliases"] = "RTX3090-fullrate", ["rtx3090-fullrate"]
    for k in ("tf32", "fp16", "bf16"):
        e["peak_flops"][k] *= 4
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(e), encoding="utf-8")
    hardware.register_gpu_file(path)
    twin = hardware.get_gpu("RTX3090-fullrate")
    assert twin.sustained_tc_ratio == hardware.get_gpu("RTX3090").sustained_tc_ratio
    return twin.name


def test_quarter_rate_tensor_cores_lose_less_to_small_tiles_and_fixed_costs(tmp_path):
    twin = _full_rate_twin(tmp_path)

    def share_of_peak(gpu: str, m: int, n: int, k: int) -> float:
        peak = hardware.get_gpu(gpu).peak_flops["bf16"]
        return 2.0 * m * n * k / mm_time(gpu, m, n, k, "bf16") / peak

    # A large square GEMM runs its largest tiles on both: only the main loop's fixed losses
    # differ, half of them hidden behind MMAs that take twice their design clocks.
    big = share_of_peak("RTX3090", 8192, 8192, 8192) / share_of_peak(twin, 8192, 8192, 8192)
    assert 1.04 < big < 1.12
    # A GEMM too small for large tiles to fill 82 SMs (2048 x 2048: 64 tiles of 256 x 128): at
    # the design rate 64x64 tiles wait on shared memory (0.68 of the rate), so the plan keeps
    # the large tiles and idles SMs; at a quarter of that demand 64x64 tiles cost nothing extra,
    # fill the GPU, and the share of peak rises well beyond the fixed-cost gain.
    def tile(gpu: str) -> tuple[int, int]:
        f = unit_features("aten::mm", [tensor_arg((2048, 4096), 15), tensor_arg((4096, 2048), 15)],
                          [tensor_arg((2048, 2048), 15)], gpu, boost_window_s=0.0)
        return int(f["tile_m"]), int(f["tile_n"])

    assert tile("RTX3090") == (64, 64) and tile(twin) != (64, 64)
    small = share_of_peak("RTX3090", 2048, 2048, 4096) / share_of_peak(twin, 2048, 2048, 4096)
    assert small > 1.1 * big


def test_l4_tensor_cores_run_at_their_measured_sustained_clock():
    # The power rule would hold this 72 W board at boost under dense tensor-core math; the
    # public L4 row (issue 120) ran 52.5-59.4 TFLOP/s at n = 4096-10240, so its table entry
    # carries a measured tensor-core ratio, and long GEMMs land on those rates.
    g = hardware.get_gpu("L4")
    assert g.sustained_tc_ratio < 0.6 and "measured" in g.sustained_source
    sustained = [52.5, 53.0, 53.8, 54.9, 56.9, 59.4]  # fp16 / bf16 at n = 4096-10240
    for n in (4096, 8192, 10240):
        rate = 2.0 * n**3 / mm_time("L4", n, n, n, "bf16") / 1e12
        assert min(sustained) * 0.9 < rate < max(sustained) * 1.1
