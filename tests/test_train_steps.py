"""Whole training steps: the timm training-step cache (real timm models traced as SGD steps),
the training-step correction's held-out-family accuracy and intervals, and predict's use of the
shipped models/forest_model_train.json only where it was trained."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from blink import learned
from blink.errors import ArtifactError
from blink.train import model_level as ML
from blink.train import timm_cache
from blink.train.data import public_root
from blink.train.fit import group_folds

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
TRAIN_CACHE = timm_cache.default_cache_path("train")

needs_cache = pytest.mark.skipif(not TRAIN_CACHE.is_file(),
                                 reason="no timm training-step cache in data/derived")


def _card() -> dict:
    return json.loads((MODELS / "card.json").read_text())


shipped = pytest.mark.skipif(
    not (MODELS / "card.json").is_file() or "model_level_train" not in _card(),
    reason="models/ ships no training-step correction")


@pytest.fixture(autouse=True)
def _fresh_cache():
    learned._CACHE.clear()
    yield
    learned._CACHE.clear()


@pytest.fixture(scope="module")
def steps() -> ML.ModelTable:
    return ML.table(timm_cache.load_cache(mode="train"))


def _analytic(t):
    import blink

    # the cache's settings: timm's benchmark.py (cudnn.benchmark, TF32 on), table host time
    return blink.predict_trace(t, "RTX3090", allow_tf32_matmul=True, allow_tf32_cudnn=True,
                               cudnn_benchmark=True, host_time="table", predictor="analytic")


@needs_cache
def test_training_cache_rows_are_traced_sgd_steps(steps):
    """A cached training row is blink's analytic prediction of the benchmark's step: re-tracing
    the same model as a training step gives the same features, and a training step costs
    clearly more than the same model's inference step (backward and SGD are in the trace)."""
    rows = [r for r in timm_cache.load_cache(mode="train")
            if r["model"] in ("resnet18", "resnet26", "resnet34", "resnet50")]
    assert rows, "no small ResNet in the training-step cache"
    r = rows[0]
    t, params = timm_cache.build_model(r["model"], int(r["batch"]), int(r["img_size"]),
                                       mode="train")
    assert t.meta["mode"] == "train" and t.meta["params"] == params
    a = _analytic(t)
    live = {**learned.model_summary(a), "params": params, "batch": t.meta["batch_size"],
            "img_size": learned.image_side(t.meta["input_shapes"])}
    want, got = learned.correction_features(r), learned.correction_features(live)
    for k in ML.CORRECTION_FEATURES:
        assert got[k] == pytest.approx(want[k], rel=1e-4, nan_ok=True), k
    inf, _ = timm_cache.build_model(r["model"], int(r["batch"]), int(r["img_size"]))
    assert a.time_ms > 2.0 * _analytic(inf).time_ms
    # measured times are the training file's, not the inference file's
    path = public_root() / "timm-rtx3090" / timm_cache.MODES["train"].file
    src = {x["model"]: x for x in timm_cache.read_benchmark(path)}
    assert r["measured_ms"] == pytest.approx(float(src[r["model"]]["train_step_time"]))
    assert len(steps) > 400


def test_training_steps_trace_attention_as_torch_1_12_ran_it():
    """The training file was measured on torch 1.12, which has no scaled_dot_product_attention:
    its timm computed attention as q @ k^T, softmax, @ v, so the training cache traces that path
    (bmm and softmax, forward and backward) while the torch 2.4 inference file keeps the fused
    kernel; timm's global switch is left as the caller had it."""
    import timm.layers

    before = timm.layers.use_fused_attn()
    train, _ = timm_cache.build_model("deit_tiny_patch16_224", 2, 224, mode="train")
    assert timm.layers.use_fused_attn() == before
    ops = train.op_counts()
    assert not [k for k in ops if "scaled_dot_product" in k]
    assert ops["aten::bmm"] >= 4 * 12 and ops["aten::_softmax_backward_data"] == 12
    infer, _ = timm_cache.build_model("deit_tiny_patch16_224", 2, 224)
    assert infer.op_counts()["aten::scaled_dot_product_attention"] == 12
    assert "aten::_softmax" not in infer.op_counts()


def test_training_steps_scale_attention_scores_as_2022_timm_did(monkeypatch):
    """2022's timm scaled the attention scores after q @ k^T, today's scales q first: the
    training cache traces the former, one multiply of each block's scores in the forward,
    with as many multiplies in all as today's path (traced with the switch off)."""

    def score_muls(name: str, img: int) -> tuple[int, int]:
        t, _ = timm_cache.build_model(name, 2, img, mode="train")
        made_by: dict[int, set[str]] = {}  # storage -> the ops whose outputs view it
        for op in t.ops:
            for out in op.outputs:
                if hasattr(out, "storage"):
                    made_by.setdefault(out.storage, set()).add(op.name)
        muls = [op for op in t.ops if op.name == "aten::mul" and op.overload == "Tensor"
                and op.phase == "forward"]
        scores = [op for op in muls if "aten::bmm" in made_by.get(op.inputs[0].storage, ())]
        return len(muls), len(scores)

    today = dataclasses.replace(timm_cache.MODES["train"], timm_2022_attention_scale=False)
    # (model, image, attention blocks): DeiT's timm.layers.Attention, Twins' LSA + GSA
    for name, img, blocks in (("deit_tiny_patch16_224", 224, 12),
                              ("twins_svt_small", 224, 2 + 2 + 10 + 4)):
        total, scores = score_muls(name, img)
        assert scores == blocks
        with monkeypatch.context() as m:
            m.setitem(timm_cache.MODES, "train", today)
            assert score_muls(name, img) == (total, 0)


def test_2022_attention_scaling_keeps_the_math_and_no_mode_after_a_failed_forward():
    """The reordered multiply gives today's values on real tensors, and a forward that raises
    leaves no TorchFunctionMode behind (the cache goes on to the next model)."""
    import torch
    from timm.layers import Attention

    torch.manual_seed(0)
    attn = Attention(64, num_heads=4)
    attn.fused_attn = False
    x = torch.randn(2, 5, 64)
    today = attn(x)
    timm_cache._timm_2022_attention_scale(attn)
    torch.testing.assert_close(attn(x), today)
    with pytest.raises(RuntimeError), pytest.warns(UserWarning):
        attn(torch.randn(2, 5, 63))  # the qkv projection refuses 63 features
    assert torch._C._len_torch_function_stack() == 0
    torch.testing.assert_close(attn(x), today)


def test_inference_rows_trace_timm_norms_in_the_autocast_dtype_as_measured():
    """The 2024 inference files were measured with timm's fast norm (its GroupNormAct /
    LayerNorm run in fp16 under AMP), the 2022 training file with torch's fp32 force-cast
    (blink/train/timm_cache.py _Source.fast_norm): the inference trace of a GroupNorm ResNet
    has no float32 group norm and none of the casts around it, the training trace has both;
    timm's global switch is left as the caller had it."""
    from timm.layers import fast_norm

    before = fast_norm.is_fast_norm()
    infer, _ = timm_cache.build_model("resnetv2_50d_gn", 2, 64)
    train, _ = timm_cache.build_model("resnetv2_50d_gn", 2, 64, mode="train")
    assert fast_norm.is_fast_norm() == before

    def norm_dtypes(t: object) -> set:
        return {str(op.tensors("inputs")[0].dtype) for op in t.ops
                if op.name == "aten::native_group_norm"}

    assert norm_dtypes(infer) == {"float16"}
    assert norm_dtypes(train) == {"float32"}
    casts = [op for op in train.ops if op.name == "aten::_to_copy" and op.phase == "forward"]
    assert len(casts) > len([op for op in infer.ops if op.name == "aten::_to_copy"])


@needs_cache
def test_training_step_correction_beats_analytic_on_held_out_families(steps):
    """Fitted on four folds of families, predicting the fifth: the correction's MAPE is below
    the analytic model's, and its split-conformal interval (q from the training folds' own
    out-of-fold residuals) covers 90% +- 3 points of the held-out families' steps."""
    folds = group_folds(steps.family, 5)
    pred = np.full(len(steps), math.nan)
    q = np.full(len(steps), math.nan)
    for test in folds:
        pred[test] = ML.fit_predict(steps, "correction", ~test, test)
        q[test] = ML.conformal_oof(steps, "correction", ~test, 0.9, k=4)
    meas = steps.measured_ms
    ape = np.abs(pred / meas - 1)
    assert ape.mean() < np.abs(steps.analytic_ms / meas - 1).mean()
    inside = np.abs(np.log(meas / pred)) <= q
    assert abs(inside.mean() - 0.9) <= 0.03


@shipped
def test_predict_applies_the_training_step_correction_only_where_it_was_trained():
    """An AMP training step on the RTX 3090 gets the shipped correction: the analytic time times
    exp(margin), the margin as xgboost itself evaluates forest_model_train.json on the features
    the training table builds; other GPUs, precisions and inference steps do not."""
    import blink

    xgb = pytest.importorskip("xgboost")
    card = _card()
    e = card["model_level_train"]
    assert e["applies_to"] == {**e["applies_to"], "gpus": ["RTX3090"], "dtype": "amp-fp16",
                               "mode": "train"}
    t = blink.trace_model("timm:resnet18", batch_size=32, dtype="amp-fp16", mode="train",
                          optimizer="sgd")
    p = blink.predict_trace(t, "RTX3090")
    assert p.predictor == "model"
    a = blink.predict_trace(t, "RTX3090", predictor="analytic", host_time="table")
    row = {**learned.model_summary(a), "params": t.meta["params"], "batch": 32, "img_size": 224}
    x = np.array([[learned.correction_features(row)[k] for k in ML.CORRECTION_FEATURES]])
    booster = xgb.Booster(model_file=str(MODELS / e["file"]))
    margin = booster.predict(xgb.DMatrix(x, missing=math.nan,
                                         feature_names=list(ML.CORRECTION_FEATURES)))[0]
    want = a.time_ms * math.exp(float(np.clip(margin, *e["clip"])))
    assert p.time_ms == pytest.approx(want, rel=1e-5)
    assert p.lower_ms < p.time_ms < p.upper_ms
    assert "training-step correction" in p.interval_method
    assert any("training-step correction" in n for n in p.notes)
    # the breakdown still splits the corrected end-to-end time exactly
    assert sum(r.wall_ms for r in p.breakdown("kind")) == pytest.approx(p.time_ms, rel=1e-9)
    for gpu, dtype, why in (("H100-SXM", "amp-fp16", "RTX3090"), ("RTX3090", "fp32", "amp-fp16")):
        tt = t if dtype == "amp-fp16" else blink.trace_model(
            "timm:resnet18", batch_size=32, dtype=dtype, mode="train", optimizer="sgd")
        q = blink.predict_trace(tt, gpu)
        assert q.predictor != "model"
        assert any("training-step correction" in n and "not applied" in n and why in n
                   for n in q.notes), q.notes
    inf = blink.trace_model("timm:resnet18", batch_size=32, dtype="amp-fp16")
    assert "training-step" not in " ".join(blink.predict_trace(inf, "RTX3090").notes)
    # it learned SGD steps: an AdamW step gets it too, with a note saying so
    assert not any("extrapolation" in n for n in p.notes)
    adam = blink.trace_model("timm:resnet18", batch_size=32, dtype="amp-fp16", mode="train",
                             optimizer="adamw")
    pa = blink.predict_trace(adam, "RTX3090")
    assert pa.predictor == "model"
    assert any("learned sgd steps" in n and "adamw" in n for n in pa.notes), pa.notes


@shipped
def test_trees_predictor_keeps_the_unit_forests_and_drops_end_to_end_models():
    """predictor="trees" is the per-unit estimate: the same unit times as "auto", and the end
    to end time is their timeline's, without the training-step correction (or the GNN). A
    ConvNeXt: its layer norms are units the layer-norm forest (sm_6x-8x) times on the RTX 3090;
    a ResNet's convolutions would stay analytic there (the conv forest is sm_6x-7x)."""
    import blink

    t = blink.trace_model("timm:convnext_atto", batch_size=32, dtype="amp-fp16", mode="train",
                          optimizer="sgd")
    auto = blink.predict_trace(t, "RTX3090")
    trees = blink.predict_trace(t, "RTX3090", predictor="trees")
    assert auto.predictor == "model" and trees.predictor == "trees"
    assert [u.time_ms for u in trees.units] == [u.time_ms for u in auto.units]
    assert {u.source for u in trees.units} >= {"trees", "analytic"}
    assert trees.time_ms != auto.time_ms
    # a timeline's end to end time: no shorter than its host or its GPU work
    assert max(trees.host_ms, trees.gpu_busy_ms) <= trees.time_ms * (1 + 1e-9)
    assert not any("training-step correction" in n for n in trees.notes)
    inf = blink.trace_model("timm:resnet18", batch_size=8, dtype="amp-fp16")
    assert "gnn" not in blink.predict_trace(inf, "RTX3090", predictor="trees").predictor


@shipped
def test_training_step_correction_artifact_errors(tmp_path, monkeypatch):
    """A training-step entry whose features are not this blink's inputs, or whose file was
    changed after training, is a clear error naming the file; the analytic predictor answers."""
    import blink

    t = blink.trace_model("timm:resnet18", batch_size=4, dtype="amp-fp16", mode="train")
    for edit, message in (
        (lambda c: c["model_level_train"].update(features=["log_flops"]),
         "model_level_train.features differ"),
        (lambda c: c["model_level_train"].update(sha256="0" * 64), "differs from the card's"),
        (lambda c: c["model_level_train"].update(applies_to={"gpus": "RTX3090"}),
         "model_level_train.applies_to"),
    ):
        d = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        shutil.copytree(MODELS, d)
        card = json.loads((d / "card.json").read_text())
        edit(card)
        (d / "card.json").write_text(json.dumps(card))
        monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
        learned._CACHE.clear()
        with pytest.raises(ArtifactError, match=message) as err:
            blink.predict_trace(t, "RTX3090")
        assert "blink train" in str(err.value)
        assert blink.predict_trace(t, "RTX3090", predictor="analytic").time_ms > 0
