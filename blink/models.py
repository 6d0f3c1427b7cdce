"""Any model, by name: the resolver behind every place Blink accepts a model as a string.

    torchvision:<name>          any torchvision.models builder but detection (classification,
                                video, segmentation, optical flow)
    timm:<name>                 any timm model (timm.list_models()); input size from its cfg
    hf:<shipped>                a config shipped in blink/zoo_configs (hf:llama-7b, ...)
    hf:path/to/config.json      a transformers config file (model_type required; the head
                                from "_task" or "architectures")
    path/to/model.py:build      a Python file and a callable in it that returns an nn.Module.
                                This RUNS YOUR OWN CODE (the file is imported, the callable is
                                called under `torch.device("meta")`); give its inputs with
                                input_shape= / inputs= (CLI: --input-shape 3,224,224 -b 16).

Every model is built at random init on the meta device; nothing is downloaded. An nn.Module
passed directly gets its inputs inferred by `infer_inputs` where it says its input size (timm's
pretrained_cfg / default_cfg, a transformers config) and an error saying what to pass otherwise.
"""
from __future__ import annotations

import difflib
import importlib.util
import inspect
import json
import os
import re
import sys
from functools import cache
from typing import Any

import torch

from .errors import ConfigError, UnknownModelError
from .zoo import AUDIO, CUSTOM, SEQ2SEQ, TEXT, VIDEO, VISION, ZOO, ZooEntry, build_hf

PREFIXES = ("torchvision:", "timm:", "hf:")


def _family(name: str) -> str:
    m = re.match(r"[a-z]+", name.lower())
    return m.group(0) if m else name


def _unknown(name: str, candidates: list[str], what: str, extra: str = "",
             noun: str = "model", list_zoo: bool = True) -> UnknownModelError:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    zoo = "" if noun != "model" or not list_zoo else f" Zoo names: {', '.join(sorted(ZOO))}."
    return UnknownModelError(f"unknown {noun} {name!r} ({what}).{hint}{extra}{zoo}")


# -- torchvision ------------------------------------------------------------------------------

def _image_inputs(builder_sig: inspect.Signature) -> tuple[str, ...]:
    """The names of the image inputs of the model a torchvision builder (of this signature)
    returns: the required parameters of its class's forward (x; LRASPP: input; RAFT: image1,
    image2)."""
    cls = builder_sig.return_annotation
    forward = getattr(cls, "forward", None)
    if not isinstance(cls, type) or forward is None:
        return ("x",)
    names = tuple(p.name for p in list(inspect.signature(forward).parameters.values())[1:]
                  if p.default is inspect.Parameter.empty
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return names or ("x",)


@cache
def _torchvision_entry(fn: str) -> ZooEntry:
    import torchvision

    names = torchvision.models.list_models()
    if fn not in names:
        raise _unknown(f"torchvision:{fn}", [f"torchvision:{n}" for n in names],
                       "no such torchvision model",
                       " `torchvision.models.list_models()` lists them.")
    builder = torchvision.models.get_model_builder(fn)
    module, sig = builder.__module__, inspect.signature(builder)
    if module.startswith("torchvision.models.detection"):
        raise ConfigError(
            f"torchvision:{fn} is a detection model: its forward ends in box post-processing "
            "(score thresholds, NMS) whose output sizes depend on tensor values, which Blink's "
            "meta-device dry run does not have, and in training it needs box targets. Blink "
            "cannot predict it whole; predict its backbone (e.g. torchvision:resnet50) or pass "
            "your own module that stops before the post-processing "
            "(blink.predict(module, input_shape=...)).")
    segmentation = module.startswith("torchvision.models.segmentation")
    video = set(torchvision.models.list_models(module=torchvision.models.video))
    size = 112 if fn in video else 224
    try:  # the crop size the model's weights were trained at (inception_v3: 299); no download
        weights = torchvision.models.get_model_weights(fn).DEFAULT
        # Segmentation presets resize without a crop (SemanticSegmentation(resize_size=520)).
        crop = weights.transforms.keywords.get("resize_size" if segmentation else "crop_size")
        if isinstance(crop, (list, tuple)):
            crop = crop[0]
        if isinstance(crop, int) and crop > 0:
            size = crop
    except (ValueError, AttributeError, KeyError, TypeError):
        pass

    # weights_backbone defaults to ImageNet weights in the segmentation builders: None, or
    # building the model would download them.
    kwargs: dict[str, Any] = {"weights": None}
    if "weights_backbone" in sig.parameters:
        kwargs["weights_backbone"] = None

    def build() -> torch.nn.Module:
        return torchvision.models.get_model(fn, **kwargs)

    if module == "torchvision.models.vision_transformer":
        # A VisionTransformer's positional embedding fixes its input side, and weights=None
        # builds it at the builder's default, not at the DEFAULT weights' crop (vit_h_14's
        # SWAG weights: 518).
        with torch.device("meta"):
            size = int(build().image_size)
    return ZooEntry(f"torchvision:{fn}", _family(fn), VIDEO if fn in video else VISION, build,
                    image_size=size, image_inputs=_image_inputs(sig))


# -- timm ---------------------------------------------------------------------------------------

def _timm_size(cfg: Any) -> int:
    size = cfg.get("input_size") if isinstance(cfg, dict) else getattr(cfg, "input_size", None)
    if isinstance(size, (list, tuple)) and len(size) == 3 and int(size[1]) > 0:
        return int(size[1])
    return 224


@cache
def _timm_entry(name: str) -> ZooEntry:
    import timm

    if not timm.is_model(name):
        raise _unknown(f"timm:{name}", [f"timm:{n}" for n in timm.list_models()],
                       "no such timm model",
                       " `timm.list_models('pattern*')` lists them.")
    try:
        size = _timm_size(timm.models.get_pretrained_cfg(name))
    except (RuntimeError, ValueError, AttributeError, KeyError):
        size = 224

    def build() -> torch.nn.Module:
        return timm.create_model(name, pretrained=False)

    return ZooEntry(f"timm:{name}", _family(name), VISION, build, image_size=size)


# -- transformers config files ------------------------------------------------------------------

_ARCH_TASK = (("ForCausalLM", "causal-lm"), ("ForMaskedLM", "masked-lm"),
              ("ForConditionalGeneration", "seq2seq"), ("ForSeq2SeqLM", "seq2seq"),
              ("ForImageClassification", "image-classification"),
              ("ForSequenceClassification", "sequence-classification"))


def _config_defaults(raw: dict[str, Any]) -> Any:
    """The config class of the model type, at its defaults (None for a type transformers does
    not know or cannot build: build_hf reports it)."""
    import transformers

    try:
        return transformers.CONFIG_MAPPING[raw["model_type"]]()
    except Exception:  # noqa: BLE001 - unknown or unbuildable
        return None


def _hf_model_class_facts(defaults: Any, task: str) -> tuple[str, bool]:
    """(the model class's main_input_name, whether the class the task builds is the task's own
    head) for a config class ("", True when unknown)."""
    import transformers

    from .zoo import hf_auto_class

    if defaults is None:
        return "", True
    try:
        auto = hf_auto_class(task, type(defaults))
        main = str(getattr(auto._model_mapping[type(defaults)], "main_input_name", ""))
    except Exception:  # noqa: BLE001 - unknown or unbuildable: build_hf says why
        return "", True
    return main, auto is not transformers.AutoModel or task == "base"


def hf_entry_from_config(raw: dict[str, Any], name: str) -> ZooEntry:
    """A zoo entry for a transformers config dict (what a config.json holds)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise ConfigError(f"{name}: a transformers config needs a \"model_type\" field "
                          "(e.g. \"llama\", \"bert\", \"vit\")")
    raw = dict(raw)
    defaults = _config_defaults(raw)
    # is_encoder_decoder as the file says, else the type's default (a T5 / Switch Transformers
    # config written by hand)
    enc_dec = bool(raw.get("is_encoder_decoder", getattr(defaults, "is_encoder_decoder", False)))
    task = raw.get("_task")
    if task is None:
        archs = raw.get("architectures") or []
        for suffix, t in _ARCH_TASK:
            if any(isinstance(a, str) and a.endswith(suffix) for a in archs):
                task = t
                break
    if task is None and _hf_model_class_facts(defaults, "base")[0] == "pixel_values":
        # a vision type (DINOv2, SegFormer, DETR: encoder-decoder, yet it reads images): its
        # classifier where it has one, else the base model
        task = "image-classification" if _hf_model_class_facts(
            defaults, "image-classification")[1] else "base"
    if task is None:
        task = "seq2seq" if enc_dec else (
            "image-classification" if "image_size" in raw and "num_channels" in raw else "base")
    from .zoo import HF_TASKS

    if task not in HF_TASKS:
        raise ConfigError(f"{name}: unknown \"_task\" {task!r}; choose one of {HF_TASKS}")
    raw["_task"] = task
    raw.pop("architectures", None)
    main, head = _hf_model_class_facts(defaults, task)
    if task == "image-classification" or main == "pixel_values" or (
            "image_size" in raw and "vocab_size" not in raw):
        size = raw.get("image_size", getattr(defaults, "image_size", None) or 224)
        size = size[0] if isinstance(size, (list, tuple)) else size
        # a backbone with no classifier (ViT-MAE, a SigLIP vision tower, DETR) takes no labels
        labels = head and task == "image-classification"
        return ZooEntry(name, raw["model_type"], VISION, lambda: build_hf(raw),
                        image_size=int(size), num_classes=1000 if labels else 0)
    if main == "input_values":  # wav2vec2, HuBERT, WavLM, Data2Vec-audio ...
        return ZooEntry(name, raw["model_type"], AUDIO, lambda: build_hf(raw),
                        audio_input=main)
    if main == "input_features":
        if raw["model_type"] != "whisper":
            raise ConfigError(
                f"{name}: a {raw['model_type']!r} model takes input_features whose layout "
                "Blink does not build; build the model with transformers (on the meta device) "
                "and predict it with inputs=")
        get = lambda k: raw.get(k, getattr(defaults, k))  # noqa: E731
        # WhisperEncoder: two convolutions, the second of stride 2, over exactly
        # 2 * max_source_positions frames (30 s of audio)
        return ZooEntry(name, raw["model_type"], AUDIO, lambda: build_hf(raw),
                        vocab_size=int(get("vocab_size")), audio_input=main,
                        audio_shape=(int(get("num_mel_bins")),
                                     2 * int(get("max_source_positions"))),
                        decoder=True, max_seq_len=int(get("max_target_positions")))
    vocab = int(raw.get("vocab_size") or getattr(defaults, "vocab_size", 0) or 0)
    towers = sorted(k for k, v in raw.items() if k.endswith("_config") and isinstance(v, dict))
    if vocab <= 0 and towers:
        raise ConfigError(
            f"{name}: a {raw['model_type']!r} model joins several towers ({', '.join(towers)}); "
            "Blink makes the inputs of text, vision and speech models only: build the model "
            "with transformers (on the meta device) and predict it with inputs= (for CLIP-like "
            "models input_ids and pixel_values)")
    if vocab <= 0:
        raise ConfigError(f"{name}: a text model's config needs \"vocab_size\"")
    rope = "rope_theta" in raw or "rope_scaling" in raw or "rotary_dim" in raw
    limit = 0 if rope else int(raw.get("max_position_embeddings") or raw.get("n_positions") or 0)
    kind = SEQ2SEQ if task == "seq2seq" or enc_dec else TEXT
    return ZooEntry(name, raw["model_type"], kind, lambda: build_hf(raw), vocab_size=vocab,
                    max_seq_len=limit)


def _hf_file_entry(name: str, path: str) -> ZooEntry:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read transformers config {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from exc
    return hf_entry_from_config(raw, name)


# -- a Python file ------------------------------------------------------------------------------

def _file_entry(spec: str) -> ZooEntry:
    path, _, func = spec.rpartition(":")
    if not os.path.isfile(path):
        raise ConfigError(f"model file {path!r} not found (expected path/to/model.py:callable)")
    if not func.isidentifier():
        raise ConfigError(f"{spec!r}: {func!r} is not a callable's name "
                          "(expected path/to/model.py:callable)")
    mod_name = f"_blink_user_model_{abs(hash(os.path.abspath(path)))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
    try:
        loader_spec.loader.exec_module(module)  # the user's own code runs here
    except Exception as exc:  # noqa: BLE001 - report any failure of the user's file
        sys.modules.pop(mod_name, None)
        raise ConfigError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, func, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise _unknown(func, found, f"not defined in {path}",
                       f" It defines: {', '.join(sorted(found)) or 'nothing callable'}.",
                       noun="callable")

    def build() -> torch.nn.Module:
        net = fn()
        if not isinstance(net, torch.nn.Module):
            raise ConfigError(f"{spec} returned {type(net).__name__}, not a torch.nn.Module")
        return net

    return ZooEntry(spec, func, CUSTOM, build)


# -- the resolver -------------------------------------------------------------------------------

def is_file_spec(name: str) -> bool:
    """`path/to/model.py:callable`: a user's file, imported only when the model is built."""
    return ":" in name and name.rpartition(":")[0].endswith(".py")


def _prefixed_matches(name: str) -> list[str]:
    """The prefixed names a bare name is exactly (`resnet50`: torchvision:resnet50 and
    timm:resnet50; `llama-7b`: hf:llama-7b), in PREFIXES order."""
    out = []
    try:  # both libraries are optional at prediction time (a bare GPU box may lack them)
        import torchvision

        if name in torchvision.models.list_models():
            out.append(f"torchvision:{name}")
    except ImportError:
        pass
    try:
        import timm

        if timm.is_model(name):
            out.append(f"timm:{name}")
    except ImportError:
        pass
    if f"hf:{name}" in ZOO:
        out.append(f"hf:{name}")
    return out


def resolve(name: str) -> ZooEntry:
    """The ZooEntry for any accepted model string (see the module docstring)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a model name must be a non-empty string, not {name!r}")
    entry = ZOO.get(name)
    if entry is not None:
        return entry
    if name.startswith("torchvision:"):
        return _torchvision_entry(name.removeprefix("torchvision:"))
    if name.startswith("timm:"):
        return _timm_entry(name.removeprefix("timm:"))
    if name.startswith("hf:"):
        rest = name.removeprefix("hf:")
        if os.path.isdir(rest) and os.path.isfile(os.path.join(rest, "config.json")):
            return _hf_file_entry(name, os.path.join(rest, "config.json"))  # a checkout
        if rest.endswith(".json") or os.path.exists(rest):
            return _hf_file_entry(name, rest)
        shipped = sorted(n for n in ZOO if n.startswith("hf:"))
        if "/" in rest:  # org/name: a Hugging Face Hub id, which a dry run does not fetch
            close = difflib.get_close_matches(
                "hf:" + rest.rpartition("/")[2].lower(), shipped, n=3, cutoff=0.6)
            like = f" Shipped configs like it: {', '.join(close)}." if close else ""
            raise UnknownModelError(
                f"{name!r} looks like a Hugging Face Hub id (or a path that does not exist): "
                "Blink fetches nothing. Download its config once (`huggingface-cli download "
                f"{rest} config.json --local-dir DIR`, or save config.json from the model "
                f"page) and pass hf:DIR/config.json or hf:DIR.{like} Shipped: "
                f"{', '.join(shipped)}.")
        raise _unknown(name, shipped, "no such shipped transformers config",
                       f" Shipped: {', '.join(shipped)}; or give a config file as "
                       "hf:path/to/config.json (nothing is fetched from the Hub).",
                       list_zoo=False)
    if is_file_spec(name):
        return _file_entry(name)
    named = _prefixed_matches(name)
    if len(named) == 1:  # the entry's name carries the prefix, so outputs say which was taken
        return resolve(named[0])
    if named:
        raise UnknownModelError(
            f"model {name!r} is ambiguous without a library prefix: {' or '.join(named)} "
            "(they differ in layers and defaults). Name one of them.")
    raise _unknown(name, list(ZOO), "not a zoo name or a model spec",
                   f" Known: {', '.join(sorted(ZOO))}; also torchvision:<any>, timm:<any>, "
                   "hf:path/to/config.json, path/to/model.py:callable, or pass your own "
                   "torch.nn.Module.", list_zoo=False)


# -- inputs of a plain nn.Module ------------------------------------------------------------------

def entry_for_module(model: torch.nn.Module) -> ZooEntry | None:
    """A ZooEntry describing a module's inputs when the module says what they are: timm's
    pretrained_cfg / default_cfg input_size, or a transformers config. None otherwise."""
    name = type(model).__name__
    for attr in ("pretrained_cfg", "default_cfg"):
        cfg = getattr(model, attr, None)
        if isinstance(cfg, dict) and cfg.get("input_size"):
            return ZooEntry(name, name, VISION, lambda: model, image_size=_timm_size(cfg))
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict) and isinstance(getattr(config, "model_type", None), str):
        raw = to_dict()
        raw["model_type"] = config.model_type
        try:
            entry = hf_entry_from_config(raw, f"hf:{name}")
        except ConfigError:
            return None
        return ZooEntry(f"hf:{name}", entry.family, entry.kind, lambda: model,
                        image_size=entry.image_size, vocab_size=entry.vocab_size,
                        max_seq_len=entry.max_seq_len)
    return None


def no_inputs_error(model: torch.nn.Module, batch_size: int | None) -> ConfigError:
    b = batch_size or 16
    return ConfigError(
        f"no inputs: cannot infer the inputs of {type(model).__name__} (it has no timm "
        f"pretrained_cfg or transformers config). Pass input_shape=({b}, 3, 224, 224) (batch "
        "first, your model's real sizes) or inputs=(tensor, ...); on the command line "
        f"--input-shape 3,224,224 -b {b}.")
