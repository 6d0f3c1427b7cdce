"""Named real models, built at random init directly on the meta device, with no download.

Names: ``torchvision:resnet50``, ``timm:convnext_tiny``, ``hf:llama-7b``. transformers models
come from the small config files in ``blink/zoo_configs/`` (nothing is fetched from a hub).
Beyond the named entries, any torchvision or timm model, a transformers config file and a
Python file's builder are accepted (``blink.models``).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from .errors import ConfigError

VISION, TEXT, SEQ2SEQ = "vision", "text", "seq2seq"
VIDEO, CUSTOM = "video", "custom"  # CUSTOM: no defined inputs (give input_shape / inputs)
AUDIO = "audio"  # transformers speech models: input_values (samples) or input_features (mels)


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str  # architecture family, for held-out-family evaluation
    kind: str  # VISION | TEXT | SEQ2SEQ
    builder: Callable[[], torch.nn.Module]
    image_size: int = 224
    vocab_size: int = 0
    default_seq_len: int = 128
    max_seq_len: int = 0  # 0: no limit from position embeddings
    num_classes: int = 1000
    # The forward's keyword names of its image inputs (VISION; torchvision's RAFT: two frames).
    image_inputs: tuple[str, ...] = ("x",)
    # AUDIO: the input's per-sample shape ((samples,) of input_values, whose length seq_len sets;
    # (mel bins, frames) of Whisper's input_features) and whether a decoder takes token ids.
    audio_input: str = ""
    audio_shape: tuple[int, ...] = ()
    decoder: bool = False


def _tv(fn_name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, fn_name)(weights=None)

    return build


def _timm(model_name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import timm

        return timm.create_model(model_name, pretrained=False)

    return build


def hf_config(config_name: str) -> dict[str, Any]:
    text = resources.files("blink").joinpath("zoo_configs", f"{config_name}.json").read_text()
    return json.loads(text)


HF_TASKS = ("causal-lm", "masked-lm", "seq2seq", "image-classification",
            "sequence-classification", "base")


def build_hf(raw: dict[str, Any]) -> torch.nn.Module:
    """A transformers model at random init from a config dict (``_task`` picks the head)."""
    import transformers

    task = raw["_task"]
    fields = {k: v for k, v in raw.items() if not k.startswith("_") and k != "model_type"}
    try:
        cfg = transformers.AutoConfig.for_model(raw["model_type"], **fields)
    except Exception as e:  # noqa: BLE001 - transformers validates configs with assorted types
        raise ConfigError(
            f"transformers rejected this {raw['model_type']!r} config: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}. Fix the field it names (a config file saved by "
            "transformers itself is consistent)") from e
    if getattr(cfg, "architectures", None) is None:
        # the auto classes iterate it where a task maps to several classes (DeiT's image
        # classification): none means the first of them, as transformers intends
        cfg.architectures = []
    auto = hf_auto_class(task, type(cfg))
    try:
        try:
            # sdpa: the attention PyTorch users run on GPUs, and what blink.sdpa reroutes.
            return auto.from_config(cfg, attn_implementation="sdpa")
        except ValueError as e:
            # Architectures without an SDPA path (Gemma 2, BLOOM, DeBERTa-v2, Mamba) run their
            # eager attention (or none) on GPUs too.
            if "attention implementation" not in str(e):
                raise
            return auto.from_config(cfg, attn_implementation="eager")
    except (ValueError, TypeError, KeyError, AssertionError, AttributeError) as e:
        raise ConfigError(
            f"transformers could not build a {task} model from this {raw['model_type']!r} "
            f"config: {type(e).__name__}: {str(e)[:300]}. Check the config's fields (e.g. "
            "pad_token_id < vocab_size), or set \"_task\" to another head "
            f"({', '.join(HF_TASKS)})") from e


def hf_auto_class(task: str, config_class: type) -> Any:
    """The transformers Auto class for a task that knows this config class: the task's own, or
    for a model its head does not cover (Whisper is no AutoModelForSeq2SeqLM, a ViT-MAE or a
    SigLIP vision tower no image classifier) the speech seq2seq one, then the base model."""
    import transformers

    own = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "base": transformers.AutoModel,
    }[task]
    tried = [own] + ([transformers.AutoModelForSpeechSeq2Seq] if task == "seq2seq" else [])
    for auto in (*tried, transformers.AutoModel):
        if config_class in auto._model_mapping:
            return auto
    return own  # from_config names what it does support


def _hf(config_name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        return build_hf(hf_config(config_name))

    return build


def _entries() -> dict[str, ZooEntry]:
    e: list[ZooEntry] = []
    for fn, fam in [
        ("resnet18", "resnet"), ("resnet50", "resnet"), ("resnet101", "resnet"),
        ("vgg16", "vgg"), ("mobilenet_v2", "mobilenet"), ("mobilenet_v3_large", "mobilenet"),
        ("efficientnet_b0", "efficientnet"), ("regnet_y_400mf", "regnet"),
        ("densenet121", "densenet"), ("vit_b_16", "vit"), ("swin_t", "swin"),
        ("convnext_tiny", "convnext"),
    ]:
        e.append(ZooEntry(f"torchvision:{fn}", fam, VISION, _tv(fn)))
    for name, fam in [
        ("convnext_tiny", "convnext"), ("vit_base_patch16_224", "vit"),
        ("efficientnet_b0", "efficientnet"), ("resnet50d", "resnet"),
    ]:
        e.append(ZooEntry(f"timm:{name}", fam, VISION, _timm(name)))
    e += [
        ZooEntry("hf:bert-base", "bert", TEXT, _hf("bert-base"), vocab_size=30522,
                 max_seq_len=512),
        ZooEntry("hf:gpt2", "gpt2", TEXT, _hf("gpt2"), vocab_size=50257, max_seq_len=1024),
        ZooEntry("hf:llama-1b", "llama", TEXT, _hf("llama-1b"), vocab_size=128256),
        ZooEntry("hf:llama-7b", "llama", TEXT, _hf("llama-7b"), vocab_size=32000,
                 max_seq_len=4096),
        ZooEntry("hf:t5-small", "t5", SEQ2SEQ, _hf("t5-small"), vocab_size=32128),
        ZooEntry("hf:vit-base", "vit", VISION, _hf("vit-base")),
        ZooEntry("hf:bert-large", "bert", TEXT, _hf("bert-large"), vocab_size=30522,
                 max_seq_len=512),
        ZooEntry("hf:roberta-base", "roberta", TEXT, _hf("roberta-base"), vocab_size=50265,
                 max_seq_len=512),  # 514 positions, offset by pad_token_id + 1
        ZooEntry("hf:deberta-v3-base", "deberta", TEXT, _hf("deberta-v3-base"),
                 vocab_size=128100),  # relative positions only: no length limit
        ZooEntry("hf:gpt2-medium", "gpt2", TEXT, _hf("gpt2-medium"), vocab_size=50257,
                 max_seq_len=1024),
        ZooEntry("hf:gpt2-xl", "gpt2", TEXT, _hf("gpt2-xl"), vocab_size=50257,
                 max_seq_len=1024),
        ZooEntry("hf:opt-1.3b", "opt", TEXT, _hf("opt-1.3b"), vocab_size=50272,
                 max_seq_len=2048),
        ZooEntry("hf:llama-3-8b", "llama", TEXT, _hf("llama-3-8b"), vocab_size=128256,
                 max_seq_len=8192),
        ZooEntry("hf:mistral-7b", "mistral", TEXT, _hf("mistral-7b"), vocab_size=32000),
        ZooEntry("hf:qwen2.5-7b", "qwen2", TEXT, _hf("qwen2.5-7b"), vocab_size=152064),
        # mixtures of experts (torch._grouped_mm over the experts)
        ZooEntry("hf:olmoe-1b-7b", "olmoe", TEXT, _hf("olmoe-1b-7b"), vocab_size=50304,
                 max_seq_len=4096),
        ZooEntry("hf:mixtral-8x7b", "mixtral", TEXT, _hf("mixtral-8x7b"), vocab_size=32000),
        ZooEntry("hf:bart-base", "bart", SEQ2SEQ, _hf("bart-base"), vocab_size=50265,
                 max_seq_len=1024),
        ZooEntry("hf:bart-large", "bart", SEQ2SEQ, _hf("bart-large"), vocab_size=50265,
                 max_seq_len=1024),
        ZooEntry("hf:t5-base", "t5", SEQ2SEQ, _hf("t5-base"), vocab_size=32128),
        ZooEntry("hf:vit-large", "vit", VISION, _hf("vit-large")),
    ]
    return {x.name: x for x in e}


ZOO: dict[str, ZooEntry] = _entries()


def list_models() -> list[str]:
    return sorted(ZOO)


def is_zoo_name(name: object) -> bool:
    return isinstance(name, str) and name in ZOO


def get_entry(name: str) -> ZooEntry:
    """The entry for a zoo name or any name blink.models resolves (torchvision:<any>,
    timm:<any>, hf:path/to/config.json, path/to/model.py:callable); raises UnknownModelError
    with close matches."""
    entry = ZOO.get(name)
    if entry is None:
        from . import models

        entry = models.resolve(name)
    return entry


def build(name: str) -> torch.nn.Module:
    """Build a zoo model on the meta device (random init, no weights, no download)."""
    entry = get_entry(name)
    try:
        with torch.device("meta"):
            net = entry.builder()
        # A legacy constructor ignores the device context (wav2vec2's masked_spec_embed is
        # nn.Parameter(torch.Tensor(n))): such tensors move along, as model.cuda() moves them.
        if any(t.device.type != "meta" for t in [*net.parameters(), *net.buffers()]):
            net = net.to("meta")
        return net
    except NotImplementedError:
        # Some initialisers read tensor values (regnet's width schedule); build those on the
        # CPU and move the result, which costs a real init of the (small) model.
        return entry.builder().to("meta")


def make_inputs(name: str, batch_size: int, seq_len: int | None, float_dtype: torch.dtype,
                *, with_labels: bool) -> dict[str, torch.Tensor]:
    """Meta-device keyword inputs for a zoo model (labels too when a loss is wanted)."""
    return entry_inputs(get_entry(name), batch_size, seq_len, float_dtype,
                        with_labels=with_labels)


def entry_inputs(entry: ZooEntry, batch_size: int, seq_len: int | None,
                 float_dtype: torch.dtype, *, with_labels: bool) -> dict[str, torch.Tensor]:
    """Meta-device keyword inputs for an entry's kind (see make_inputs)."""
    name = entry.name
    dev = "meta"
    if entry.kind == CUSTOM:
        raise ConfigError(
            f"{name} does not define its inputs: pass input_shape=(batch, ...) or inputs=, "
            "or on the command line --input-shape 3,224,224 -b 16")
    from .dryrun import check_input_size

    if entry.kind == VIDEO:
        if seq_len is not None:
            raise ConfigError(f"{name} is a video model; --seq-len does not apply to it")
        shape = (batch_size, 3, 16, entry.image_size, entry.image_size)
        check_input_size(name, batch_size, [shape], float_dtype.itemsize)
        out = {"x": torch.empty(*shape, dtype=float_dtype, device=dev)}
        if with_labels:
            out["labels"] = torch.empty(batch_size, dtype=torch.long, device=dev)
        return out
    if entry.kind == AUDIO:
        return _audio_inputs(entry, batch_size, seq_len, float_dtype, with_labels=with_labels)
    if entry.kind == VISION:
        if seq_len is not None:
            raise ConfigError(f"{name} is a vision model; --seq-len does not apply to it")
        shape = (batch_size, 3, entry.image_size, entry.image_size)
        keys = ("pixel_values",) if name.startswith("hf:") else entry.image_inputs
        check_input_size(name, batch_size, [shape] * len(keys), float_dtype.itemsize)
        out = {key: torch.empty(*shape, dtype=float_dtype, device=dev) for key in keys}
        if with_labels and entry.num_classes > 0:
            out["labels"] = torch.empty(batch_size, dtype=torch.long, device=dev)
        return out
    length = _token_length(entry, seq_len, "position embeddings")
    check_input_size(name, batch_size, [(batch_size, length)] * 3, 8)
    ids = torch.empty(batch_size, length, dtype=torch.long, device=dev)
    out = {"input_ids": ids}
    if entry.kind == SEQ2SEQ:
        out["decoder_input_ids"] = torch.empty(batch_size, length, dtype=torch.long, device=dev)
    if with_labels:
        out["labels"] = torch.empty(batch_size, length, dtype=torch.long, device=dev)
        if entry.kind == SEQ2SEQ:
            del out["decoder_input_ids"]  # T5 derives them from the labels
    return out


def _token_length(entry: ZooEntry, seq_len: int | None, limit: str) -> int:
    """The token count of a text input (the entry's default without seq_len), within the
    entry's max_seq_len (`limit` says what sets it)."""
    length = entry.default_seq_len if seq_len is None else seq_len
    if entry.max_seq_len and length > entry.max_seq_len:
        raise ConfigError(f"seq_len {length} is longer than {entry.name}'s {entry.max_seq_len} "
                          f"{limit}; use seq_len <= {entry.max_seq_len}")
    return length


# One second of 16 kHz audio: the default length of a speech encoder's input_values.
DEFAULT_AUDIO_SAMPLES = 16000


def _audio_inputs(entry: ZooEntry, batch_size: int, seq_len: int | None,
                  float_dtype: torch.dtype, *, with_labels: bool) -> dict[str, torch.Tensor]:
    """input_values (batch, samples: seq_len, default one second at 16 kHz) or Whisper's
    input_features (batch, mel bins, frames: fixed by the encoder); an encoder-decoder also
    gets decoder token ids of seq_len (with labels: labels, from which it derives them)."""
    from .dryrun import check_input_size

    dev = "meta"
    if entry.audio_input == "input_values":
        samples = DEFAULT_AUDIO_SAMPLES if seq_len is None else seq_len
        shape: tuple[int, ...] = (batch_size, samples)
    else:
        shape = (batch_size, *entry.audio_shape)
    check_input_size(entry.name, batch_size, [shape], float_dtype.itemsize)
    out = {entry.audio_input: torch.empty(*shape, dtype=float_dtype, device=dev)}
    if entry.decoder:
        length = _token_length(entry, seq_len, "positions (its decoder's)")
        key = "labels" if with_labels else "decoder_input_ids"
        out[key] = torch.empty(batch_size, length, dtype=torch.long, device=dev)
    return out
