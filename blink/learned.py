"""The shipped predictor artifacts (models/): the card, the per-unit forests, the conformal table.

`blink train` writes models/card.json and the files it names; `blink.predict` reads them
through `load_models()`. Forests are XGBoost's native JSON evaluated by the C++ core
(blink._C.Forest); nothing here imports xgboost, and nothing is unpickled.

The input vector of a unit model is built by name (card.json lists each forest's features in
order): the numeric unit features of the C++ core (`blink._C.features_for`'s keys), then
`analytic_time_s`, then the GPU fields `gpu_*`. `input_names()` lists them all; training builds
its rows with `input_row()` (one features dict) or `Trace`-wide with `trace_input_rows()`, the
exact vectors predict feeds the forests.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._ext import load
from .collect.dataset import sha256_file
from .errors import ArtifactError

_C = load()

CARD_FORMAT_VERSION = 1     # models/card.json layout this reader knows
FEATURE_SCHEMA_VERSION = 1  # the unit-model input names (input_names()) this build computes
CONFORMAL_FORMAT_VERSION = 1
CARD_NAME = "card.json"
_MAX_JSON_BYTES = 64 << 20  # a card or conformal table is small; refuse anything huge

_REPO = Path(__file__).resolve().parent.parent


def models_dir() -> Path:
    """Where predictor artifacts live: $BLINK_MODELS_DIR, else <repo>/models."""
    env = os.environ.get("BLINK_MODELS_DIR")
    return Path(env) if env else _REPO / "models"


def input_names() -> list[str]:
    """Every name a unit model may take as an input, in the C++ core's order."""
    return list(_C.unit_model_input_names())


_KIND_CODES = {name: i for i, name in enumerate(_C.unit_kind_names())}
_MATH_CODES = {name: i for i, name in enumerate(_C.math_mode_names())}


def input_row(features: dict[str, Any], gpu: Any) -> dict[str, float]:
    """The unit-model inputs of one unit by name, from a `blink._C.features_for` /
    `blink.cost.unit_features` dict (which must carry `analytic_time_s`) and the target GPU
    (a hardware-table name or GPUSpec). Same values as the C++ core's vector: enums as their
    codes, bools as 0/1, a non-finite value as NaN (missing)."""
    from .cost import core_gpu_spec

    row: dict[str, float] = {}
    gpu_fields = _C.gpu_model_inputs(core_gpu_spec(gpu))
    for name in input_names():
        if name in gpu_fields:
            row[name] = float(gpu_fields[name])
            continue
        if name not in features:
            raise ArtifactError(f"input_row: the features dict has no {name!r} (pass the dict "
                                "blink._C.features_for returns)")
        v = features[name]
        if name == "kind" and isinstance(v, str):
            v = _KIND_CODES[v]
        elif name == "math_mode" and isinstance(v, str):
            v = _MATH_CODES[v]
        x = float(v)
        row[name] = x if math.isfinite(x) else math.nan  # missing, as the core's vector
    return row


def trace_input_rows(t: Any, gpu: Any, *, allow_tf32_matmul: bool = False,
                     allow_tf32_cudnn: bool = True) -> dict[str, Any]:
    """Every unit's input row of a Trace, computed in C++ exactly as predict does:
    {"op": [op ids], "kind": [kind names], "names": input_names(), "rows": float64 array
    (units x names); NaN rows for units whose features failed}."""
    from .cost import core_gpu_spec

    return t.native().unit_model_inputs(core_gpu_spec(gpu), allow_tf32_matmul, allow_tf32_cudnn)


# ---- the model-level correction's inputs (forest_model.json) ---------------------------------
# The unit kinds of a model summary, in the cache's column order (every other kind, such as
# optimizer, counts as "other").
MODEL_KINDS = ("gemm", "conv", "attention", "norm", "softmax", "reduction", "elementwise",
               "embedding", "copy", "other")
CORRECTION_FEATURES = (["log_analytic_ms", "log_roofline_ms", "log_host_ms", "gpu_bound",
                        "log_flops", "log_bytes", "log_params", "batch", "img_size",
                        "n_units"] + [f"share_{k}" for k in MODEL_KINDS] +
                       [f"eff_{k}" for k in ("gemm", "conv", "elementwise", "norm")])


def model_summary(p: Any) -> dict[str, Any]:
    """The whole-model fields of an analytic Prediction `p` (host time from the table) that the
    model-level correction reads: times, FLOPs, bytes and per-kind sums of its units. The timm
    cache (blink.train.timm_cache) stores exactly these per model; predict builds them the same
    way, so training and prediction see one definition."""
    out: dict[str, Any] = {
        "time_ms": p.time_ms, "host_ms": p.host_ms, "gpu_busy_ms": p.gpu_busy_ms,
        "n_units": len(p.units), "flops": sum(u.flops for u in p.units),
        "bytes": sum(u.bytes for u in p.units), "roofline_ms": sum(u.roofline_ms for u in p.units),
    }
    for k in MODEL_KINDS:
        out[f"t_{k}"] = 0.0
        out[f"r_{k}"] = 0.0
        out[f"n_{k}"] = 0
    for u in p.units:
        k = u.kind if u.kind in MODEL_KINDS else "other"
        out[f"t_{k}"] += u.time_ms
        out[f"r_{k}"] += u.roofline_ms
        out[f"n_{k}"] += 1
    return out


def _log(x: float) -> float:
    return math.log(x) if x > 0 else math.nan


def correction_features(r: dict[str, Any]) -> dict[str, float]:
    """CORRECTION_FEATURES of a model: its model_summary() plus "params", "batch" and
    "img_size" (the input's side; NaN for a model without an image input)."""
    busy = sum(r[f"t_{k}"] for k in MODEL_KINDS) or 1.0
    d = {"log_analytic_ms": _log(r["time_ms"]), "log_roofline_ms": _log(r["roofline_ms"]),
         "log_host_ms": _log(r["host_ms"]), "gpu_bound": float(r["gpu_busy_ms"] >= r["host_ms"]),
         "log_flops": _log(r["flops"]), "log_bytes": _log(r["bytes"]),
         "log_params": _log(r["params"]), "batch": float(r["batch"]),
         "img_size": float(r["img_size"]), "n_units": float(r["n_units"])}
    for k in MODEL_KINDS:
        d[f"share_{k}"] = r[f"t_{k}"] / busy
    for k in ("gemm", "conv", "elementwise", "norm"):
        # roofline / analytic of the kind: how far from its roofline the analytic model put it
        d[f"eff_{k}"] = r[f"r_{k}"] / r[f"t_{k}"] if r[f"t_{k}"] > 0 else math.nan
    return d


def image_side(input_shapes: Any) -> float:
    """The side of a model's image input (the first 4-D input's height), NaN without one."""
    for s in input_shapes or []:
        if isinstance(s, list | tuple) and len(s) == 4:
            return float(s[2])
    return math.nan


@dataclass(frozen=True)
class ForestEntry:
    kind: str
    path: Path
    features: list[str]
    clip: tuple[float, float]
    gpus: list[str]
    forest: Any  # blink._C.Forest
    scale: float = 1.0  # time = analytic * exp(clip(scale * forest))
    ops: list[str] = field(default_factory=list)  # the ops it corrects; empty: all of its kind
    # the compute-capability majors (GPU generations) it was fitted on; None: every generation
    cc_major_range: tuple[int, int] | None = None


@dataclass
class LearnedModels:
    """The artifacts of one models/ directory, validated and loaded."""

    directory: Path
    card: dict[str, Any]
    forests: dict[str, ForestEntry]
    unit_models: Any  # blink._C.UnitModels over `forests`
    conformal: dict[str, Any] | None = None
    conformal_path: Path | None = None
    gnn_path: Path | None = None
    gnn: Any = None  # blink._C.Gnn when gnn_path is set
    # The model-level correction blended with the GNN's time (card gnn.blend), where the GNN
    # applies: time = trees+gnn^w * correction^(1-w).
    model_forest: Any = None  # blink._C.Forest
    model_forest_path: Path | None = None
    model_clip: tuple[float, float] = (-3.0, 3.0)
    blend_weight: float = 1.0
    # The training-step correction (card model_level_train): time = analytic x correction, on
    # the GPUs and dtype of train_applies.
    train_forest: Any = None  # blink._C.Forest
    train_forest_path: Path | None = None
    train_clip: tuple[float, float] = (-3.0, 3.0)
    train_applies: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        kinds = ", ".join(sorted(self.forests)) or "none"
        return f"trees for {kinds} ({self.directory / CARD_NAME})"


def _fail(path: Path, why: str) -> ArtifactError:
    return ArtifactError(f"{path}: {why}. Retrain with `blink train`, or set BLINK_MODELS_DIR "
                         "to a directory of compatible artifacts (predict(..., "
                         "predictor='analytic') skips them).")


def _read_json(path: Path) -> Any:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise _fail(path, f"cannot read the file ({exc.strerror})") from exc
    if size > _MAX_JSON_BYTES:
        raise _fail(path, f"{size} bytes is larger than the {_MAX_JSON_BYTES}-byte limit")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, f"cannot read the file ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise _fail(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg} "
                          "(truncated or corrupt?)") from exc


def _artifact_path(directory: Path, card: Path, name: Any, what: str) -> Path:
    """A file the card names: a relative path inside the models directory, which must exist."""
    if not isinstance(name, str) or not name:
        raise _fail(card, f"{what}: 'file' must be a non-empty string")
    p = Path(name)
    if p.is_absolute() or ".." in p.parts:
        raise _fail(card, f"{what}: file {name!r} must be a relative path inside {directory}")
    full = directory / p
    if not full.is_file():
        raise _fail(card, f"{what}: file {name!r} is missing from {directory}")
    return full


def _check_sha256(card: Path, path: Path, want: Any, what: str) -> None:
    if want is None:
        return
    if not isinstance(want, str) or len(want) != 64:
        raise _fail(card, f"{what}: sha256 must be a 64-digit hex string")
    got = sha256_file(path)
    if got != want.lower():
        raise _fail(path, f"sha256 {got} differs from the card's {want} (the file was "
                          "changed or corrupted after training)")


def _number(card: Path, v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _fail(card, f"{what} must be a finite number, got {v!r}")
    return float(v)


def _load_conformal(card_path: Path, path: Path) -> dict[str, Any]:
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise _fail(path, "the conformal table must be a JSON object")
    if doc.get("format_version") != CONFORMAL_FORMAT_VERSION:
        raise _fail(path, f"format_version {doc.get('format_version')!r}; this blink reads "
                          f"version {CONFORMAL_FORMAT_VERSION}")
    cov = _number(path, doc.get("coverage"), "coverage")
    if not 0.0 < cov < 1.0:
        raise _fail(path, f"coverage {cov} is not in (0, 1)")
    for key in ("method", "calibration"):
        if not isinstance(doc.get(key), str):
            raise _fail(path, f"{key!r} must be a string naming the "
                              f"{'interval method' if key == 'method' else 'calibration data'}")
    entries: list[tuple[str, Any]] = []
    for key in ("model", "model_train"):
        if key in doc:
            entries.append((key, doc[key]))
    unit = doc.get("unit", {})
    if not isinstance(unit, dict):
        raise _fail(path, "'unit' must be an object of {kind: {q, n}}")
    entries += [(f"unit.{k}", v) for k, v in unit.items()]
    for key in ("model", "model_train"):
        by = doc.get(key, {}).get("by_predictor", {}) if isinstance(doc.get(key), dict) else {}
        if isinstance(by, dict):
            entries += [(f"{key}.by_predictor.{k}", v) for k, v in by.items()]
    for what, e in entries:
        if not isinstance(e, dict):
            raise _fail(path, f"{what} must be an object with q and n")
        for name in ("q", "q_other_gpu"):
            if name == "q" or name in e:
                q = _number(path, e.get(name), f"{what}.{name}")
                if q < 0:
                    raise _fail(path, f"{what}.{name} {q} is negative")
    return doc


_CACHE: dict[tuple[str, int, int], LearnedModels] = {}


def load_models(directory: str | os.PathLike[str] | None = None) -> LearnedModels | None:
    """The validated artifacts of `directory` (default models_dir()), or None when it has no
    card.json. Raises ArtifactError, naming the file, for a card or artifact that is corrupt,
    of another format / feature-schema version, or inconsistent. Cached per card file."""
    d = Path(directory) if directory is not None else models_dir()
    card_path = d / CARD_NAME
    try:
        st = card_path.stat()
    except OSError:
        return None
    key = (str(card_path.resolve()), st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    models = _load_uncached(d, card_path)
    _CACHE.clear()  # one directory in use at a time; do not grow without bound
    _CACHE[key] = models
    return models


def _load_uncached(d: Path, card_path: Path) -> LearnedModels:
    card = _read_json(card_path)
    if not isinstance(card, dict):
        raise _fail(card_path, "the card must be a JSON object")
    fv = card.get("format_version")
    if fv != CARD_FORMAT_VERSION:
        raise _fail(card_path, f"format_version {fv!r}; this blink reads card format "
                               f"{CARD_FORMAT_VERSION}")
    sv = card.get("feature_schema_version")
    if sv != FEATURE_SCHEMA_VERSION:
        raise _fail(card_path, f"feature_schema_version {sv!r}; this blink computes unit "
                               f"features of schema {FEATURE_SCHEMA_VERSION}")
    forests_doc = card.get("forests", {})
    if not isinstance(forests_doc, dict):
        raise _fail(card_path, "'forests' must be an object {unit kind: entry}")
    unit_models = _C.UnitModels()
    forests: dict[str, ForestEntry] = {}
    for kind, e in sorted(forests_doc.items()):
        what = f"forests.{kind}"
        if not isinstance(e, dict):
            raise _fail(card_path, f"{what} must be an object")
        if kind not in _KIND_CODES:
            raise _fail(card_path, f"{what}: {kind!r} is not a unit kind (one of "
                                   f"{', '.join(_KIND_CODES)})")
        if e.get("target") != "log_ratio":
            raise _fail(card_path, f"{what}: target {e.get('target')!r} is not supported (only "
                                   "'log_ratio': time = analytic_time_s * exp(p))")
        feats = e.get("features")
        if not isinstance(feats, list) or not all(isinstance(x, str) for x in feats):
            raise _fail(card_path, f"{what}: 'features' must be a list of input names")
        clip = e.get("clip", [-4.0, 4.0])
        if not isinstance(clip, list) or len(clip) != 2:
            raise _fail(card_path, f"{what}: 'clip' must be [lo, hi]")
        lo, hi = (_number(card_path, c, f"{what}.clip") for c in clip)
        scale = _number(card_path, e.get("scale", 1.0), f"{what}.scale")
        gpus = e.get("gpus", [])
        if not isinstance(gpus, list):
            raise _fail(card_path, f"{what}: 'gpus' must be a list of GPU names")
        ops = e.get("ops", [])
        if not isinstance(ops, list) or not all(isinstance(x, str) and x for x in ops):
            raise _fail(card_path, f"{what}: 'ops' must be a list of ATen op names (the ops "
                                   "the forest was fitted on)")
        gen = e.get("cc_major_range")
        if gen is not None and not (isinstance(gen, list) and len(gen) == 2
                                    and all(type(x) is int for x in gen)
                                    and 0 <= gen[0] <= gen[1] <= 99):
            raise _fail(card_path, f"{what}: 'cc_major_range' must be [lo, hi], the "
                                   "compute-capability majors the forest was fitted on "
                                   "(integers, 0 <= lo <= hi <= 99)")
        path = _artifact_path(d, card_path, e.get("file"), what)
        _check_sha256(card_path, path, e.get("sha256"), what)
        try:
            forest = _C.load_forest(str(path))
        except _C.Error as exc:  # already names the file and what is wrong
            raise ArtifactError(f"{exc}. Retrain with `blink train` (predict(..., "
                                "predictor='analytic') skips the models).") from exc
        try:
            unit_models.add(kind, forest, feats, lo, hi, scale, ops,
                            *(gen if gen is not None else (0, 99)))
        except _C.Error as exc:
            raise _fail(card_path, f"{what}: {exc}") from exc
        forests[kind] = ForestEntry(kind, path, list(feats), (lo, hi), [str(g) for g in gpus],
                                    forest, scale,
                                    sorted({_C.unit_model_op_key(o) for o in ops}),
                                    None if gen is None else (gen[0], gen[1]))
    models = LearnedModels(d, card, forests, unit_models)
    conf = card.get("conformal")
    conf_path: Path | None = None
    if conf is not None:
        if not isinstance(conf, dict):
            raise _fail(card_path, "'conformal' must be an object {file, sha256?}")
        conf_path = _artifact_path(d, card_path, conf.get("file"), "conformal")
        _check_sha256(card_path, conf_path, conf.get("sha256"), "conformal")
    elif (d / "conformal.json").is_file():
        conf_path = d / "conformal.json"
    if conf_path is not None:
        models.conformal = _load_conformal(card_path, conf_path)
        models.conformal_path = conf_path
    gnn = card.get("gnn")
    if gnn is not None:
        if not isinstance(gnn, dict):
            raise _fail(card_path, "'gnn' must be an object {file, sha256?}")
        models.gnn_path = _artifact_path(d, card_path, gnn.get("file"), "gnn")
        _check_sha256(card_path, models.gnn_path, gnn.get("sha256"), "gnn")
    elif (d / "gnn.safetensors").is_file():
        models.gnn_path = d / "gnn.safetensors"
    if models.gnn_path is not None:
        try:
            models.gnn = _C.load_gnn(str(models.gnn_path))
        except _C.Error as exc:  # names the file and what is wrong
            raise ArtifactError(f"{exc}. Retrain with `blink train` (predict(..., "
                                "predictor='analytic') skips the models).") from exc
    blend = (gnn or {}).get("blend") if models.gnn is not None else None
    if blend is not None:
        _load_blend(models, d, card_path, card, blend)
    if card.get("model_level_train") is not None:
        _load_train_level(models, d, card_path, card["model_level_train"])
    return models


def _load_blend(models: LearnedModels, d: Path, card_path: Path, card: dict[str, Any],
                blend: Any) -> None:
    if not isinstance(blend, dict):
        raise _fail(card_path, "gnn.blend must be an object {weight_gnn, model_level}")
    w = _number(card_path, blend.get("weight_gnn"), "gnn.blend.weight_gnn")
    if not 0.0 <= w <= 1.0:
        raise _fail(card_path, f"gnn.blend.weight_gnn {w} is not in [0, 1]")
    ml = card.get("model_level")
    if not isinstance(ml, dict):
        raise _fail(card_path, "gnn.blend needs the 'model_level' entry it blends with")
    models.model_forest, models.model_forest_path, models.model_clip = _load_model_forest(
        d, card_path, ml, "model_level")
    models.blend_weight = w


def _load_model_forest(d: Path, card_path: Path, ml: dict[str, Any],
                       what: str) -> tuple[Any, Path, tuple[float, float]]:
    """(forest, path, clip) of a model-level correction entry of the card (model_level,
    model_level_train), checked against the inputs this blink computes."""
    if ml.get("features") != CORRECTION_FEATURES:
        raise _fail(card_path, f"{what}.features differ from the inputs this blink computes "
                               "(blink.learned.CORRECTION_FEATURES)")
    clip = ml.get("clip", [-3.0, 3.0])
    if not isinstance(clip, list) or len(clip) != 2:
        raise _fail(card_path, f"{what}: 'clip' must be [lo, hi]")
    path = _artifact_path(d, card_path, ml.get("file"), what)
    _check_sha256(card_path, path, ml.get("sha256"), what)
    try:
        forest = _C.load_forest(str(path))
    except _C.Error as exc:
        raise ArtifactError(f"{exc}. Retrain with `blink train` (predict(..., "
                            "predictor='analytic') skips the models).") from exc
    if forest.num_features != len(CORRECTION_FEATURES):
        raise _fail(path, f"{forest.num_features} inputs; the model-level correction takes "
                          f"{len(CORRECTION_FEATURES)}")
    return forest, path, (_number(card_path, clip[0], f"{what}.clip"),
                          _number(card_path, clip[1], f"{what}.clip"))


def _load_train_level(models: LearnedModels, d: Path, card_path: Path, e: Any) -> None:
    if not isinstance(e, dict):
        raise _fail(card_path, "'model_level_train' must be an object {file, features, ...}")
    a = e.get("applies_to")
    if not (isinstance(a, dict) and isinstance(a.get("gpus"), list)
            and all(isinstance(g, str) for g in a["gpus"]) and isinstance(a.get("dtype"), str)):
        raise _fail(card_path, "model_level_train.applies_to must say its 'gpus' (a list of "
                               "names) and 'dtype'")
    models.train_forest, models.train_forest_path, models.train_clip = _load_model_forest(
        d, card_path, e, "model_level_train")
    models.train_applies = {"gpus": list(a["gpus"]), "dtype": a["dtype"],
                            "optimizer": str(a.get("optimizer") or "")}


def blend_ms(gnn_ms: Any, corr_ms: Any, weight_gnn: float) -> Any:
    """The shipped end-to-end blend (card gnn.blend): gnn_ms^w x corr_ms^(1 - w), for numbers
    or numpy arrays (training and evaluation blend out-of-fold vectors with it)."""
    import numpy as np

    return np.exp(weight_gnn * np.log(gnn_ms) + (1.0 - weight_gnn) * np.log(corr_ms))


def model_correction_ms(models: LearnedModels, summary: dict[str, Any],
                        mode: str = "inference") -> float:
    """The model-level correction's time for a model: analytic time_ms x exp(clipped forest
    output) on correction_features(summary); the training-step correction for mode "train"."""
    import numpy as np

    f = correction_features(summary)
    x = np.array([[f[k] for k in CORRECTION_FEATURES]], dtype=np.float64)
    forest, (lo, hi) = ((models.train_forest, models.train_clip) if mode == "train"
                        else (models.model_forest, models.model_clip))
    margin = float(forest.predict(x, True)[0])
    return float(summary["time_ms"]) * math.exp(min(hi, max(lo, margin)))


def conformal_interval(models: LearnedModels, time_ms: float, predictor: str = "analytic",
                       mode: str = "inference",
                       gpu: str | None = None) -> tuple[float, float, str] | None:
    """(lower_ms, upper_ms, method) of the end-to-end time from the conformal table's model-level
    quantile for `predictor` (what produced time_ms: "analytic", "trees", "trees+gnn", ...), or
    None without one: time * exp(-q) .. time * exp(q). A predictor the table has no entry for
    takes the top-level (analytic) entry, and the method says which predictor that was for.
    Training steps (mode "train") use the table's training-step entry ("model_train") where
    it has one, as their residuals are not inference's. On a `gpu` outside the entry's
    calibration GPUs (other_gpu.calibrated_on) q is the entry's q_other_gpu where it has one:
    widened by the per-unit data's board-level spread (blink.train.pipeline.chip_level_offsets)."""
    c = models.conformal
    if c is None or not isinstance(c.get("model"), dict):
        return None
    e = c["model"]
    if mode == "train" and isinstance(c.get("model_train"), dict):
        e = c["model_train"]
    other = e.get("other_gpu") if isinstance(e.get("other_gpu"), dict) else None
    by = e.get("by_predictor")
    if isinstance(by, dict) and isinstance(by.get(predictor), dict):
        e = by[predictor]
    q = float(e["q"])
    n = e.get("n")
    of = e.get("predictor")
    cal = e.get("calibration", c["calibration"])
    widened = ""
    if (gpu is not None and other is not None and "q_other_gpu" in e
            and gpu not in other.get("calibrated_on", [])):
        q = float(e["q_other_gpu"])
        widened = (f"; widened for {gpu}, a GPU outside that calibration "
                   f"({', '.join(other.get('calibrated_on', []))}), by the board-level spread "
                   f"of the per-unit data ({len(other.get('chip_offsets', {}))} GPU chips)")
    method = (f"{c['method']}: {100 * float(c['coverage']):.0f}% nominal coverage"
              f"{'' if not of else f' for the {of} time'}, calibrated on {cal}"
              f"{'' if n is None else f' (n={n})'}{widened} [{models.conformal_path}]")
    return time_ms * math.exp(-q), time_ms * math.exp(q), method


def gnn_skip_reason(models: LearnedModels, gpu: str, mode: str,
                    dtype: str | None = None) -> str | None:
    """Why the loaded GNN does not apply on `gpu` in `mode` and `dtype`, or None when it does:
    it corrects only what its card's applies_to covers (the GPUs, modes and precision it was
    trained on), as the end-to-end effects it learned are the training GPU's."""
    a = (models.card.get("gnn") or {}).get("applies_to")
    if not isinstance(a, dict):
        return None
    gpus, modes, want = a.get("gpus"), a.get("modes"), a.get("dtype")
    if isinstance(gpus, list) and gpus and gpu not in gpus:
        return f"it was trained on {', '.join(map(str, gpus))} only"
    if isinstance(modes, list) and modes and mode not in modes:
        return f"it was trained on {', '.join(map(str, modes))} steps only"
    if dtype is not None and isinstance(want, str) and want and dtype != want:
        return f"it was trained on {want} steps only"
    return None


def train_correction_skip_reason(models: LearnedModels, gpu: str, dtype: str) -> str | None:
    """Why the training-step correction does not apply to a training step on `gpu` in `dtype`
    (None when it does): it learned one GPU's whole steps in one precision."""
    a = models.train_applies
    if a.get("gpus") and gpu not in a["gpus"]:
        return f"it was trained on {', '.join(a['gpus'])} steps only"
    if a.get("dtype") and dtype != a["dtype"]:
        return f"it was trained on {a['dtype']} steps only"
    return None


def unit_quantile(models: LearnedModels, kind: str) -> float | None:
    """The conformal table's per-unit quantile q for `kind` (interval t*exp(-q) .. t*exp(q))."""
    c = models.conformal
    if c is None:
        return None
    e = c.get("unit", {}).get(kind)
    return None if e is None else float(e["q"])
