"""`blink collect` end to end on the CPU (the smoke preset), resume, the time budget, and the
dataset loader's checks; the unit alignment; and, on a GPU, the same pipeline with CUPTI."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import blink
from blink.collect import load_dataset, read_history, validate_dataset
from blink.collect.cli import main as collect_main
from blink.collect.cupti import UNIT_BY_RULE
from blink.collect.dataset import PROGRESS, PROVENANCE, TABLES
from blink.collect.match import Key, align, shapes_key_profiler, shapes_key_raw
from blink.collect.presets import get_preset, run_id
from blink.errors import DatasetError

SMOKE = get_preset("smoke")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One full CPU smoke collection, shared (read-only) by the tests below."""
    out = tmp_path_factory.mktemp("collect") / "smoke"
    t0 = time.perf_counter()
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cpu",
                         "--quiet"]) == 0
    return out, time.perf_counter() - t0


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_smoke_end_to_end(smoke, capsys):
    out, seconds = smoke
    assert seconds < 90, f"the smoke preset took {seconds:.0f} s"
    ds = load_dataset(str(out))
    prov = ds.provenance
    assert prov["status"] == "complete" and prov["schema_version"] == 1
    assert prov["device"] == "cpu" and prov["preset"] == "smoke"
    configs = SMOKE.configs()
    assert {r["run_id"] for r in ds.runs} == {run_id(c) for c in configs}
    assert all(r["status"] == "ok" for r in ds.runs), [r["error"] for r in ds.runs]
    env = ds.environment(ds.runs[0]["env_id"])
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    for r in ds.runs:
        assert r["timer"] == "perf_counter" and 0 < r["time_min_s"] <= r["time_median_s"]
        assert r["time_median_s"] <= r["time_max_s"] and r["feature_gpu"] == "H200"
        assert r["torch"] == torch.__version__ and r["env_id"] == ds.runs[0]["env_id"]
        units = ds.units_of(r["run_id"])
        assert len(units) >= r["n_units_dry"] >= 1
        assert r["n_units_exact"] + r["n_units_name"] <= r["n_units_dry"]
    models = [r for r in ds.runs if r["kind"] == "model"]
    assert {r["mode"] for r in models} == {"inference", "train"}
    for r in models:
        # Most units line up with the dry run even on a CPU (CPU kernels differ from CUDA's).
        matched = r["n_units_exact"] + r["n_units_name"]
        assert matched >= 0.6 * r["n_units_dry"], (r["model"], r["mode"], matched)
    mm = [r for r in ds.runs if r["op"] == "mm"]
    assert mm and all(r["n_units_exact"] == 1 for r in mm)
    u = next(u for u in ds.units_of(mm[0]["run_id"]) if u["match"] == "exact")
    params = json.loads(mm[0]["params"])
    assert u["op"] == "aten::mm" and u["kind"] == "gemm"
    assert (u["f_m"], u["f_n"], u["f_k"]) == (params["m"], params["n"], params["k"])
    assert u["f_flops"] == 2 * params["m"] * params["n"] * params["k"]
    assert u["time_s"] > 0 and u["host_s"] > 0 and u["f_analytic_time_s"] > 0
    # Every feature the predictor computes is a column.
    assert set(ds.feature_columns) >= {"flops", "bytes_read", "m", "n", "k", "waves",
                                       "roofline_time_s", "analytic_time_s"}
    assert validate_dataset(str(out)).startswith(str(out))
    assert collect_main(["--validate", str(out)]) == 0
    assert "15 runs" in capsys.readouterr().out


def test_resume_skips_finished_work(smoke, tmp_path, capsys):
    out = _copy(smoke[0], tmp_path)
    before = {n: (out / n).read_bytes() for n in TABLES.values()}
    t0 = time.perf_counter()
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cpu",
                         "--quiet"]) == 0
    assert time.perf_counter() - t0 < 20
    assert "0 configurations measured" in capsys.readouterr().out
    assert {n: (out / n).read_bytes() for n in TABLES.values()} == before
    prov = json.loads((out / PROVENANCE).read_text())
    assert len(prov["sessions"]) == 2 and prov["sessions"][-1]["runs"] == 0
    load_dataset(str(out))


def test_resume_after_a_cut_off_run(tmp_path, capsys):
    out = tmp_path / "partial"
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cpu",
                         "--limit", "2", "--quiet"]) == 0
    assert "--limit 2 reached" in capsys.readouterr().out
    first = load_dataset(str(out))
    assert first.provenance["status"] == "partial" and len(first.runs) == 2
    # A crash in the middle of writing the next run: bytes after the journal's last entry,
    # and a journal line cut off mid-write. Resume rolls both back and carries on.
    with open(out / TABLES["units"], "ab") as f:
        f.write(gzip.compress(b"garbage,row\n")[:20])
    with open(out / PROGRESS, "a", encoding="utf-8") as f:
        f.write('{"run_id": "dead')
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cpu",
                         "--limit", "2", "--quiet"]) == 0
    ds = load_dataset(str(out))
    ids = [r["run_id"] for r in ds.runs]
    expected = [run_id(c) for c in SMOKE.configs()[:4]]
    assert ids == expected  # no run repeated, none lost, in preset order


def test_time_budget_stops_cleanly(tmp_path, capsys):
    out = tmp_path / "budget"
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cpu",
                         "--time-budget", "2", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "partial" in text and "time budget of 2 s reached" in text
    ds = load_dataset(str(out))  # a budget stop leaves a complete, verifiable dataset
    assert 1 <= len(ds.runs) < len(SMOKE.configs())
    assert ds.provenance["stop_reason"].startswith("time budget")


def test_progress_output_and_module_entry_point(tmp_path):
    out = tmp_path / "p"
    proc = subprocess.run([sys.executable, "-m", "blink.collect", "--preset", "smoke", "--out",
                           str(out), "--device", "cpu", "--limit", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[1/1 " in proc.stderr and " ok " in proc.stderr  # one line per configuration
    assert "blink collect: partial: 1 configurations measured" in proc.stdout


def test_cli_errors(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert collect_main(["--preset", "h200", "--out", str(tmp_path / "x")]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    assert collect_main(["--preset", "h200", "--out", str(tmp_path / "y"), "--device",
                         "cpu"]) == 2
    assert "is for --device cuda" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert collect_main(["--preset", "smoke", "--out", str(tmp_path / "busy"), "--device",
                         "cpu"]) == 2
    assert "is not empty and holds no provenance.json" in capsys.readouterr().err
    assert collect_main(["--preset", "smoke", "--list"]) == 0
    assert "builtin:gpt b=1 s=32 fp32 train" in capsys.readouterr().out


def test_resume_refuses_another_preset(smoke, tmp_path, capsys):
    out = _copy(smoke[0], tmp_path)
    prov = json.loads((out / PROVENANCE).read_text())
    prov["preset"] = "h200"
    (out / PROVENANCE).write_text(json.dumps(prov))
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cpu"]) == 2
    assert "holds preset 'h200'" in capsys.readouterr().err


# -- the loader rejects damaged files with clear errors ---------------------------------------

def test_truncated_file_is_rejected(smoke, tmp_path):
    out = _copy(smoke[0], tmp_path)
    data = (out / TABLES["units"]).read_bytes()
    (out / TABLES["units"]).write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"units\.csv\.gz is truncated: \d+ bytes"):
        load_dataset(str(out))
    # Without the provenance checks the decompressor still notices.
    with pytest.raises(DatasetError, match=r"units\.csv\.gz is truncated: the compressed data"):
        load_dataset(str(out), verify=False)


def test_corrupted_file_is_rejected(smoke, tmp_path):
    out = _copy(smoke[0], tmp_path)
    path = out / TABLES["runs"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"runs\.csv\.gz is corrupted: its SHA-256 differs"):
        load_dataset(str(out))
    with pytest.raises(DatasetError, match=r"runs\.csv\.gz is corrupted|runs\.csv\.gz line"):
        load_dataset(str(out), verify=False)


def test_schema_and_key_errors(smoke, tmp_path):
    out = _copy(smoke[0], tmp_path)
    prov = json.loads((out / PROVENANCE).read_text())
    (out / PROVENANCE).write_text(json.dumps({**prov, "schema_version": 99}))
    with pytest.raises(DatasetError, match="schema_version 99; this blink reads version 1: it "
                                           "was written by a newer blink"):
        load_dataset(str(out))
    (out / PROVENANCE).write_text("{not json")
    with pytest.raises(DatasetError, match="provenance.json is not valid JSON"):
        load_dataset(str(out))
    (out / PROVENANCE).unlink()
    with pytest.raises(DatasetError, match="not a blink dataset: provenance.json is missing"):
        load_dataset(str(out))
    with pytest.raises(DatasetError, match="no such dataset directory"):
        load_dataset(str(tmp_path / "absent"))


def test_bad_rows_are_named(smoke, tmp_path):
    out = _copy(smoke[0], tmp_path)
    units = out / TABLES["units"]
    with gzip.open(units, "rt", encoding="utf-8", newline="") as f:
        lines = f.readlines()
    run_col = lines[1].split(",").index("run_id")
    cells = lines[2].split(",")
    cells[run_col] = "ffffffffffffffff"
    lines[2] = ",".join(cells)
    with gzip.open(units, "wt", encoding="utf-8", newline="") as f:
        f.writelines(lines)
    with pytest.raises(DatasetError, match="row 1 points to run 'ffffffffffffffff'"):
        load_dataset(str(out), verify=False)
    cells[run_col + 1] = "one"  # unit_seq is an int
    lines[2] = ",".join(cells)
    with gzip.open(units, "wt", encoding="utf-8", newline="") as f:
        f.writelines(lines)
    with pytest.raises(DatasetError, match="line 3, column unit_seq: 'one' is not a valid int"):
        load_dataset(str(out), verify=False)
    with gzip.open(units, "wt", encoding="utf-8", newline="") as f:
        f.write("#blink-dataset table=runs schema=1\n")
    with pytest.raises(DatasetError, match="does not start with '#blink-dataset table=units"):
        load_dataset(str(out), verify=False)


def test_unfinished_collection_needs_allow_partial(smoke, tmp_path):
    out = _copy(smoke[0], tmp_path)
    prov = json.loads((out / PROVENANCE).read_text())
    prov["status"] = "in_progress"
    del prov["files"]
    (out / PROVENANCE).write_text(json.dumps(prov))
    with pytest.raises(DatasetError, match="unfinished collection"):
        load_dataset(str(out))
    assert len(load_dataset(str(out), allow_partial=True).runs) == len(SMOKE.configs())


def test_ingest_into_committed_form(smoke, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import collect_ingest

    src = tmp_path / "gpu_out"
    shutil.copytree(smoke[0], src / "data")
    (src / "checks.json").write_text(json.dumps({"build": True, "tests": True}))
    (src / "gpu_run.log").write_text("line 1\nline 2\n")
    data = tmp_path / "data"
    with pytest.raises(DatasetError, match="collected on 'cpu', not a GPU"):
        collect_ingest.ingest(str(src), "h200", str(data))
    text = collect_ingest.ingest(str(src), "h200", str(data), allow_cpu=True)
    assert "15 runs" in text
    dest = data / "h200"
    # (a CPU collection has no allocator history; a GPU one adds alloc_history.jsonl.gz)
    assert sorted(p.name for p in dest.iterdir()) == [
        "progress.jsonl", "provenance.json", "runs.csv.gz", "units.csv.gz"]
    prov = load_dataset(str(dest)).provenance
    assert prov["ingest"]["checks"]["tests"] is True and prov["ingest"]["log_tail"][-1] == "line 2"
    # A later session must extend the committed dataset, never drop runs from it.
    partial = tmp_path / "partial_out"
    assert collect_main(["--preset", "smoke", "--out", str(partial / "data"), "--device", "cpu",
                         "--limit", "1", "--quiet"]) == 0
    with pytest.raises(DatasetError, match="runs that .* lacks"):
        collect_ingest.ingest(str(partial), "h200", str(data), allow_cpu=True)
    # And the committed form resumes: nothing left to do.
    assert collect_main(["--preset", "smoke", "--out", str(dest), "--device", "cpu",
                         "--quiet"]) == 0


# -- pieces -----------------------------------------------------------------------------------

def test_dry_run_cut_matches_the_tracer_rule():
    # blink._cupti picks units as "own CUDA kernel, or a rule name"; the dry run's cut must not
    # count anything else, or ground truth and features would not line up.
    from blink.collect.models import ConvNet

    with torch.device("meta"):
        net = ConvNet()
    t = blink.trace_model(net, input_shape=(2, 3, 64, 64), mode="train")
    ops = t.ops
    for uid in t.native().units():
        assert ops[uid].kernel or ops[uid].name in UNIT_BY_RULE, ops[uid].name


def test_h200_preset_measures_autocast_group_norm():
    # The GPU preset times a group-norm net under AMP beside the batch-norm one, so that the
    # casts and the fp32 group norm CUDA autocast inserts (group_norm is on its fp32 list) get
    # per-unit ground truth; the dry run must hold those kernels.
    from blink.collect.presets import ModelRun
    from blink.collect.protocol import ModelWorkload, Protocol

    h200 = get_preset("h200").configs()
    for model in ("builtin:gnnet", "builtin:convnet"):
        assert ModelRun(model, 256, None, "amp-fp16", "inference") in h200
    t = ModelWorkload(ModelRun("builtin:gnnet", 4, None, "amp-fp16", "inference"),
                      Protocol()).dry_run("H200")
    norms = [o for o in t.ops if o.name == "aten::native_group_norm"]
    convs = [o for o in t.ops if o.name == "aten::convolution"]
    assert len(norms) == 13 and len(convs) == 17
    assert {o.inputs[0].dtype for o in norms} == {"float32"}
    assert {o.inputs[0].dtype for o in convs} == {"float16"}
    casts = [o for o in t.ops if o.name == "aten::_to_copy"
             and o.outputs[0].dtype == "float32" and len(o.outputs[0].shape) == 4]
    assert len(casts) >= 12  # every norm after a convolution upcasts its fp16 output


def test_h200_preset_measures_depthwise_convolutions():
    # The GPU preset times EfficientNet-B0 (the A100 whole-model gap, README) in TF32, fp16
    # autocast and bf16; its dry run must hold the depthwise convolutions that gap may be.
    from blink.collect.presets import ModelRun
    from blink.collect.protocol import ModelWorkload, Protocol

    h200 = get_preset("h200").configs()
    for dtype in ("fp32", "amp-fp16", "bf16"):
        assert ModelRun("torchvision:efficientnet_b0", 256, None, dtype, "inference") in h200
    t = ModelWorkload(ModelRun("torchvision:efficientnet_b0", 2, None, "fp32", "inference"),
                      Protocol()).dry_run("H200")
    convs = [o for o in t.ops if o.name == "aten::convolution"]
    depthwise = [o for o in convs if o.inputs[1].shape[1] == 1 and o.inputs[1].shape[0] > 1]
    assert len(convs) == 81 and len(depthwise) == 16


def test_h200_preset_measures_row_norms_over_transformer_widths():
    # Many-row layer / RMS norms at H 768-4096 (README: layer norm on Hopper), each one
    # kernel over rows x cols elements in the dry run.
    from blink.collect.presets import OpRun
    from blink.collect.protocol import OpWorkload, Protocol

    h200 = get_preset("h200").configs()
    for family in ("layer_norm", "rms_norm"):
        for dtype in ("fp32", "bf16"):
            assert OpRun(family, (("cols", 768), ("rows", 65536)), dtype) in h200
    t = OpWorkload(OpRun("layer_norm", (("cols", 768), ("rows", 8192)), "fp32"),
                   Protocol()).dry_run("H200")
    (norm,) = [o for o in t.ops if o.name == "aten::native_layer_norm"]
    assert norm.inputs[0].shape == (8192, 768)


def test_h200_preset_measures_transformers_grad_checkpointing():
    # The GPU preset times GPT-2 / BERT training with transformers' own activation
    # checkpointing; the dry run and the real (here CPU) run both switch it on.
    from blink.collect.presets import ModelRun
    from blink.collect.protocol import ModelWorkload, Protocol

    h200 = get_preset("h200").configs()
    assert ModelRun("hf:gpt2", 8, 512, "bf16", "train", grad_checkpointing=True) in h200
    cfg = ModelRun("hf:gpt2", 2, 32, "bf16", "train", grad_checkpointing=True)
    assert run_id(cfg) != run_id(ModelRun("hf:gpt2", 2, 32, "bf16", "train"))
    w = ModelWorkload(cfg, Protocol())
    t = w.dry_run("H200")
    recomputed = [o for o in t.ops if o.kernel and o.phase == "backward"
                  and o.name == "aten::addmm"]
    assert len(recomputed) == 12 * 4  # GPT-2's four Conv1D projections per layer, again
    call = w.materialize(torch.device("cpu"), seed=0)
    call()
    assert any(getattr(m, "gradient_checkpointing", False) for m in w._real.net.modules())
    assert w.row_fields()["grad_checkpointing"] is True
    w.release()


def test_h200_preset_measures_decode_steps():
    # A decode step after 2,048 cached tokens: the dry run releases the cache layers the step
    # replaces; the real (here CPU) run fills the model's own cache with a real prompt and every
    # call starts from the same length.
    from blink.collect.presets import ModelRun
    from blink.collect.protocol import ModelWorkload, Protocol

    h200 = get_preset("h200").configs()
    assert ModelRun("hf:llama-1b", 32, 1, "bf16", "inference", kv_cache=2048) in h200
    cfg = ModelRun("hf:gpt2", 2, 1, "fp32", "inference", kv_cache=64)
    assert run_id(cfg) != run_id(ModelRun("hf:gpt2", 2, 1, "fp32", "inference"))
    w = ModelWorkload(cfg, Protocol())
    t = w.dry_run("H200")
    assert sum(a.storage < 0 and a.is_free for a in t.allocations) == 2 * 12  # keys, values
    call = w.materialize(torch.device("cpu"), seed=0)
    for _ in range(3):
        call()
        cache = w._real.kwargs.get("cache", w._real.kwargs.get("past_key_values"))
        assert cache.get_seq_length() == 64
    assert w.row_fields()["kv_cache"] == 64
    w.release()


def test_shape_keys_agree():
    raw = [(1, ((8, 3), (3, 1), 0, 1, 96, 6, 14, False)), (4, 2),
           (2, [((4,), (1,), 0, 2, 16, 6, 14, False), None]), (8, [1, 2])]
    assert shapes_key_raw(raw) == "8x3;;[4,-];"
    assert shapes_key_profiler([[8, 3], [], [[4], [2]], []]) == "8x3;;[4,2];"


def test_align_resynchronises():
    k = [Key(n, "") for n in "e e e add ln view as mm v".split()]
    m = [Key(n, "") for n in "view sel view ar sel add ln view as mm v".split()]
    pairs = align(k, m)
    exact = [(p.dry, p.measured) for p in pairs if p.match == "exact"]
    assert exact == [(3, 5), (4, 6), (5, 7), (6, 8), (7, 9), (8, 10)]
    assert sum(p.match == "dry_only" for p in pairs) + sum(p.match == "name" for p in pairs) == 3
    # Shapes keyed differently on one side (tensor lists): paired by name.
    a = [Key("foreach", "[1,2]"), Key("foreach", "[3]"), Key("mm", "1x1")]
    b = [Key("x", ""), Key("foreach", ""), Key("foreach", ""), Key("mm", "1x1")]
    got = [(p.dry, p.measured, p.match) for p in align(a, b)]
    assert got == [(None, 0, "measured_only"), (0, 1, "name"), (1, 2, "name"), (2, 3, "exact")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.gpu
def test_gpu_smoke_end_to_end(tmp_path):
    from blink.collect.cupti import unavailable_reason

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    out = tmp_path / "gpu"
    assert collect_main(["--preset", "smoke", "--out", str(out), "--device", "cuda",
                         "--quiet"]) == 0
    ds = load_dataset(str(out))
    assert all(r["status"] == "ok" for r in ds.runs), [r["error"] for r in ds.runs]
    for r in ds.runs:
        assert r["timer"] == "cuda_events" and r["peak_allocated_bytes"] > 0
        assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"] and r["gpu_name"]
        assert r["unattributed_n"] == 0, r["unattributed_top"]
        assert r["n_units_exact"] >= 0.8 * r["n_units_dry"], (r["model"], r["op"])
    mm = next(u for r in ds.runs if r["op"] == "mm" for u in ds.units_of(r["run_id"]))
    assert mm["n_kernels"] >= 1 and mm["main_kernel"] and mm["launch_n"] >= 1
    hist = list(read_history(str(out)))
    assert len(hist) == len(ds.runs) and all(h["events"] for h in hist)
