"""blink.predict with trained artifacts: forests written by xgboost into a temporary
BLINK_MODELS_DIR change exactly the units they cover, the timeline is re-run with the new
times, conformal tables set the interval, and a bad card or artifact is a clear error."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import blink
from blink import learned
from blink.cost import trace_features
from blink.errors import ArtifactError, ConfigError
from blink.predict import INTERVAL_METHOD, predict_trace

xgb = pytest.importorskip("xgboost", reason="xgboost-cpu (requirements-dev.txt) writes the "
                                            "test's forests")

GPU = "A100-80GB"
CONV_FEATURES = ["flops", "bytes_read", "conv_c", "conv_k", "analytic_time_s", "gpu_mem_bw"]


@pytest.fixture(scope="module")
def traces():
    return {b: blink.trace_model("torchvision:resnet18", batch_size=b) for b in (2, 8, 32)}


@pytest.fixture(autouse=True)
def _fresh_cache():
    learned._CACHE.clear()
    yield
    learned._CACHE.clear()


def _rows(t, kind: str, features: list[str]) -> np.ndarray:
    r = learned.trace_input_rows(t, GPU)
    cols = [r["names"].index(f) for f in features]
    pick = [i for i, k in enumerate(r["kind"]) if k == kind]
    return r["rows"][pick][:, cols]


def _conv_forest(traces) -> xgb.Booster:
    x = np.concatenate([_rows(t, "conv", CONV_FEATURES) for t in traces.values()])
    # a correction that depends on the features (not a constant): big convs slower, small faster
    y = np.where(x[:, 0] > np.median(x[:, 0]), 0.4, -0.3) + 0.1 * np.log10(x[:, 3])
    return xgb.train({"max_depth": 3, "eta": 0.5, "nthread": 1}, xgb.DMatrix(x, y), 20)


def _constant_forest(value: float, d: int) -> xgb.Booster:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, d))
    return xgb.train({"max_depth": 2, "nthread": 1}, xgb.DMatrix(x, np.full(50, value)), 2)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_models(d: Path, forests: dict, conformal: dict | None = None,
                  scales: dict[str, float] | None = None,
                  ops: dict[str, list[str]] | None = None) -> Path:
    """forests: kind -> (booster, features, clip); scales: kind -> the card's scale; ops:
    kind -> the card's op list."""
    d.mkdir(parents=True, exist_ok=True)
    card = {"format_version": 1, "feature_schema_version": 1, "created": "test",
            "command": "tests/test_learned.py", "datasets": [], "forests": {}}
    for kind, (booster, features, clip) in forests.items():
        f = d / f"forest_{kind}.json"
        booster.save_model(str(f))
        card["forests"][kind] = {"file": f.name, "sha256": _sha(f), "target": "log_ratio",
                                 "features": features, "clip": list(clip), "gpus": ["T4"]}
        if scales and kind in scales:
            card["forests"][kind]["scale"] = scales[kind]
        if ops and kind in ops:
            card["forests"][kind]["ops"] = ops[kind]
    if conformal is not None:
        (d / "conformal.json").write_text(json.dumps(conformal))
        card["conformal"] = {"file": "conformal.json", "sha256": _sha(d / "conformal.json")}
    (d / "card.json").write_text(json.dumps(card))
    return d


def _timeline_end(t, analytic, trees) -> tuple[float, float]:
    """End-to-end and GPU-busy time re-derived in Python: each unit's time on the issue that
    owns it (its outermost ancestor on the timeline), the host times of the analytic run, one
    CPU thread issuing and one stream executing in order."""
    issue_ids = [ev["op_id"] for ev in analytic.timeline]
    index = {op: i for i, op in enumerate(issue_ids)}
    gpu = [0.0] * len(issue_ids)
    for u in trees.units:
        op, owner = u.op_id, None
        while op >= 0:
            if op in index:
                owner = op
            op = t.ops[op].parent
        gpu[index[owner]] += u.time_ms / 1e3
    host_t = gpu_free = end = 0.0
    for ev, g in zip(analytic.timeline, gpu, strict=True):
        host_t += ev["host_end_s"] - ev["host_start_s"]
        if g > 0:
            gpu_free = max(host_t, gpu_free) + g
        end = max(end, host_t, gpu_free)
    return end * 1e3, sum(gpu) * 1e3


def test_forest_unit_times_and_timeline(traces, tmp_path, monkeypatch):
    # batch 32: the A100's GPU (TF32 convolutions) outruns the host at batch 8, and only a
    # GPU-bound timeline shows a changed unit time in its end-to-end time
    t = traces[32]
    conv = _conv_forest(traces)
    clip_norm = _constant_forest(10.0, 1)  # p = 10, clipped to the card's 1.0
    _write_models(tmp_path / "m", {"conv": (conv, CONV_FEATURES, (-4.0, 4.0)),
                                   "norm": (clip_norm, ["numel"], (-1.0, 1.0))})
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "m"))
    analytic = predict_trace(t, GPU, predictor="analytic")
    trees = predict_trace(t, GPU)
    assert analytic.predictor == "analytic" and trees.predictor == "trees"
    # the expected log-ratio of every conv unit, from xgboost itself
    p_conv = iter(conv.predict(xgb.DMatrix(_rows(t, "conv", CONV_FEATURES))))
    by_id = {u.op_id: u for u in analytic.units}
    seen = {"conv": 0, "norm": 0}
    for u in trees.units:
        a = by_id[u.op_id]
        assert u.analytic_ms == pytest.approx(a.time_ms, rel=1e-12)
        if u.kind == "conv":
            want = a.time_ms * math.exp(float(np.clip(next(p_conv), -4, 4)))
            assert u.source == "trees"
            assert u.time_ms == pytest.approx(want, rel=1e-5)
            seen["conv"] += 1
        elif u.kind == "norm" and a.time_ms > 0:
            assert u.source == "trees"
            assert u.time_ms == pytest.approx(a.time_ms * math.e, rel=1e-6)
            seen["norm"] += 1
        else:
            assert u.source in ("analytic", "none")
            assert u.time_ms == a.time_ms
    assert seen["conv"] >= 15 and seen["norm"] >= 15
    # the timeline was re-run with the corrected unit times
    end_ms, busy_ms = _timeline_end(t, analytic, trees)
    assert trees.gpu_busy_ms == pytest.approx(busy_ms, rel=1e-9)
    assert trees.time_ms == pytest.approx(end_ms, rel=1e-9)
    assert analytic.gpu_busy_ms > 0.9 * analytic.time_ms  # GPU-bound, as the test needs
    assert trees.time_ms != pytest.approx(analytic.time_ms, rel=1e-3)
    assert trees.host_ms == pytest.approx(analytic.host_ms, rel=1e-12)
    assert sum(ev["gpu_end_s"] > ev["gpu_start_s"] for ev in trees.timeline) > 0
    assert any("trees for conv, norm" in n for n in trees.notes)
    assert any("A100-80GB is not among the GPUs" in n for n in trees.notes)
    assert trees.interval_method == INTERVAL_METHOD  # no conformal table in this directory


def test_card_scale_shrinks_each_correction_before_the_clip(traces, tmp_path, monkeypatch):
    t = traces[8]
    conv = _conv_forest(traces)
    big = _constant_forest(1.6, 1)  # p = 1.6: 0.5 x p = 0.8 is inside the clip, p is not
    _write_models(tmp_path / "m", {"conv": (conv, CONV_FEATURES, (-4.0, 4.0)),
                                   "norm": (big, ["numel"], (-1.0, 1.0))},
                  scales={"conv": 0.25, "norm": 0.5})
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "m"))
    trees = predict_trace(t, GPU)
    p_conv = iter(conv.predict(xgb.DMatrix(_rows(t, "conv", CONV_FEATURES))))
    p_norm = float(big.predict(xgb.DMatrix(np.zeros((1, 1))))[0])
    assert p_norm == pytest.approx(1.6, abs=0.05)
    n = {"conv": 0, "norm": 0}
    for u in trees.units:
        if u.kind == "conv":
            assert u.time_ms == pytest.approx(u.analytic_ms * math.exp(0.25 * next(p_conv)),
                                              rel=1e-5)
            n["conv"] += 1
        elif u.kind == "norm" and u.analytic_ms > 0:
            # scaled first, then clipped: 0.8, not clip(1.6) x 0.5 = 0.5
            assert u.time_ms == pytest.approx(u.analytic_ms * math.exp(0.5 * p_norm), rel=1e-6)
            n["norm"] += 1
    assert n["conv"] >= 15 and n["norm"] >= 15
    assert learned.load_models(tmp_path / "m").forests["conv"].scale == 0.25


class _TwoNorms(torch.nn.Module):
    """A batch norm and a layer norm in one model: two ops of the unit kind "norm"."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu_(self.bn(self.conv(x)))  # in place: aten::relu_, as in torchvision
        return self.ln(y.permute(0, 2, 3, 1))


def test_forest_corrects_only_the_ops_it_was_fitted_on(tmp_path, monkeypatch):
    t = blink.trace_model(_TwoNorms(), input_shape=(8, 3, 32, 32))
    up = _constant_forest(0.5, 1)
    # a layer-norm forest (an overload and the in-place form match their base op) and an
    # element-wise one fitted on out-of-place relu
    _write_models(tmp_path / "m", {"norm": (up, ["numel"], (-1.0, 1.0)),
                                   "elementwise": (up, ["numel"], (-1.0, 1.0))},
                  ops={"norm": ["aten::native_layer_norm.default"], "elementwise": ["aten::relu"]})
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "m"))
    p = predict_trace(t, GPU)
    by_op: dict[str, list] = {}
    for u in p.units:
        by_op.setdefault(u.op, []).append(u)
    assert {"aten::native_layer_norm", "aten::cudnn_batch_norm", "aten::relu_"} <= set(by_op)
    for op in ("aten::native_layer_norm", "aten::relu_"):
        for u in by_op[op]:
            assert u.source == "trees" and u.time_ms > 1.5 * u.analytic_ms
    for u in by_op["aten::cudnn_batch_norm"]:
        assert u.kind == "norm" and u.source == "analytic" and u.time_ms == u.analytic_ms
        assert u.fallback == "op_not_fitted"  # the core's reason, per unit
    assert all(u.fallback == "" for op in ("aten::native_layer_norm", "aten::relu_")
               for u in by_op[op])
    assert all(u.fallback == "no_forest" for u in p.units if u.kind in ("conv", "copy"))
    assert any("norm units the norm trees were not fitted on keep the analytic time: "
               "aten::cudnn_batch_norm 1 (the trees saw aten::native_layer_norm)" in n
               for n in p.notes), p.notes
    # no op list: the forest covers every op of its kind, batch norm included
    learned._CACHE.clear()
    _write_models(tmp_path / "all", {"norm": (up, ["numel"], (-1.0, 1.0))})
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "all"))
    q = predict_trace(t, GPU)
    assert all(u.source == "trees" for u in q.units if u.op == "aten::cudnn_batch_norm")


def test_forest_leaves_a_gpu_generation_it_never_saw_analytic(traces, tmp_path, monkeypatch):
    """A forest fitted on sm_6x..sm_7x GPUs keeps its hands off an sm_80 GPU (its GPU-spec splits
    would send every unit to the nearest trained chip's leaves), unless the caller extrapolates
    on purpose, as predict does for a GNN trained on the forests' output."""
    t = traces[32]
    conv = _conv_forest(traces)
    d = _write_models(tmp_path / "m", {"conv": (conv, CONV_FEATURES, (-4.0, 4.0))})
    _card_edit(_set(["forests", "conv", "cc_major_range"], [6, 7]))(d)
    monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
    a100 = predict_trace(t, GPU)  # A100-80GB: compute capability 8.0
    analytic = predict_trace(t, GPU, predictor="analytic")
    convs = [u for u in a100.units if u.kind == "conv"]
    assert len(convs) >= 15
    assert all(u.source == "analytic" and u.time_ms == u.analytic_ms for u in convs)
    assert all(u.fallback == "other_generation" for u in convs)
    assert all(u.fallback == "no_forest" for u in a100.units if u.kind != "conv")
    assert a100.predictor == "analytic" and a100.time_ms == analytic.time_ms
    assert any(f"conv units keep the analytic time ({len(convs)}): the conv trees were fitted "
               "on sm_6x to sm_7x GPUs only, and A100-80GB is sm_80" in n
               for n in a100.notes), a100.notes
    # the T4 (sm_75) is a generation the forest saw: xgboost's own correction applies
    t4 = predict_trace(t, "T4")
    rows = learned.trace_input_rows(t, "T4")
    cols = [rows["names"].index(f) for f in CONV_FEATURES]
    x = rows["rows"][[i for i, k in enumerate(rows["kind"]) if k == "conv"]][:, cols]
    want = iter(conv.predict(xgb.DMatrix(x)))
    for u in (u for u in t4.units if u.kind == "conv"):
        assert u.source == "trees" and u.fallback == ""
        assert u.time_ms == pytest.approx(u.analytic_ms * math.exp(next(want)), rel=1e-5)
    assert not any("keep the analytic time" in n for n in t4.notes)
    # extrapolating on purpose, the core applies it on the A100 too
    from blink.cost import core_gpu_spec
    from blink.hardware import get_gpu

    um = learned.load_models(d).unit_models
    spec = core_gpu_spec(get_gpu(GPU))
    gated = t.native().cost(spec, models=um)
    forced = t.native().cost(spec, models=um, extrapolate_forests=True)
    assert gated["forest_other_generation_units"] == len(convs)
    assert forced["forest_other_generation_units"] == 0
    # the binding's per-unit reason (its last field) agrees with the count
    assert sum(u[-1] == "other_generation" for u in gated["units"]) == len(convs)
    assert {u[-1] for u in forced["units"] if u[1] == "conv"} == {""}
    assert forced["gpu_busy_s"] != pytest.approx(gated["gpu_busy_s"], rel=1e-3)
    assert gated["gpu_busy_s"] == pytest.approx(analytic.gpu_busy_ms / 1e3, rel=1e-12)


def test_core_refuses_a_bad_generation_range():
    f = learned._C.parse_forest(json.dumps(json.loads(_constant_forest(0.1, 1).save_raw(
        "json").decode())), "f.json")
    with pytest.raises(learned._C.Error, match=r"f.json: compute-capability major range "
                                               r"\[8, 7\] is not 0 <= lo <= hi <= 99"):
        learned._C.UnitModels().add("norm", f, ["numel"], cc_major_lo=8, cc_major_hi=7)


def test_op_keys_drop_the_overload_and_the_in_place_underscore():
    key = learned._C.unit_model_op_key
    assert key("aten::add_.Tensor") == "aten::add"
    assert key("aten::add.Tensor") == "aten::add"
    assert key("aten::relu_") == "aten::relu"
    assert key("aten::__and__.Tensor") == "aten::__and__"
    assert key("aten::native_layer_norm") == "aten::native_layer_norm"


def test_predictions_with_artifacts_are_deterministic(traces, tmp_path, monkeypatch):
    _write_models(tmp_path / "m", {"conv": (_conv_forest(traces), CONV_FEATURES, (-4.0, 4.0))})
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "m"))
    first = blink.predict("torchvision:resnet18", batch_size=8, gpu=GPU).to_dict()
    learned._CACHE.clear()  # reload the artifacts from disk
    second = blink.predict("torchvision:resnet18", batch_size=8, gpu=GPU).to_dict()
    assert first == second
    assert {u["source"] for u in first["units"]} >= {"trees", "analytic"}


def test_without_models_everything_is_analytic(traces, tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "empty"))
    p = predict_trace(traces[8], GPU)
    forced = predict_trace(traces[8], GPU, predictor="analytic")
    assert {u.source for u in p.units} <= {"analytic", "none"}
    # without models every analytic unit says so; a failed unit has no fallback reason
    assert all(u.fallback == ("no_forest" if u.source == "analytic" else "") for u in p.units)
    assert all(u.fallback == "no_forest" for u in forced.units if u.source == "analytic")
    assert p.predictor == "analytic" and p.interval_method == INTERVAL_METHOD
    assert any("no trained models" in n and "card.json not found" in n for n in p.notes)
    assert p.time_ms == forced.time_ms
    assert [u.time_ms for u in p.units] == [u.time_ms for u in forced.units]
    assert all(u.analytic_ms == u.time_ms for u in p.units)
    with pytest.raises(ConfigError, match="predictor 'gnn' is not one of auto, trees, analytic"):
        predict_trace(traces[8], GPU, predictor="gnn")


def test_conformal_table_sets_intervals(traces, tmp_path, monkeypatch):
    conformal = {"format_version": 1, "method": "split-conformal (absolute log-ratio residuals)",
                 "coverage": 0.9, "calibration": "timm-rtx3090 held-out families",
                 "unit": {"conv": {"q": 0.25, "n": 400}},
                 "model": {"q": 0.3, "n": 120, "predictor": "analytic"}}
    _write_models(tmp_path / "m", {"conv": (_conv_forest(traces), CONV_FEATURES, (-4.0, 4.0))},
                  conformal)
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "m"))
    p = predict_trace(traces[8], GPU)
    assert p.lower_ms == pytest.approx(p.time_ms * math.exp(-0.3), rel=1e-12)
    assert p.upper_ms == pytest.approx(p.time_ms * math.exp(0.3), rel=1e-12)
    assert "split-conformal" in p.interval_method
    assert "90% nominal coverage" in p.interval_method
    assert "timm-rtx3090 held-out families (n=120)" in p.interval_method
    assert "for the analytic time" in p.interval_method
    for u in p.units:
        if u.source == "trees":
            assert u.lower_ms == pytest.approx(u.time_ms * math.exp(-0.25), rel=1e-12)
            assert u.upper_ms == pytest.approx(u.time_ms * math.exp(0.25), rel=1e-12)
        else:
            assert u.lower_ms is None and u.upper_ms is None
    # the analytic predictor keeps the uncalibrated band: the table was calibrated on trees
    a = predict_trace(traces[8], GPU, predictor="analytic")
    assert a.interval_method == INTERVAL_METHOD


def test_interval_widens_on_a_gpu_outside_the_calibration(traces, tmp_path, monkeypatch):
    """A whole-model q calibrated on one GPU's models: a GPU outside other_gpu.calibrated_on
    takes q_other_gpu and the method says so; a calibration GPU keeps q."""
    offsets = {"T4": 0.1, "V100": -0.05, "A100-40GB": 0.0}
    conformal = {"format_version": 1, "method": "split-conformal (absolute log-ratio residuals)",
                 "coverage": 0.9, "calibration": "timm-rtx3090 held-out families",
                 "model": {"q": 0.1, "n": 120, "predictor": "analytic", "q_other_gpu": 0.2,
                           "other_gpu": {"calibrated_on": [GPU], "chip_offsets": offsets},
                           "by_predictor": {"trees": {"q": 0.12, "n": 120,
                                                      "predictor": "forests",
                                                      "q_other_gpu": 0.25}}}}
    _write_models(tmp_path / "m", {"conv": (_conv_forest(traces), CONV_FEATURES, (-4.0, 4.0))},
                  conformal)
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "m"))
    here = predict_trace(traces[8], GPU)  # the calibration GPU
    assert here.predictor == "trees"
    assert here.upper_ms == pytest.approx(here.time_ms * math.exp(0.12), rel=1e-12)
    assert "widened" not in here.interval_method
    other = predict_trace(traces[8], "T4")
    assert other.predictor == "trees"
    assert other.lower_ms == pytest.approx(other.time_ms * math.exp(-0.25), rel=1e-12)
    assert other.upper_ms == pytest.approx(other.time_ms * math.exp(0.25), rel=1e-12)
    assert f"widened for T4, a GPU outside that calibration ({GPU})" in other.interval_method
    assert "(3 GPU chips)" in other.interval_method
    # a negative q_other_gpu is a corrupt table
    conformal["model"]["by_predictor"]["trees"]["q_other_gpu"] = -0.1
    _write_models(tmp_path / "bad", {"conv": (_conv_forest(traces), CONV_FEATURES, (-4.0, 4.0))},
                  conformal)
    monkeypatch.setenv("BLINK_MODELS_DIR", str(tmp_path / "bad"))
    with pytest.raises(ArtifactError, match=r"by_predictor.trees.q_other_gpu -0.1 is negative"):
        predict_trace(traces[8], "T4")


def test_python_input_row_equals_the_core_vector(traces):
    """Training builds rows with learned.input_row from features dicts; predict builds them in
    C++: the same names must give the same numbers."""
    t = traces[2]
    core = learned.trace_input_rows(t, GPU)
    assert core["names"] == learned.input_names()
    feats = trace_features(t, GPU)
    assert [f["op_id"] for f in feats] == core["op"]
    for f, row in zip(feats, core["rows"], strict=True):
        py = learned.input_row(f, GPU)
        assert list(py) == core["names"]
        np.testing.assert_array_equal(np.array(list(py.values())), row)
    assert core["rows"].shape == (len(core["op"]), len(core["names"]))
    # a non-finite feature is a missing value on both sides
    row = learned.input_row({**feats[0], "arithmetic_intensity": math.inf}, GPU)
    assert math.isnan(row["arithmetic_intensity"])
    assert core["rows"][:, core["names"].index("gpu_cc")].tolist() == [80.0] * len(core["op"])


# ---- bad cards and artifacts ---------------------------------------------------------------

def _good(tmp: Path) -> Path:
    return _write_models(tmp, {"norm": (_constant_forest(0.1, 2), ["numel", "flops"],
                                        (-1.0, 1.0))})


def _card_edit(fn):
    def apply(d: Path) -> None:
        card = json.loads((d / "card.json").read_text())
        fn(card)
        (d / "card.json").write_text(json.dumps(card))
    return apply


def _file_edit(name: str, fn):
    def apply(d: Path) -> None:
        (d / name).write_text(fn((d / name).read_text()))
    return apply


def _set(path: list, value):
    def fn(card):
        obj = card
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return fn


def _forest_version(text: str) -> str:
    doc = json.loads(text)
    doc["version"] = [9, 0, 0]
    return json.dumps(doc)


BAD_CARDS = [
    ("card-format", _card_edit(_set(["format_version"], 2)), "card.json", "format_version 2"),
    ("schema", _card_edit(_set(["feature_schema_version"], 7)), "card.json",
     "feature_schema_version 7"),
    ("card-json", _file_edit("card.json", lambda s: s[: len(s) // 2]), "card.json",
     "truncated or corrupt"),
    ("missing-file", _card_edit(_set(["forests", "norm", "file"], "gone.json")), "card.json",
     "'gone.json' is missing"),
    ("escape", _card_edit(_set(["forests", "norm", "file"], "../card.json")), "card.json",
     "relative path inside"),
    ("sha", _file_edit("forest_norm.json", lambda s: s.replace('"id":0', '"id": 0')),
     "forest_norm.json", "differs from the card's"),
    ("unknown-feature", _card_edit(_set(["forests", "norm", "features"], ["numel", "speed"])),
     "forest_norm.json", "feature \"speed\" is not a unit-model input"),
    ("feature-count", _card_edit(_set(["forests", "norm", "features"], ["numel"])),
     "forest_norm.json", "lists 1 features but the forest takes 2"),
    ("kind", _card_edit(lambda c: c["forests"].update(warp=c["forests"].pop("norm"))),
     "card.json", "'warp' is not a unit kind"),
    ("target", _card_edit(_set(["forests", "norm", "target"], "time_s")), "card.json",
     "target 'time_s' is not supported"),
    ("clip", _card_edit(_set(["forests", "norm", "clip"], [1.0, float("inf")])), "card.json",
     "must be a finite number"),
    ("scale-zero", _card_edit(_set(["forests", "norm", "scale"], 0.0)), "forest_norm.json",
     "scale 0.000000 is not in (0, 1]"),
    ("scale-big", _card_edit(_set(["forests", "norm", "scale"], 1.5)), "forest_norm.json",
     "scale 1.500000 is not in (0, 1]"),
    ("scale-type", _card_edit(_set(["forests", "norm", "scale"], "0.5")), "card.json",
     "forests.norm.scale must be a finite number"),
    ("ops-type", _card_edit(_set(["forests", "norm", "ops"], "aten::native_layer_norm")),
     "card.json", "'ops' must be a list of ATen op names"),
    ("ops-empty-name", _card_edit(_set(["forests", "norm", "ops"], [""])), "card.json",
     "'ops' must be a list of ATen op names"),
    ("generations-reversed", _card_edit(_set(["forests", "norm", "cc_major_range"], [8, 7])),
     "card.json", "'cc_major_range' must be [lo, hi]"),
    ("generations-float", _card_edit(_set(["forests", "norm", "cc_major_range"], [6.5, 8])),
     "card.json", "'cc_major_range' must be [lo, hi]"),
]


@pytest.mark.parametrize("case, edit, names, message", BAD_CARDS, ids=[b[0] for b in BAD_CARDS])
def test_bad_artifacts_are_clear_errors(case, edit, names, message, tmp_path, traces,
                                        monkeypatch):
    d = _good(tmp_path / "m")
    edit(d)
    monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
    with pytest.raises(ArtifactError) as err:
        predict_trace(traces[2], GPU)
    text = str(err.value)
    assert names in text and message in text, text
    assert "blink train" in text
    # and the analytic predictor still answers
    assert predict_trace(traces[2], GPU, predictor="analytic").time_ms > 0


def test_forest_of_another_xgboost_version(tmp_path, traces, monkeypatch):
    d = _good(tmp_path / "m")
    _file_edit("forest_norm.json", _forest_version)(d)
    _card_edit(lambda c: c["forests"]["norm"].pop("sha256"))(d)
    monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
    with pytest.raises(ArtifactError, match=r"forest_norm.json: not a usable XGBoost model: "
                                            r"written by XGBoost 9\.0\.0"):
        predict_trace(traces[2], GPU)


def test_bad_conformal_table(tmp_path, traces, monkeypatch):
    d = _good(tmp_path / "m")
    (d / "conformal.json").write_text(json.dumps({"format_version": 1, "coverage": 1.5,
                                                  "method": "m", "calibration": "c"}))
    monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
    with pytest.raises(ArtifactError, match=r"conformal.json: coverage 1.5 is not in \(0, 1\)"):
        predict_trace(traces[2], GPU)


def test_conv_forest_reads_every_tensor_core_mode_as_one(traces, tmp_path, monkeypatch):
    """A conv forest sees a unit's math as the `tensor_core` flag, not its dtype: the public
    conv rows are fp32 (CUDA cores) and fp16 (tensor cores) only, while bf16 and TF32
    convolutions run as tensor-core implicit GEMMs too. So a bf16 conv gets exactly the fp16
    conv's correction on the H200 (equal bf16 / fp16 peaks and bytes), and TF32 enters as a
    tensor-core unit. (The H200 is a generation the forest never saw, so the core is asked to
    extrapolate, as it does for a GNN.)"""
    from blink.cost import core_gpu_spec
    from blink.hardware import get_gpu

    feats = ["flops", "conv_c", "tensor_core", "gpu_mem_bw"]
    half = blink.trace_model("torchvision:resnet18", batch_size=8, dtype="fp16")
    parts = [_rows(half, "conv", feats)]
    for t in traces.values():  # fp32 on CUDA cores: TF32 off
        r = learned.trace_input_rows(t, GPU, allow_tf32_cudnn=False)
        conv = [i for i, k in enumerate(r["kind"]) if k == "conv"]
        parts.append(r["rows"][conv][:, [r["names"].index(f) for f in feats]])
    x = np.concatenate(parts)
    # a correction that differs between CUDA-core and tensor-core convs and with size
    y = np.where(x[:, 2] > 0.5, -0.2, 0.3) + 0.05 * np.log10(x[:, 0])
    booster = xgb.train({"max_depth": 3, "eta": 0.5, "nthread": 1}, xgb.DMatrix(x, y), 20)
    d = _write_models(tmp_path / "m", {"conv": (booster, feats, (-1.0, 1.0))})
    monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
    assert set(x[:, 2].tolist()) == {0.0, 1.0}
    um = learned.load_models(d).unit_models
    ratios = {}
    for dt in ("fp16", "bf16"):
        tr = blink.trace_model("torchvision:resnet18", batch_size=8, dtype=dt)
        c = tr.native().cost(core_gpu_spec(get_gpu("H200")), models=um,
                             extrapolate_forests=True)
        convs = [u for u in c["units"] if u[1] == "conv"]
        assert len(convs) == 20
        assert all(u[12] == "trees" and u[9] == f"{dt}_tc" for u in convs)
        ratios[dt] = [u[2] / u[13] for u in convs]
    assert ratios["bf16"] == pytest.approx(ratios["fp16"], rel=1e-9)
    t = blink.trace_model("torchvision:resnet18", batch_size=8)
    for tf32, want in ((True, 1.0), (False, 0.0)):
        r = learned.trace_input_rows(t, "H200", allow_tf32_cudnn=tf32)
        conv = np.array(r["kind"]) == "conv"
        col = r["rows"][conv, r["names"].index("tensor_core")]
        assert conv.sum() == 20 and set(col.tolist()) == {want}
