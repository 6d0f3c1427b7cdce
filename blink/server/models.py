"""What a request may name as a model, and how the service turns it into work for blink.predict.

Two forms, nothing else:
  * a name, matched against NAME_PATTERN before anything else: ``torchvision:<fn>``,
    ``timm:<name>`` or ``hf:<shipped config>`` (no path separators, no file suffixes, no
    ``module:callable``), resolved by blink's own resolver (blink.zoo via blink.predict), which
    builds library models on meta and never reads a file the request names;
  * a transformers config as a JSON object, checked key by key (CONFIG_KEY_PATTERN, JSON
    scalars, short lists, one level of nesting), with the keys that could load code or files
    removed (FORBIDDEN_CONFIG_KEYS), then built with transformers' AutoConfig.for_model on the
    meta device (no trust_remote_code, no hub access).
Nothing in a request is imported, evaluated or unpickled.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

NAME_PATTERN = r"^(torchvision|timm|hf):[A-Za-z0-9][A-Za-z0-9_\-]{0,79}(\.[A-Za-z0-9_\-]{1,40})?$"
_NAME_RE = re.compile(NAME_PATTERN)
_BAD_SUFFIX = re.compile(r"\.(py|json|pt|pth|bin|pkl|pickle|safetensors|yaml|yml)$", re.I)
CONFIG_KEY_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
_KEY_RE = re.compile(CONFIG_KEY_PATTERN)
MODEL_TYPE_PATTERN = r"^[a-z][a-z0-9_\-]{0,39}$"
# Keys that make transformers look for code or files, or that the service sets itself.
FORBIDDEN_CONFIG_KEYS = frozenset({
    "auto_map", "trust_remote_code", "custom_pipelines", "name_or_path", "transformers_version",
    "quantization_config", "torch_dtype", "dtype", "attn_implementation", "pretrained_model_name",
    "tokenizer_class", "processor_class", "feature_extractor_type", "image_processor_type",
})
TASKS = ("causal-lm", "masked-lm", "seq2seq", "image-classification")
# Keys that count modules to build (layers, blocks, experts, stages): each is bounded, since
# building a model makes one Python object per module before any parameter can be counted.
_LAYER_KEYS = re.compile(r"(layers?|blocks?|depths?|experts?|stages?)(_per_tok|_group)?$")
MAX_LAYERS = 256
MAX_CONFIG_INT = 1 << 24


def check_name(name: str) -> str:
    """The name if it has the allowed form; ConfigError saying what is allowed otherwise."""
    if (not isinstance(name, str) or not _NAME_RE.fullmatch(name) or _BAD_SUFFIX.search(name)
            or (name.startswith("hf:") and "." in name)):
        raise ConfigError(
            f"model name {name[:80]!r} is not allowed: use torchvision:<name>, timm:<name> or "
            "hf:<shipped config> (GET /models lists them), or send a transformers config as a "
            "JSON object")
    return name


def _check_value(key: str, value: object, depth: int = 0) -> object:
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str) and (len(value) > 200 or "\x00" in value):
            raise ConfigError(f"config key {key!r}: strings must be under 200 characters")
        return value
    if isinstance(value, int):
        if abs(value) > MAX_CONFIG_INT:
            raise ConfigError(f"config key {key!r}: {value} is out of range (|n| <= "
                              f"{MAX_CONFIG_INT})")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > 1e12:
            raise ConfigError(f"config key {key!r}: {value!r} is not a finite number")
        return value
    if isinstance(value, list):
        if len(value) > 64:
            raise ConfigError(f"config key {key!r}: lists may hold at most 64 items")
        return [_check_value(key, v, depth + 1) for v in value]
    if isinstance(value, dict) and depth == 0:
        if len(value) > 32:
            raise ConfigError(f"config key {key!r}: nested objects may hold at most 32 keys")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not _KEY_RE.fullmatch(k):
                raise ConfigError(f"config key {key!r}: bad nested key {str(k)[:40]!r}")
            out[k] = _check_value(f"{key}.{k}", v, depth + 1)
        return out
    raise ConfigError(f"config key {key!r}: values must be numbers, strings, booleans, short "
                      "lists or one level of objects")


def check_config(config: dict[str, Any], max_keys: int) -> dict[str, Any]:
    """A cleaned copy of a transformers config sent as JSON (ConfigError on anything odd)."""
    if not isinstance(config, dict) or not config:
        raise ConfigError("config must be a non-empty JSON object with a model_type")
    if len(config) > max_keys:
        raise ConfigError(f"config has {len(config)} keys; at most {max_keys}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not re.fullmatch(MODEL_TYPE_PATTERN, model_type):
        raise ConfigError("config needs a model_type such as \"llama\", \"bert\" or \"gpt2\"")
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key == "model_type":
            continue
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ConfigError(f"config key {str(key)[:40]!r} is not an identifier")
        if key in FORBIDDEN_CONFIG_KEYS:
            continue  # what could load code or files, or what the service sets itself
        value = _check_value(key, value)
        if _LAYER_KEYS.search(key):
            counts = value if isinstance(value, list) else [value]
            ints = [v for v in counts if isinstance(v, int) and not isinstance(v, bool)]
            if any(v > MAX_LAYERS for v in ints) or sum(ints) > 4 * MAX_LAYERS:
                raise ConfigError(f"config key {key!r}: at most {MAX_LAYERS} layers, blocks or "
                                  f"experts, got {value}")
        out[key] = value
    return {"model_type": model_type, **out}


@dataclass
class BuiltConfigModel:
    module: Any                 # torch.nn.Module on meta
    kind: str                   # "text", "seq2seq" or "vision"
    params: int
    vocab_size: int
    max_positions: int          # 0: unknown
    image_size: int
    num_channels: int
    label: str


def build_config_model(config: dict[str, Any], task: str) -> BuiltConfigModel:
    """Build a (checked) transformers config on meta with random init."""
    import torch
    import transformers

    if task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)}")
    model_type = config["model_type"]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(f"transformers has no model_type {model_type!r}")
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # noqa: BLE001 - the request's config is what is wrong
        raise ConfigError(f"transformers rejected the config: {str(exc)[:300]}") from None
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }[task]
    try:
        with torch.device("meta"):
            module = auto.from_config(cfg, attn_implementation="sdpa")
    except Exception as exc:  # noqa: BLE001 - e.g. a task this architecture does not have
        raise ConfigError(f"cannot build a {task} model from this {model_type} config: "
                          f"{str(exc)[:300]}") from None
    kind = {"seq2seq": "seq2seq", "image-classification": "vision"}.get(task, "text")
    return BuiltConfigModel(
        module=module, kind=kind, params=sum(p.numel() for p in module.parameters()),
        vocab_size=int(getattr(cfg, "vocab_size", 0) or 0),
        max_positions=int(getattr(cfg, "max_position_embeddings", 0) or 0),
        image_size=int(getattr(cfg, "image_size", 224) or 224),
        num_channels=int(getattr(cfg, "num_channels", 3) or 3),
        label=f"config:{model_type}")


def config_inputs(m: BuiltConfigModel, batch_size: int, seq_len: int | None, float_dtype: Any,
                  train: bool) -> dict[str, Any]:
    """Meta inputs for a config-built model, as blink.zoo.make_inputs makes them for zoo ones."""
    import torch

    if m.kind == "vision":
        if seq_len is not None:
            raise ConfigError("seq_len does not apply to an image-classification config")
        out = {"pixel_values": torch.empty(batch_size, m.num_channels, m.image_size,
                                           m.image_size, dtype=float_dtype, device="meta")}
        if train:
            out["labels"] = torch.empty(batch_size, dtype=torch.long, device="meta")
        return out
    length = 128 if seq_len is None else seq_len
    if m.max_positions and length > m.max_positions:
        raise ConfigError(f"seq_len {length} is longer than the config's "
                          f"max_position_embeddings {m.max_positions}")
    ids = torch.empty(batch_size, length, dtype=torch.long, device="meta")
    out = {"input_ids": ids}
    if train:
        out["labels"] = torch.empty(batch_size, length, dtype=torch.long, device="meta")
    if m.kind == "seq2seq":
        # given explicitly, also in training: deriving them from the labels needs a
        # decoder_start_token_id that a hand-written config may lack
        out["decoder_input_ids"] = torch.empty(batch_size, length, dtype=torch.long, device="meta")
    return out


@functools.lru_cache(maxsize=128)
def name_params(name: str) -> int:
    """Parameters of a named model, counted on a meta build by blink's own resolver (the one
    blink.predict uses, so every name it accepts is counted the same way; cached)."""
    from ..dryrun import prepare

    net = prepare(name, batch_size=1).net
    return sum(p.numel() for p in net.parameters())
