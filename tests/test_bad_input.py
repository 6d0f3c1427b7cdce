"""Bad input a new user hits gets a clear error naming what is wrong, never a crash: damaged
trace JSON (loaded in a subprocess, so a segfault fails the test, not the run), fp16 with
tensors passed as inputs=, absurd batch sizes, and a loss_fn that returns no tensor."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blink
from blink.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _small_trace_doc() -> dict:
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    t = blink.trace_model(net, input_shape=(2, 8), mode="train")
    return json.loads(t.to_json())


def _first(doc: dict, pred) -> int:
    return next(i for i, r in enumerate(doc["ops"]) if pred(r))


def _tensor_op(doc: dict) -> int:
    return _first(doc, lambda r: any(a[0] == 1 for a in r[10]))


# (case, mutation, words the error must contain)
def _cases(doc: dict) -> list[tuple[str, dict | str, str]]:
    cases: list[tuple[str, dict | str, str]] = []

    def mutate(name: str, fn, expect: str) -> None:
        d = json.loads(json.dumps(doc))
        fn(d)
        cases.append((name, d, expect))

    k = _tensor_op(doc)
    mutate("module index", lambda d: d["ops"][3].__setitem__(4, 999), "module index 999")
    mutate("phase code", lambda d: d["ops"][3].__setitem__(6, 7), "phase code")
    mutate("phase type", lambda d: d["ops"][3].__setitem__(6, "forward"), "must be an integer")
    mutate("name index", lambda d: d["ops"][0].__setitem__(2, 10**6), "name index")
    mutate("negative name", lambda d: d["ops"][0].__setitem__(2, -3), "name index")
    mutate("parent", lambda d: d["ops"][2].__setitem__(1, 50), "parent 50")
    mutate("op id order", lambda d: d["ops"][1].__setitem__(0, 7), "ids must be")
    mutate("short op record", lambda d: d["ops"][1].pop(), "op record 1 is not a list of 17 fields")
    mutate("ops not a list", lambda d: d.__setitem__("ops", "oops"), "must be a list")
    mutate("huge int", lambda d: d["ops"][1].__setitem__(5, 2**70), "64-bit")
    mutate("arg kind", lambda d: d["ops"][k][10][0].__setitem__(0, 99), "kind")
    mutate("rank mismatch", lambda d: d["ops"][k][10][0][1][1].append(1), "strides")
    mutate("negative size", lambda d: d["ops"][k][10][0][1][0].__setitem__(0, -4),
           "negative size")
    mutate("dtype code", lambda d: d["ops"][k][10][0][1].__setitem__(5, 999), "dtype code")
    mutate("tensor type", lambda d: d["ops"][k][10][0].__setitem__(1, "x"), "must be a list")
    mutate("alloc op index", lambda d: d["allocs"][0].__setitem__(2, 10**9), "op index")
    mutate("alloc size", lambda d: d["allocs"][0].__setitem__(1, -1), "impossible size")
    mutate("alloc storage", lambda d: d["allocs"][0].__setitem__(0, 0), "storage id")
    free = next(i for i, a in enumerate(doc["allocs"]) if a[3])
    mutate("free before alloc", lambda d: d["allocs"].insert(0, list(d["allocs"][free])),
           "not allocated")
    mutate("external id", lambda d: d["externals"][0].__setitem__(0, 5), "must be < 0")
    mutate("names type", lambda d: d["names"].__setitem__(0, 3), "must be strings")
    mutate("missing list", lambda d: d.pop("allocs"), "truncated")
    mutate("meta roles", lambda d: d["meta"].__setitem__("resident_roles", [["weights", -5]]),
           "resident_roles")
    cases.append(("not json", "{not json", "invalid JSON"))
    return cases


_RUNNER = r"""
import json, sys
import blink
from blink.predict import predict_trace
results = {}
for name, path in json.loads(sys.argv[1]).items():
    print("case", name, flush=True)   # a crash shows which case
    try:
        predict_trace(blink.Trace.from_json(path), "H100-SXM")
        results[name] = ["no error", ""]
    except Exception as exc:
        results[name] = [("blink" if isinstance(exc, blink.BlinkError) else "other:")
                         + type(exc).__name__, str(exc)]
print("RESULTS " + json.dumps(results))
"""


def test_damaged_traces_get_clear_errors(tmp_path):
    doc = _small_trace_doc()
    cases = _cases(doc)
    paths = {}
    for i, (name, d, _expect) in enumerate(cases):
        p = tmp_path / f"case{i}.json"
        p.write_text(d if isinstance(d, str) else json.dumps(d))
        paths[name] = str(p)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    paths["good"] = str(good)
    r = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(paths)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, f"crashed (rc {r.returncode}) at: {r.stdout[-300:]}{r.stderr[-2000:]}"
    results = json.loads(r.stdout.split("RESULTS ", 1)[1])
    assert results.pop("good") == ["no error", ""]
    for name, _d, expect in cases:
        kind, message = results[name]
        assert kind.startswith("blink"), (name, kind, message)
        assert expect in message, (name, message)
        if name != "not json":
            assert "damaged" in message or "truncated" in message or "resident_roles" in message


def test_fp16_applies_to_tensors_passed_as_inputs():
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
    x = torch.randn(4, 8)
    t = blink.trace_model(net, inputs=(x,), dtype="fp16")
    mm = [op for op in t.ops if op.name == "aten::addmm"]
    assert mm and {a.dtype for a in mm[0].tensors()} == {"float16"}
    # integer inputs keep their dtype; autocast keeps fp32 inputs (it casts per op)
    emb = torch.nn.Embedding(10, 8)
    t = blink.trace_model(emb, inputs=(torch.zeros(2, 3, dtype=torch.long),), dtype="bf16")
    op = next(op for op in t.ops if op.name == "aten::embedding")
    assert [a.dtype for a in op.tensors()] == ["bfloat16", "int64"]
    t = blink.trace_model(net, inputs=(x,), dtype="amp-bf16")
    cast = [op for op in t.ops if op.name == "aten::_to_copy"]
    assert cast and cast[0].tensors()[0].dtype == "float32"
    assert blink.predict(net, inputs=(x,), dtype="fp16").time_ms > 0


@pytest.mark.parametrize("model, kw", [
    ("torchvision:resnet18", {}),
    ("hf:gpt2", {"seq_len": 64}),
    (torch.nn.Linear(8, 8), {"input_shape": (4, 8)}),
])
def test_absurd_batch_size_names_it(model, kw):
    with pytest.raises(blink.BatchSizeError, match=r"batch_size 1000000000000 is too large"):
        blink.predict(model, batch_size=10**12, **kw)


def test_absurd_batch_size_cli(capsys):
    assert main(["predict", "torchvision:resnet18", "-b", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blink: error: batch_size 1000000000000 is too large")
    assert main(["predict", "x.py:f", "--input-shape", "64", "-b", str(10**15)]) == 2
    assert "batch_size 1000000000000000 is too large" in capsys.readouterr().err


def test_loss_fn_must_return_a_tensor():
    net = torch.nn.Linear(8, 4)
    with pytest.raises(blink.ConfigError, match="loss_fn returned float"):
        blink.predict(net, input_shape=(2, 8), mode="train", loss_fn=lambda out: 3.0)
    with pytest.raises(blink.ConfigError, match=r"loss_fn returned a tensor of shape \(2, 4\)"):
        blink.predict(net, input_shape=(2, 8), mode="train", loss_fn=lambda out: out)
    p = blink.predict(net, input_shape=(2, 8), mode="train", loss_fn=lambda out: out.mean())
    assert {u.phase for u in p.units} == {"forward", "backward", "optimizer"}
