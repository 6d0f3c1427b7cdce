"""Any model, everywhere a model is accepted: timm / torchvision names beyond the zoo, a
transformers config file, a Python file's builder, a plain nn.Module with inferable inputs;
close matches for unknown names; and the CLI's rough edges (--json, --version, fast start)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_helpers import hf_config
from torch.utils.flop_counter import FlopCounterMode

import blink
from blink.cli import main

ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 256,
              "rope_theta": 10000.0}

USER_FILE = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build_model():
    return Net()
'''


def _json_out(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _first_conv_input(t: blink.Trace) -> tuple[int, ...]:
    op = next(op for op in t.ops if op.name in ("aten::convolution", "aten::conv2d"))
    return op.tensors()[0].shape


def test_cli_predicts_timm_model_by_name(capsys):
    import timm

    doc = _json_out(capsys, ["predict", "--json", "timm:efficientnet_b3", "-b", "2"])
    assert doc["model"] == "timm:efficientnet_b3" and doc["batch_size"] == 2
    assert doc["time_ms"] > 0 and len(doc["units"]) > 100
    ref = timm.create_model("efficientnet_b3", pretrained=False)
    assert doc["params"] == sum(p.numel() for p in ref.parameters())
    # the input size is the one timm's pretrained config gives, not a default 224
    size = timm.models.get_pretrained_cfg("efficientnet_b3").input_size
    t = blink.trace_model("timm:efficientnet_b3", batch_size=2)
    assert _first_conv_input(t) == (2, *size)


def test_any_torchvision_model():
    import torchvision

    crop = torchvision.models.get_model_weights("inception_v3").DEFAULT.transforms.keywords
    t = blink.trace_model("torchvision:inception_v3", batch_size=1)
    assert _first_conv_input(t) == (1, 3, crop["crop_size"], crop["crop_size"])
    p = blink.predict("torchvision:squeezenet1_1", batch_size=2)
    assert p.model == "torchvision:squeezenet1_1" and p.time_ms > 0
    # vit_h_14's DEFAULT weights (SWAG) crop at 518, but weights=None builds it for 224 inputs,
    # which its positional embedding fixes
    assert torchvision.models.get_model_weights("vit_h_14").DEFAULT.transforms.keywords[
        "crop_size"] == 518
    t = blink.trace_model("torchvision:vit_h_14", batch_size=1)
    assert _first_conv_input(t) == (1, 3, 224, 224)


def test_torchvision_segmentation_flow_and_detection_models(tmp_path, monkeypatch):
    import torchvision

    # The segmentation builders default weights_backbone to ImageNet weights: building with
    # only weights=None would fetch them into $TORCH_HOME. Nothing may be downloaded.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    p = blink.predict("torchvision:deeplabv3_resnet50", batch_size=2, mode="train")
    assert not (tmp_path / "torch_home").exists()
    with torch.device("meta"):
        ref = torchvision.models.get_model("deeplabv3_resnet50", weights=None,
                                           weights_backbone=None)
    assert p.params == sum(q.numel() for q in ref.parameters())
    assert {u.phase for u in p.units} == {"forward", "backward", "optimizer"}
    # the size SemanticSegmentation presets resize to (no crop)
    size = torchvision.models.get_model_weights("deeplabv3_resnet50").DEFAULT.transforms.keywords[
        "resize_size"]
    t = blink.trace_model("torchvision:deeplabv3_resnet50", batch_size=2)
    assert _first_conv_input(t) == (2, 3, size, size)
    # LRASPP's forward(input) and RAFT's forward(image1, image2): inputs by the forward's names
    assert blink.predict("torchvision:lraspp_mobilenet_v3_large", batch_size=1).time_ms > 0
    t = blink.trace_model("torchvision:raft_small", batch_size=1)
    frames = [op for op in t.ops if op.name in ("aten::convolution", "aten::conv2d")
              and (op.module or "").startswith("feature_encoder")]
    # both frames go through the shared feature encoder (RAFT concatenates them)
    assert frames and frames[0].tensors()[0].shape[0] == 2
    # detection: a clear error up front, not a failure deep in NMS
    with pytest.raises(blink.ConfigError, match="detection model.*backbone"):
        blink.predict("torchvision:fasterrcnn_resnet50_fpn", batch_size=1)
    assert not (tmp_path / "torch_home").exists()


def test_cli_predicts_config_file(tmp_path, capsys):
    import transformers

    cfg = tmp_path / "tiny_llama.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    doc = _json_out(capsys, ["predict", f"hf:{cfg}", "-b", "2", "--seq-len", "32", "--json",
                             "--mode", "train"])
    fields = {k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model("llama", **fields))
    assert doc["params"] == sum(p.numel() for p in ref.parameters())
    assert doc["seq_len"] == 32 and {u["phase"] for u in doc["units"]} == \
        {"forward", "backward", "optimizer"}
    # a shipped config by name, and one that is not shipped
    assert blink.predict("hf:gpt2", batch_size=1, seq_len=16).params > 1e8
    with pytest.raises(blink.UnknownModelError, match="hf:llama-7b"):
        blink.predict("hf:llama-7", batch_size=1)
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 3}')
    with pytest.raises(blink.ConfigError, match="model_type"):
        blink.predict(f"hf:{bad}", batch_size=1)


def test_a_config_transformers_rejects_is_a_config_error(tmp_path):
    # transformers validates some configs as they are made (a strict dataclass validator here):
    # the error is Blink's, names the field, and the file is left as it was
    cfg = tmp_path / "qwen2.json"
    text = json.dumps({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "vocab_size": 1000,
                       "layer_types": ["full_attention"] * 3})
    cfg.write_text(text)
    with pytest.raises(blink.ConfigError, match="rejected this 'qwen2' config.*layer_types"):
        blink.predict(f"hf:{cfg}", batch_size=1, seq_len=8)
    assert cfg.read_text() == text


def test_hf_config_without_sdpa_runs_eager_attention_and_bad_fields_say_so(tmp_path):
    # Gemma 2 has no SDPA path in transformers: its eager attention (matmul, softmax, matmul)
    # is what a GPU runs, so that is what gets traced.
    cfg = dict(TINY_LLAMA, model_type="gemma2", architectures=["Gemma2ForCausalLM"],
               head_dim=16)
    path = tmp_path / "gemma2.json"
    path.write_text(json.dumps(cfg))
    t = blink.trace_model(f"hf:{path}", batch_size=2, seq_len=32)
    names = {op.name for op in t.ops}
    assert "aten::_softmax" in names or "aten::softmax" in names
    assert not any("scaled_dot_product" in n for n in names)
    # a field transformers rejects: a ConfigError naming the model type and the cause
    bad = dict(TINY_LLAMA, model_type="phi3", architectures=["Phi3ForCausalLM"],
               pad_token_id=32000)
    path = tmp_path / "phi3.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(blink.ConfigError, match="'phi3' config.*Padding_idx"):
        blink.predict(f"hf:{path}", batch_size=1, seq_len=16)


def test_a_hand_written_encoder_decoder_config_gets_decoder_inputs(tmp_path):
    # No "architectures" and no "is_encoder_decoder": T5's config class says it is one, so
    # the model gets decoder_input_ids as transformers' T5Model.forward requires.
    cfg = {"model_type": "t5", "d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2,
           "num_heads": 4, "vocab_size": 1000}
    path = tmp_path / "t5.json"
    path.write_text(json.dumps(cfg))
    t = blink.trace_model(f"hf:{path}", batch_size=2, seq_len=16)
    mods = {op.module for op in t.ops if op.name == "aten::embedding"}
    assert any(m and m.startswith("decoder") for m in mods)  # the decoder ran
    assert any(m and m.startswith("encoder") for m in mods)


def test_cli_predicts_python_file_callable(tmp_path, capsys):
    path = tmp_path / "mymodel.py"
    path.write_text(USER_FILE)
    doc = _json_out(capsys, ["predict", f"{path}:build_model", "--input-shape", "64", "-b",
                             "16", "--json"])
    assert doc["batch_size"] == 16 and doc["model"] == f"{path}:build_model"
    # FLOPs of the GEMMs against torch's own counter on the real model
    ns: dict = {}
    exec(compile(USER_FILE, str(path), "exec"), ns)  # noqa: S102 - the test's own source
    with FlopCounterMode(display=False) as fc:
        ns["build_model"]()(torch.randn(16, 64))
    gemm = sum(u["flops"] for u in doc["units"] if u["kind"] == "gemm")
    assert gemm == fc.get_total_flops()
    # text table: its batch size is shown
    assert main(["predict", f"{path}:build_model", "--input-shape", "64", "-b", "16"]) == 0
    assert "batch 16" in capsys.readouterr().out
    # no inputs: the error says what to pass; a misspelt callable gets close matches
    assert main(["predict", f"{path}:build_model", "-b", "2"]) == 2
    assert "--input-shape" in capsys.readouterr().err
    with pytest.raises(blink.UnknownModelError, match="Did you mean build_model"):
        blink.predict(f"{path}:build_modle", input_shape=(2, 64))
    with pytest.raises(blink.ConfigError, match="not found"):
        blink.predict(f"{tmp_path}/missing.py:f", input_shape=(2, 64))


def test_input_shape_with_dtype(capsys):
    t_doc = _json_out(capsys, ["trace", "torchvision:resnet18", "--input-shape", "3,64,64",
                               "-b", "3", "--json"])
    t = blink.Trace.from_json(json.dumps(t_doc))
    assert _first_conv_input(t) == (3, 3, 64, 64)
    assert main(["predict", "hf:gpt2", "--input-shape", "16:int64", "-b", "2"]) == 0
    assert "batch 2" in capsys.readouterr().out
    assert main(["predict", "hf:gpt2", "--input-shape", "16:int8", "-b", "2"]) == 2
    assert "bad --input-shape" in capsys.readouterr().err


def test_unknown_names_list_close_matches():
    cases = {"timm:resnet18x": "timm:resnet18", "torchvision:resnet5O": "torchvision:resnet50",
             "torchvison:resnet50": "torchvision:resnet50", "hf:gtp2": "hf:gpt2"}
    for name, match in cases.items():
        with pytest.raises(blink.UnknownModelError) as info:
            blink.predict(name, batch_size=1)
        assert "Did you mean" in str(info.value) and match in str(info.value), name


def test_bare_names_resolve_when_one_library_has_them(capsys):
    # gpt2-medium is only a shipped config: taken as hf:gpt2-medium, and labelled so (a text
    # model keeps its labels in training, which the bare name would have lost).
    p = blink.predict("gpt2-medium", batch_size=1, seq_len=16, mode="train")
    assert p.model == "hf:gpt2-medium" and p.params > 3e8
    assert p.time_ms == pytest.approx(
        blink.predict("hf:gpt2-medium", batch_size=1, seq_len=16, mode="train").time_ms)
    # mobilenetv2_100 is timm's name only; resnet50 is both torchvision's and timm's models
    assert main(["predict", "mobilenetv2_100", "-b", "2"]) == 0
    assert "timm:mobilenetv2_100 on" in capsys.readouterr().out
    with pytest.raises(blink.UnknownModelError, match="ambiguous") as info:
        blink.predict("resnet50", batch_size=1)
    assert "torchvision:resnet50 or timm:resnet50" in str(info.value)
    # a comparison drops seq_len for the vision model it resolves a bare name to
    rows = blink.compare(["gpt2", "mobilenetv2_100"], batch_size=1, seq_len=16)
    assert {r.model for r in rows.rows} == {"hf:gpt2", "timm:mobilenetv2_100"}


def test_module_inputs_are_inferred():
    import timm
    import transformers

    with torch.device("meta"):
        net = timm.create_model("resnet18", pretrained=False)
    p = blink.predict(net, batch_size=4, host_time="table")
    assert p.batch_size == 4 and p.time_ms > 0
    assert blink.predict("timm:resnet18", batch_size=4, host_time="table").time_ms == \
        pytest.approx(p.time_ms)
    fields = {k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        lm = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model("llama", **fields), attn_implementation="sdpa")
    t = blink.trace_model(lm, batch_size=2, seq_len=24, mode="train")
    emb = next(op for op in t.ops if op.name == "aten::embedding")
    assert emb.tensors()[1].shape == (2, 24)
    with pytest.raises(blink.ConfigError, match=r"input_shape=\(16, 3, 224, 224\)"):
        blink.predict(torch.nn.Conv2d(3, 8, 3), batch_size=16)


def test_json_flag_takes_model_positionally(tmp_path, capsys):
    doc = _json_out(capsys, ["predict", "--json", "torchvision:resnet18", "-b", "1"])
    assert doc["model"] == "torchvision:resnet18"
    out = tmp_path / "p.json"
    assert main(["predict", "torchvision:resnet18", "-b", "1", "-o", str(out)]) == 0
    assert "peak allocated" in capsys.readouterr().out  # the table, and the file
    assert blink.Prediction.from_json(out).model == "torchvision:resnet18"


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"blink {blink.__version__}"


_STARTUP = r"""
import runpy, sys
sys.argv = {argv!r}
try:
    runpy.run_module({module!r}, run_name="__main__")
except SystemExit:
    pass
heavy = [m for m in {heavy!r} if m in sys.modules]
print("HEAVY", heavy)
"""
MODEL_LIBS = ("timm", "transformers", "torchvision", "torch._dynamo")


@pytest.mark.parametrize("module, argv, heavy", [
    ("blink", ["blink", "--help"], ("torch", *MODEL_LIBS)),
    ("blink", ["blink", "--version"], ("torch", *MODEL_LIBS)),
    ("blink", ["blink", "predict", "--help"], ("torch", *MODEL_LIBS)),
    ("blink.info", ["blink.info"], MODEL_LIBS),  # reports torch's build, so loads torch
])
def test_startup_imports_no_model_library(module, argv, heavy):
    code = _STARTUP.format(argv=argv, module=module, heavy=heavy)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("HEAVY []"), r.stdout[-500:]


def test_collect_on_cpu_is_quiet(tmp_path):
    exe = Path(sys.executable).parent / "blink"
    r = subprocess.run([str(exe), "collect", "--preset", "smoke", "--out", str(tmp_path / "d"),
                        "--device", "cpu", "--limit", "2"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout + r.stderr
    assert "[2/2" in text  # its own progress lines stay
    for noise in ("USDT", "ERROR", "profiler_start", "Warning"):
        assert noise not in text, text[-2000:]


def test_hf_hub_ids_and_checkout_folders(tmp_path):
    # A Hub id is not fetched: the error says how to get its config and names shipped ones
    # close to it; a folder holding config.json (a local checkout) is read as that file.
    with pytest.raises(blink.UnknownModelError, match="Hub id") as info:
        blink.predict("hf:meta-llama/Llama-3.1-8B", batch_size=1, seq_len=16)
    assert "hf:llama-3-8b" in str(info.value) and "config.json" in str(info.value)
    assert "Zoo names" not in str(info.value)
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    p = blink.predict(f"hf:{folder}", batch_size=1, seq_len=16)
    q = blink.predict(f"hf:{folder / 'config.json'}", batch_size=1, seq_len=16)
    assert p.time_ms == q.time_ms and p.peak_allocated_bytes == q.peak_allocated_bytes


TINY_WAV2VEC2 = {"model_type": "wav2vec2", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 32}
TINY_WHISPER = {"model_type": "whisper", "d_model": 64, "encoder_layers": 2,
                "decoder_layers": 2, "encoder_attention_heads": 4,
                "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                "vocab_size": 51865, "num_mel_bins": 80, "max_source_positions": 1500,
                "max_target_positions": 448}


def _config(tmp_path, raw: dict) -> str:
    return hf_config(tmp_path, raw, f"{raw['model_type']}.json")


def _input(t: blink.Trace, i: int = 0) -> tuple[int, ...]:
    return tuple(t.meta["input_shapes"][i])


def test_speech_models_get_audio_inputs(tmp_path):
    # wav2vec2: raw samples, one second at 16 kHz unless seq_len says how many
    w2v = _config(tmp_path, TINY_WAV2VEC2)
    one, two = (blink.trace_model(w2v, batch_size=2, seq_len=s) for s in (None, 32000))
    assert _input(one) == (2, 16000) and _input(two) == (2, 32000)
    convs = [sum(op.name == "aten::convolution" for op in t.ops) for t in (one, two)]
    assert convs[0] == convs[1] > 0  # the feature extractor's convolutions run
    assert blink.predict_trace(two, gpu="H100-SXM").gpu_busy_ms > \
        blink.predict_trace(one, gpu="H100-SXM").gpu_busy_ms
    # Whisper: 80 mel bins x 3000 frames (the encoder takes exactly 30 s), decoder tokens of
    # seq_len; in training labels, from which Whisper derives the decoder's inputs
    wh = _config(tmp_path, TINY_WHISPER)
    t = blink.trace_model(wh, batch_size=2, seq_len=32)
    assert sorted(tuple(s) for s in t.meta["input_shapes"]) == [(2, 32), (2, 80, 3000)]
    tr = blink.trace_model(wh, batch_size=2, seq_len=32, mode="train")
    assert {op.phase for op in tr.ops} == {"forward", "backward", "optimizer"}
    with pytest.raises(blink.ConfigError, match="448 positions"):
        blink.trace_model(wh, batch_size=1, seq_len=1000)


def test_backbones_without_a_head_and_multi_tower_models(tmp_path):
    # ViT-MAE has no image-classification head: the base model, trained without labels
    mae = _config(tmp_path, {"model_type": "vit_mae", "hidden_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 4,
                             "intermediate_size": 128, "image_size": 64, "patch_size": 16,
                             "num_channels": 3})
    t = blink.trace_model(mae, batch_size=2, mode="train")
    assert _input(t) == (2, 3, 64, 64) and len(t.meta["input_shapes"]) == 1
    assert any(op.phase == "backward" for op in t.ops)
    # CLIP joins a text and a vision tower: the error says how to give both inputs
    clip = _config(tmp_path, {"model_type": "clip", "text_config": {"hidden_size": 64},
                              "vision_config": {"hidden_size": 64}})
    with pytest.raises(blink.ConfigError, match="text_config, vision_config.*inputs="):
        blink.predict(clip, batch_size=2)


def test_vision_types_are_known_by_what_their_model_reads(tmp_path):
    # No image_size / num_channels in the file: the type's model reads pixel_values.
    # SegFormer has a classifier; its default config has no image_size (224 then)
    seg = _config(tmp_path, {"model_type": "segformer", "hidden_sizes": [16, 32, 64, 128],
                             "decoder_hidden_size": 64, "depths": [1, 1, 1, 1],
                             "num_attention_heads": [1, 2, 2, 4]})
    t = blink.trace_model(seg, batch_size=2, mode="train")
    assert _input(t) == (2, 3, 224, 224) and len(t.meta["input_shapes"]) == 2  # + labels
    # DETR is an encoder-decoder over images, with no classifier: the base model, no labels
    detr = _config(tmp_path, {"model_type": "detr", "d_model": 64, "encoder_layers": 1,
                              "decoder_layers": 1, "encoder_attention_heads": 4,
                              "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                              "decoder_ffn_dim": 128, "num_queries": 10,
                              "use_pretrained_backbone": False})
    t = blink.trace_model(detr, batch_size=2)
    assert [tuple(s) for s in t.meta["input_shapes"]] == [(2, 3, 224, 224)]
    # DeiT maps image classification to two classes (with and without the distillation
    # head): without "architectures" in the config the first is built
    deit = _config(tmp_path, {"model_type": "deit", "hidden_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "intermediate_size": 128,
                              "image_size": 64, "patch_size": 16})
    assert type(blink.zoo.build(deit)).__name__ == "DeiTForImageClassification"
