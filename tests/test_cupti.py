"""blink._cupti: where it is built (and why not), its errors, and — on a GPU — what it records."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blink
from blink.collect import cupti as cupti_py

ROOT = Path(__file__).resolve().parents[1]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _finder():
    spec = importlib.util.spec_from_file_location("blink_find_cupti_test",
                                                  ROOT / "csrc" / "cupti" / "find_cupti.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _fake_cupti(root: Path, major: int, api: int, lib_major: int | None = None,
                with_cuda_h: bool = True) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "include" / "cupti_activity.h").write_text("")
    (root / "include" / "cupti_version.h").write_text(f"#define CUPTI_API_VERSION {api}\n")
    if with_cuda_h:
        (root / "include" / "crt").mkdir()
        (root / "include" / "cuda.h").write_text(f"#define CUDA_VERSION {major}000\n")
        (root / "include" / "crt" / "host_defines.h").write_text("")
    (root / "lib64").mkdir()
    (root / "lib64" / f"libcupti.so.{lib_major or major}").write_text("")
    return root


# -- where it is built ------------------------------------------------------------------------

def test_skipped_with_reason_without_cuda():
    f = _finder()
    build, search, line = f.decide({}, torch_cuda=None)
    assert not build and "CPU-only build" in line and "skipped" in line
    build, _, line = f.decide({"BLINK_WITH_CUPTI": "0"})
    assert not build and line == "blink._cupti: skipped (BLINK_WITH_CUPTI=0)"


def test_required_but_missing_is_a_build_error(tmp_path):
    f = _finder()
    with pytest.raises(RuntimeError, match="BLINK_WITH_CUPTI=1 but blink._cupti cannot be built"):
        f.decide({"BLINK_WITH_CUPTI": "1"}, torch_cuda=None)
    # A CUDA torch, but nothing under the places searched: the message lists them.
    with pytest.raises(RuntimeError, match="no CUPTI for CUDA 13 found"):
        f.decide({"BLINK_WITH_CUPTI": "1", "BLINK_CUPTI_ROOT": str(tmp_path / "nope")},
                 torch_cuda="13.0", site_dirs=[], cuda_homes=[str(tmp_path / "cuda")])
    with pytest.raises(RuntimeError, match="must be 0, 1 or auto"):
        f.decide({"BLINK_WITH_CUPTI": "maybe"})


def test_finds_toolkit_layout_of_matching_major(tmp_path):
    f = _finder()
    home = tmp_path / "cuda-12.8"
    _fake_cupti(home / "extras" / "CUPTI", 12, 26, with_cuda_h=False)
    (home / "include" / "crt").mkdir(parents=True)
    (home / "include" / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    (home / "include" / "crt" / "host_defines.h").write_text("")
    s = f.search({}, torch_cuda="12.8", site_dirs=[], cuda_homes=[str(home)])
    assert s.found is not None, s.tried
    assert s.found.library == "libcupti.so.12" and s.found.cuda_major == 12
    assert s.found.include_dirs == [str(home / "extras" / "CUPTI" / "include"),
                                    str(home / "include")]
    # The same toolkit for a CUDA 13 torch: not usable (one CUPTI per process), and said so.
    s = f.search({}, torch_cuda="13.0", site_dirs=[], cuda_homes=[str(home)])
    assert s.found is None and "not for CUDA 13" in s.reason


def test_override_root_and_library_major(tmp_path):
    f = _finder()
    root = _fake_cupti(tmp_path / "c", 13, 130001, lib_major=12)
    s = f.search({"BLINK_CUPTI_ROOT": str(root)}, torch_cuda="13.0", site_dirs=[],
                 cuda_homes=[])
    assert s.found is None and "no libcupti.so.13" in s.reason
    (root / "lib64" / "libcupti.so.13").write_text("")
    s = f.search({"BLINK_CUPTI_ROOT": str(root)}, torch_cuda="13.0", site_dirs=[],
                 cuda_homes=[])
    assert s.found is not None and s.found.source.startswith("BLINK_CUPTI_ROOT")


def test_find_cupti_script_prints_json():
    out = subprocess.run([sys.executable, str(ROOT / "csrc" / "cupti" / "find_cupti.py")],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["message"].startswith("blink._cupti: ")
    assert doc["build"] == (doc["found"] is not None)


def test_runtime_reason_here():
    reason = cupti_py.unavailable_reason()
    if torch.cuda.is_available() and importlib.util.find_spec("blink._cupti"):
        assert reason is None
    else:
        assert reason is not None
        assert reason == "no CUDA device" or "not built" in reason


# -- the module's Python surface (wherever it is built) ---------------------------------------

cupti_built = pytest.mark.skipif(importlib.util.find_spec("blink._cupti") is None,
                                 reason="blink._cupti not built here (no CUPTI found)")


@cupti_built
def test_module_surface_and_error_type():
    from blink import _cupti

    assert issubclass(_cupti.Error, blink.BlinkError)
    info = _cupti.build_info()
    assert info["cupti_api_version"] >= 18 and info["torch_version"]
    assert not _cupti.active()
    with pytest.raises(blink.BlinkError, match="no blink CUPTI trace is running"):
        _cupti.stop()
    with pytest.raises(blink.BlinkError, match="phase must be"):
        _cupti.set_phase(7)


@cupti_built
def test_start_fails_cleanly_without_a_device_or_inside_profiler():
    # In a subprocess: CUPTI without a device must give an error, not a crash; inside
    # torch.profiler the tracer refuses before touching CUPTI.
    code = """
import torch, blink
from blink import _cupti
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
    try:
        _cupti.start(); print("STARTED")
    except blink.BlinkError as e:
        print("REFUSED", e)
if not torch.cuda.is_available():
    try:
        _cupti.start(); print("STARTED")
    except blink.BlinkError as e:
        print("NODEVICE", type(e).__name__)
print("ACTIVE", _cupti.active())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REFUSED torch.profiler is active" in out.stdout
    if not torch.cuda.is_available():
        assert "NODEVICE Error" in out.stdout
    assert "ACTIVE False" in out.stdout


@cupti_built
def test_python_wrapper_refuses_inside_profiler():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(blink.BlinkError):
            cupti_py.CuptiTrace()


def test_summarize_attributes_and_reports_strays():
    # The aggregation over raw records, with a hand-made record (no GPU needed).
    raw = {
        "names": ["gemm_kernel", "stray_kernel"],
        "ops": [(0, "aten::mm", "", "8x8;8x8", "6,6", 0, 0, True, 1000, 9000),
                (1, "aten::empty", "memory_format", "", "", 0, 0, False, 9000, 9500)],
        "kernels": [(0, 3000, 5000, 0, 7, 11, 0, (4, 1, 1), (128, 1, 1), 64, 0, 4096),
                    (0, 5000, 8000, 0, 7, 12, 0, (2, 1, 1), (128, 1, 1), 64, 0, 0),
                    (1, 9000, 9100, 0, 7, 13, -1, (1, 1, 1), (32, 1, 1), 8, 0, 0)],
        "transfers": [(True, 0, 256, 2000, 2500, 0, 7, 10, 0)],
        "apis": [(False, 211, 1500, 1800, 11, 1, 0), (False, 211, 1900, 2100, 12, 1, 0)],
        "dropped": 0, "incomplete": 0, "start_ns": 0, "end_ns": 10000,
    }
    s = cupti_py.summarize(raw, [0], lambda driver, cbid: "cudaLaunchKernel")
    assert len(s.ops) == 1  # the CPU-side empty that launched nothing is left out
    op = s.ops[0]
    assert op.n_kernels == 2 and op.kernel_s == pytest.approx(5e-6)
    assert op.memset_n == 1 and op.time_s == pytest.approx(5.5e-6)
    assert op.main_grid == "2,1,1" and op.main_smem_dynamic == 0
    assert op.launch_n == 2 and op.launch_delay_s == pytest.approx(0.5e-6)
    assert op.span_s == pytest.approx(6e-6) and op.host_s == pytest.approx(8e-6)
    assert s.unattributed_n == 1 and "stray_kernel" in s.unattributed_top


# -- on a GPU ---------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.gpu
def test_gpu_attributes_every_kernel_of_a_training_step():
    from blink.collect.measure import gpu_trace
    from blink.collect.presets import ModelRun, Protocol
    from blink.collect.protocol import ModelWorkload

    wl = ModelWorkload(ModelRun("builtin:convnet", 8, None, "fp32", "train"), Protocol())
    call = wl.materialize(torch.device("cuda"), 0)
    for _ in range(2):
        call()
    s = gpu_trace(call, 1, cupti_py.UNIT_BY_RULE)
    wl.release()
    assert s.unattributed_n == 0, s.unattributed_top
    assert s.dropped == 0 and s.n_kernels > 50
    convs = [o for o in s.ops if o.name == "aten::convolution"]
    assert convs and all(o.n_kernels >= 1 and o.time_s > 0 for o in convs)
    assert {o.phase for o in s.ops} == {0, 1, 2}
    assert all(o.launch_n >= 1 for o in s.ops if o.n_kernels)


@needs_gpu
@pytest.mark.gpu
def test_gpu_agrees_with_torch_profiler():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cupti_validate

    res = cupti_validate.validate_model("builtin:gpt", 4, 128, "bf16", "train", reps=3)
    assert res["same_unit_sequence"] and res["kernel_count_mismatches"] == 0, res
    assert abs(res["rel_diff"]) <= cupti_validate.TOLERANCE, res
    for check in (cupti_validate.check_refuses_inside_profiler,
                  cupti_validate.check_profiler_after_blink):
        out = check()
        assert out["ok"], out
