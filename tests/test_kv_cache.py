"""kv_cache=N: one generation step of a transformers causal LM after N tokens in its own KV
cache (DynamicCache): attention over N + new keys, the cache resident as an input, and the
layers the step replaces with longer ones (torch.cat) released as on a GPU."""
from __future__ import annotations

import json

import pytest
from hf_helpers import hf_config

import blink
from blink.cli import main

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1000, "max_position_embeddings": 4096}
B = 4


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return hf_config(tmp_path_factory.mktemp("kv"), TINY)


def _cache_bytes(tokens: int) -> int:
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    return 2 * TINY["num_hidden_layers"] * B * TINY["num_key_value_heads"] * tokens * head_dim * 2


def _attention_key_lengths(t: blink.Trace) -> set[int]:
    return {op.tensors("inputs")[1].shape[2] for op in t.ops
            if op.name.startswith("aten::_scaled_dot_product") and "backward" not in op.name}


@pytest.mark.parametrize("host_time", ["table", "measured"])
def test_a_decode_step_attends_over_the_cache(llama, host_time):
    run = dict(batch_size=B, seq_len=1, dtype="bf16", gpu="H100-SXM", host_time=host_time)
    short, long = (blink.predict(llama, kv_cache=n, **run) for n in (512, 2048))
    # the measured host time traces a warm-up first: the kept step still starts from N tokens
    for n in (512, 2048):
        t = blink.trace_model(llama, kv_cache=n, batch_size=B, seq_len=1, dtype="bf16",
                              gpu="H100-SXM", warmup=host_time == "measured")
        assert _attention_key_lengths(t) == {n + 1}
        assert t.meta["kv_cache"] == n
    assert long.gpu_busy_ms > short.gpu_busy_ms
    assert long.kv_cache == 2048 and "2048 cached tokens" in long.table().splitlines()[0]
    # the cache is resident, and the step's longer layers replace it layer by layer: the peak
    # holds the cache once plus the layers in flight, not two whole caches
    cache = _cache_bytes(2048)
    fixed = long.memory_by_category["weights"] + long.memory_by_category["workspace"]
    assert cache < long.peak_allocated_bytes - fixed < 1.5 * cache


def test_kv_cache_needs_an_inference_step_of_a_text_model(llama):
    with pytest.raises(blink.ConfigError, match="inference"):
        blink.predict(llama, batch_size=1, seq_len=1, kv_cache=16, mode="train")
    with pytest.raises(blink.ConfigError, match="input_ids"):
        blink.predict("torchvision:resnet18", batch_size=1, kv_cache=16)
    with pytest.raises(blink.ConfigError, match="1024 positions"):
        blink.predict("hf:gpt2", batch_size=1, seq_len=8, kv_cache=1020)
    with pytest.raises(blink.ConfigError, match="kv_cache"):
        blink.predict(llama, batch_size=1, seq_len=1, kv_cache=0)
    with pytest.raises(blink.BatchSizeError, match="batch_size 64 is too large"):
        blink.predict(llama, batch_size=64, seq_len=1, kv_cache=10**15)
    # not causal LMs: said so before their forward runs into meta values
    with pytest.raises(blink.ConfigError, match="encoder-decoder"):
        blink.predict("hf:t5-small", batch_size=1, seq_len=1, kv_cache=16)
    with pytest.raises(blink.ConfigError, match="BertForMaskedLM.*takes no KV cache"):
        blink.predict("hf:bert-base", batch_size=1, seq_len=1, kv_cache=16)


def test_cli_flag(llama, capsys):
    assert main(["predict", llama, "-b", "2", "--seq-len", "1", "--kv-cache", "128",
                 "--dtype", "bf16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_cache"] == 128 and doc["seq_len"] == 1


def test_a_saved_decode_trace_replays_the_same(llama, tmp_path):
    t = blink.trace_model(llama, kv_cache=256, batch_size=B, seq_len=1, dtype="bf16")
    assert sum(a.storage < 0 and a.is_free for a in t.allocations) == \
        2 * TINY["num_hidden_layers"]  # each layer's keys and values, released once
    path = tmp_path / "decode.json"
    t.to_json(path)
    again = blink.Trace.from_json(path)
    a, b = (blink.predict_trace(x, gpu="H100-SXM") for x in (t, again))
    assert (a.time_ms, a.peak_allocated_bytes) == (b.time_ms, b.peak_allocated_bytes)


def test_plan_decode_batches(llama, capsys):
    # how many sequences fit at a context: the cache grows with the batch
    assert main(["optimize-batch", llama, "--seq-len", "1", "--kv-cache", "1024", "--dtype",
                 "bf16", "--batch-sizes", "1,8", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    one, eight = (r["peak_allocated_bytes"] for r in doc["rows"])
    assert eight - one >= 7 * _cache_bytes(1024) // B
    assert doc["kv_cache"] == 1024
    sweep = blink.optimize_batch(llama, seq_len=1, kv_cache=1024, dtype="bf16", batch_sizes=[2])
    assert "1024 cached tokens" in sweep.table().splitlines()[0]
    c = blink.compare(llama, ["H100-SXM"], batch_size=2, seq_len=1, kv_cache=1024)
    assert c.kv_cache == 1024 and "1024 cached tokens" in c.table().splitlines()[0]
