"""Gradient (activation) checkpointing: grad_checkpointing=True switches on the model's own
checkpointing (transformers, timm) on Blink's copy; backward recomputes each block's forward."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import blink
from blink.cli import main

TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 512,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 1000, "max_position_embeddings": 1024}
RUN = dict(mode="train", dtype="bf16", gpu="H100-SXM")


def _kernels(t: blink.Trace, phase: str) -> Counter:
    return Counter(o.name for o in t.ops if o.kernel and o.phase == phase)


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return f"hf:{path}"


def test_transformers_checkpointing_recomputes_each_layer_in_backward(llama_config):
    kw = dict(batch_size=8, seq_len=512, **RUN)
    plain = blink.trace_model(llama_config, **kw)
    ckpt = blink.trace_model(llama_config, grad_checkpointing=True, **kw)
    assert ckpt.meta["grad_checkpointing"] is True and plain.meta["grad_checkpointing"] is False
    # backward runs the four layers' forward again: their projections (7 mm per layer) and
    # attention appear in the backward phase as well; the forward's math is unchanged (without
    # checkpointing transformers also fills a KV cache: its cat / copy ops differ)
    def math(t: blink.Trace, phase: str) -> Counter:
        return Counter({k: v for k, v in _kernels(t, phase).items()
                        if k == "aten::mm" or "scaled_dot_product" in k})

    assert math(ckpt, "forward") == math(plain, "forward")
    extra = _kernels(ckpt, "backward") - _kernels(plain, "backward")
    assert extra["aten::mm"] == 4 * 7
    assert sum(v for k, v in extra.items() if "scaled_dot_product" in k and
               "backward" not in k) == 4
    a, b = (blink.predict_trace(t, gpu="H100-SXM") for t in (plain, ckpt))
    gpu = [{r.key: r.gpu_ms for r in p.breakdown("phase")} for p in (a, b)]
    assert gpu[1]["backward"] > 1.2 * gpu[0]["backward"] and b.time_ms > a.time_ms
    # fewer activations saved: the peak drops (here the step's activations dominate it)
    assert b.peak_allocated_bytes < 0.8 * a.peak_allocated_bytes
    assert b.grad_checkpointing and "grad checkpointing" in b.table().splitlines()[0]


def test_timm_checkpointing_and_models_without_a_switch():
    kw = dict(batch_size=4, **RUN)
    a = blink.predict("timm:vit_tiny_patch16_224", **kw)
    b = blink.predict("timm:vit_tiny_patch16_224", grad_checkpointing=True, **kw)
    assert b.time_ms > a.time_ms and b.peak_allocated_bytes < a.peak_allocated_bytes
    with pytest.raises(blink.ConfigError, match="set_grad_checkpointing"):
        blink.predict("torchvision:resnet18", grad_checkpointing=True, **kw)
    with pytest.raises(blink.ConfigError, match="mode='train'"):
        blink.predict("timm:vit_tiny_patch16_224", batch_size=4, grad_checkpointing=True)
    with pytest.raises(blink.ConfigError, match="True or False"):
        blink.predict("timm:vit_tiny_patch16_224", grad_checkpointing="yes", **kw)


def test_the_users_model_is_left_as_it_was():
    import transformers

    cfg = transformers.AutoConfig.for_model(**TINY_LLAMA)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(2, 64, dtype=torch.long)
    p = blink.predict(model, {"input_ids": ids, "labels": ids}, grad_checkpointing=True, **RUN)
    assert p.grad_checkpointing and p.time_ms > 0
    # transformers marks a checkpointed layer with `gradient_checkpointing = True`
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    ckpt = blink.dryrun.prepare(model, {"input_ids": ids}, mode="train", grad_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in ckpt.net.modules())


def test_cli_flag(capsys, llama_config):
    assert main(["predict", llama_config, "-b", "2", "--seq-len", "64", "--mode", "train",
                 "--dtype", "bf16", "--grad-checkpointing", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["grad_checkpointing"] is True
    assert main(["optimize-batch", "timm:vit_tiny_patch16_224", "--mode", "train",
                 "--grad-checkpointing", "--batch-sizes", "2,4", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["batch_size"] for r in rows] == [2, 4]


class _OwnSwitch(torch.nn.Module):
    """A user's model with its own `set_grad_checkpointing(flag)`: not timm's signature."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.flag = None

    def set_grad_checkpointing(self, flag: bool) -> None:
        self.flag = flag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_switch_with_another_signature_is_not_called_the_librarys():
    net = _OwnSwitch()
    with pytest.raises(blink.ConfigError) as e:
        blink.dryrun.enable_grad_checkpointing(net, "the model")
    msg = str(e.value)
    assert "no gradient-checkpointing switch that Blink can call" in msg
    assert "set_grad_checkpointing:" in msg and "enable" in msg  # the TypeError, named
    assert net.flag is None

    class Both(torch.nn.Module):
        # the first name has another signature; the later one with timm's is still found
        flag = None

        def gradient_checkpointing_enable(self) -> None:
            self.flag = "wrong switch"

        def set_grad_checkpointing(self, enable: bool = False) -> None:
            self.flag = enable

    both = Both()
    blink.dryrun.enable_grad_checkpointing(both, "the model")
    assert both.flag is True
