"""The REST service on a real uvicorn server on 127.0.0.1 (a `blink serve` subprocess on a free
port, started here and stopped at the end): valid requests, hostile ones, the cache, the
queue and wall-time limits, and a bounded schemathesis run against its own OpenAPI schema."""
from __future__ import annotations

import json
import threading
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from service_helpers import request, start, stop

import blink


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(str(tmp_path_factory.mktemp("serve")), "--max-queue", "2", "--max-wall-s", "90")
    yield s
    stop(s)
    assert s.proc.returncode is not None


def post(server, path, body, **kw):
    return request(server.url + path, "POST", body, **kw)


def _json(raw: bytes):
    return json.loads(raw.decode())


# ---- valid requests -------------------------------------------------------------------------

def test_catalogue_and_health(server):
    status, _, body = request(server.url + "/health")
    assert status == 200 and _json(body)["status"] == "ok"
    status, _, body = request(server.url + "/gpus")
    gpus = {g["name"]: g for g in _json(body)}
    assert status == 200 and "H200" in gpus
    assert gpus["H200"]["memory_bytes"] == blink.hardware.get_gpu("H200").memory_bytes
    status, _, body = request(server.url + "/models")
    names = [m["name"] for m in _json(body)["models"]]
    assert status == 200 and names == blink.zoo.list_models()
    status, _, body = request(server.url + "/limits")
    assert status == 200 and _json(body)["max_queue"] == 2
    status, _, body = request(server.url + "/openapi.json")
    paths = _json(body)["paths"]
    assert {"/predict", "/optimize-batch", "/compare", "/health"} <= set(paths)
    # the configured limit is in the schema
    schema = _json(body)["components"]["schemas"]["PredictRequest"]["properties"]
    assert schema["batch_size"]["maximum"] == 4096


def test_predict_answers_what_blink_predict_says(server):
    status, headers, body = post(server, "/predict", {"model": "torchvision:resnet18",
                                                      "batch_size": 2, "gpu": "A100-80GB"})
    assert status == 200, body
    d = _json(body)
    assert d["format"] == "blink.prediction"
    p = blink.predict("torchvision:resnet18", batch_size=2, gpu="A100-80GB", host_time="table")
    assert d["time_ms"] == pytest.approx(p.time_ms)
    assert d["peak_reserved_bytes"] == p.peak_reserved_bytes
    assert len(d["units"]) == len(p.units) and d["timeline"]


def test_predict_a_transformers_config_sent_as_json(server):
    cfg = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 1000, "max_position_embeddings": 256}
    status, _, body = post(server, "/predict", {"model": cfg, "batch_size": 2, "seq_len": 64,
                                                "mode": "train", "dtype": "bf16"})
    assert status == 200, body
    d = _json(body)
    assert d["model"] == "config:llama" and d["mode"] == "train" and d["seq_len"] == 64
    assert any(u["op"].startswith("aten::_scaled_dot_product") for u in d["units"])
    # the same config's parameters, built here: weights (bf16) + AdamW state are resident
    import torch
    import transformers

    c = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        n = sum(q.numel() for q in transformers.AutoModelForCausalLM.from_config(c).parameters())
    assert d["resident_bytes"] >= n * 2
    # the same step with the model's own activation checkpointing: backward recomputes
    status, _, body = post(server, "/predict", {"model": cfg, "batch_size": 2, "seq_len": 64,
                                                "mode": "train", "dtype": "bf16",
                                                "grad_checkpointing": True})
    assert status == 200, body
    ckpt = _json(body)
    assert ckpt["grad_checkpointing"] is True and not d["grad_checkpointing"]
    assert ckpt["gpu_busy_ms"] > d["gpu_busy_ms"]
    status, _, body = post(server, "/predict", {"model": "torchvision:resnet18", "batch_size": 2,
                                                "grad_checkpointing": True})
    assert status == 422 and b"mode='train'" in body
    # a decode step after 128 cached tokens: its cache is resident, and a vision model has none
    status, _, body = post(server, "/predict", {"model": cfg, "batch_size": 2, "seq_len": 1,
                                                "dtype": "bf16", "kv_cache": 128})
    assert status == 200, body
    dec = _json(body)
    assert dec["kv_cache"] == 128 and dec["seq_len"] == 1
    cache = 2 * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * 128 * 32 * 2
    assert dec["resident_bytes"] >= n * 2 + cache
    status, _, body = post(server, "/predict", {"model": "torchvision:resnet18", "batch_size": 2,
                                                "kv_cache": 128})
    assert status == 422 and b"input_ids" in body


@pytest.mark.parametrize("task,cfg,extra", [
    ("seq2seq", {"model_type": "t5", "d_model": 64, "d_ff": 128, "num_layers": 2,
                 "num_heads": 2, "d_kv": 32, "vocab_size": 1000}, {"seq_len": 32}),
    ("image-classification", {"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "intermediate_size": 128,
                              "image_size": 32, "patch_size": 8}, {}),
    ("masked-lm", {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 500}, {}),
], ids=["t5-seq2seq", "vit-image", "bert-mlm"])
def test_config_models_of_each_task_train(server, task, cfg, extra):
    status, _, body = post(server, "/predict", {"model": cfg, "task": task, "batch_size": 2,
                                                "mode": "train", **extra})
    assert status == 200, body
    d = _json(body)
    assert d["model"] == f"config:{cfg['model_type']}" and d["time_ms"] > 0
    assert {u["phase"] for u in d["units"]} == {"forward", "backward", "optimizer"}


def test_optimize_batch_and_compare(server):
    status, _, body = post(server, "/optimize-batch", {
        "model": "torchvision:resnet18", "gpu": "A100-40GB", "memory_budget": "2GiB",
        "max_batch": 1024})
    assert status == 200, body
    s = _json(body)
    local = blink.max_batch_size("torchvision:resnet18", gpu="A100-40GB", memory_budget="2GiB",
                                 max_batch=1024)
    assert s["max_batch_size"] == local.batch_size
    assert s["best"]["fits"] and s["budget_bytes"] == 2 << 30
    status, _, body = post(server, "/compare", {"models": ["torchvision:resnet18"],
                                                "gpus": ["H200", "T4"], "batch_size": 4})
    assert status == 200, body
    rows = _json(body)["rows"]
    assert [r["gpu"] for r in rows] == ["H200", "T4"]  # fastest first
    assert rows[0]["relative"] == 1.0 and rows[1]["relative"] > 1.0


# ---- the cache ------------------------------------------------------------------------------

def _computed(server) -> dict:
    return _json(request(server.url + "/health")[2])["computed"]


def test_identical_requests_come_from_the_cache_without_recomputing(server):
    req = {"model": "torchvision:mobilenet_v2", "batch_size": 3, "dtype": "bf16"}
    before = _computed(server)["predict"]
    s1, h1, b1 = post(server, "/predict", req)
    assert s1 == 200 and h1["x-blink-cache"] == "miss"
    assert _computed(server)["predict"] == before + 1
    s2, h2, b2 = post(server, "/predict", req)
    assert s2 == 200 and h2["x-blink-cache"] == "hit" and b2 == b1
    # the same request spelled differently (dtype alias, key order) is the same entry
    s3, h3, b3 = post(server, "/predict", {"dtype": "bfloat16", "batch_size": 3,
                                           "model": "torchvision:mobilenet_v2"})
    assert s3 == 200 and h3["x-blink-cache"] == "hit" and b3 == b1
    assert _computed(server)["predict"] == before + 1  # computed once for three answers
    # a different request is computed
    s4, h4, _ = post(server, "/predict", {**req, "batch_size": 4})
    assert s4 == 200 and h4["x-blink-cache"] == "miss"
    assert _computed(server)["predict"] == before + 2


# ---- malformed, oversized and hostile requests ----------------------------------------------

NUL_MODEL = b'{"model": "torchvision:resnet18\x00", "batch_size": 1}'
HOSTILE: list[tuple[str, bytes | dict | None, dict | None]] = [
    ("bad json", b'{"model": "torchvision:resnet18", "batch_size": ', None),
    ("not json", b"model=torchvision:resnet18&batch_size=1", None),
    ("raw NUL byte", NUL_MODEL, None),
    ("escaped NUL", {"model": "torchvision:resnet18\u0000", "batch_size": 1}, None),
    ("NUL-only body", b"\x00" * 64, None),
    ("not UTF-8", b'{"model": "\xff\xfe", "batch_size": 1}', None),
    ("empty body", b"", None),
    ("no body", None, None),
    ("JSON array", [1, 2, 3], None),
    ("JSON null", b"null", None),
    ("deeply nested", b"[" * 5000 + b"]" * 5000, None),
    ("huge number", b'{"model": "torchvision:resnet18", "batch_size": 1e400}', None),
    ("huge int", {"model": "torchvision:resnet18", "batch_size": 10**30}, None),
    ("batch over the limit", {"model": "torchvision:resnet18", "batch_size": 4097}, None),
    ("batch zero", {"model": "torchvision:resnet18", "batch_size": 0}, None),
    ("negative batch", {"model": "torchvision:resnet18", "batch_size": -5}, None),
    ("float batch", {"model": "torchvision:resnet18", "batch_size": 2.5}, None),
    ("string for a number", {"model": "torchvision:resnet18", "batch_size": "8"}, None),
    ("bool for a number", {"model": "torchvision:resnet18", "batch_size": True}, None),
    ("seq_len as string", {"model": "hf:gpt2", "batch_size": 1, "seq_len": "512"}, None),
    ("seq_len over the limit", {"model": "hf:gpt2", "batch_size": 1, "seq_len": 10**6}, None),
    ("seq_len beyond the model", {"model": "hf:gpt2", "batch_size": 1, "seq_len": 4096}, None),
    ("python code as model", {"model": "__import__('os').system('id')", "batch_size": 1}, None),
    ("eval as model", {"model": "eval(\"1+1\")", "batch_size": 1}, None),
    ("file:callable as model", {"model": "evil.py:build_model", "batch_size": 1}, None),
    ("path as model", {"model": "hf:../../etc/passwd", "batch_size": 1}, None),
    ("absolute path as model", {"model": "/etc/passwd", "batch_size": 1}, None),
    ("config file as model", {"model": "hf:config.json", "batch_size": 1}, None),
    ("python file suffix", {"model": "timm:model.py", "batch_size": 1}, None),
    ("shell in model", {"model": "timm:x;rm -rf /", "batch_size": 1}, None),
    ("unknown model", {"model": "timm:not_a_model_at_all", "batch_size": 1}, None),
    ("very long model", {"model": "timm:" + "a" * 5000, "batch_size": 1}, None),
    ("model as number", {"model": 12, "batch_size": 1}, None),
    ("unknown GPU", {"model": "torchvision:resnet18", "batch_size": 1, "gpu": "H9000"}, None),
    ("GPU with code", {"model": "torchvision:resnet18", "batch_size": 1,
                       "gpu": "__import__('os')"}, None),
    ("unknown dtype", {"model": "torchvision:resnet18", "batch_size": 1, "dtype": "fp4"}, None),
    ("unknown mode", {"model": "torchvision:resnet18", "batch_size": 1, "mode": "fly"}, None),
    ("extra field", {"model": "torchvision:resnet18", "batch_size": 1, "exec": "x"}, None),
    ("missing batch", {"model": "torchvision:resnet18"}, None),
    ("bad budget", {"model": "torchvision:resnet18", "batch_size": 1,
                    "memory_budget": "lots"}, None),
    ("budget below context", {"model": "torchvision:resnet18", "batch_size": 1,
                              "memory_budget": 1024}, None),
    ("input_shape zero", {"model": "torchvision:resnet18", "batch_size": 1,
                          "input_shape": [1, 0, 224, 224]}, None),
    ("input_shape too big", {"model": "torchvision:resnet18", "batch_size": 1,
                             "input_shape": [1, 4096, 4096, 4096]}, None),
    ("config with remote code", {"model": {"model_type": "llama", "auto_map": {
        "AutoModelForCausalLM": "evil.Model"}, "trust_remote_code": True,
        "num_hidden_layers": 10**6}, "batch_size": 1}, None),
    ("config with unknown type", {"model": {"model_type": "evil_model"}, "batch_size": 1}, None),
    ("config with a huge width", {"model": {"model_type": "llama", "hidden_size": 10**12},
                                  "batch_size": 1}, None),
    ("config too big to serve", {"model": {"model_type": "llama", "hidden_size": 16384,
                                           "intermediate_size": 65536, "num_hidden_layers": 200,
                                           "num_attention_heads": 128}, "batch_size": 1}, None),
    ("config with a million experts", {"model": {"model_type": "mixtral",
                                                 "num_local_experts": 10**6}, "batch_size": 1},
     None),
    ("config with huge depths", {"model": {"model_type": "swin", "depths": [2, 2, 10**5, 2]},
                                 "task": "image-classification", "batch_size": 1}, None),
    ("config with bad key", {"model": {"model_type": "llama", "__class__": 1},
                             "batch_size": 1}, None),
    ("config with a NaN", b'{"model": {"model_type": "llama", "rope_theta": NaN}, '
                          b'"batch_size": 1}', None),
    ("empty config", {"model": {}, "batch_size": 1}, None),
    ("wrong content type", b'{"model": "torchvision:resnet18", "batch_size": 1}',
     {"Content-Type": "text/plain"}),
    ("oversized body", {"model": "torchvision:resnet18", "batch_size": 1,
                        "pad": "x" * 200_000}, None),
    ("lying content-length", b'{"model": "torchvision:resnet18"}',
     {"Content-Length": "99999999"}),
]


def _hostile_body(body):
    if body is None or isinstance(body, bytes):
        return body
    return json.dumps(body).encode()


@pytest.mark.parametrize("name,body,headers", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_predict_requests_get_4xx(server, name, body, headers):
    try:
        status, _, raw = request(server.url + "/predict", "POST", _hostile_body(body),
                                 headers=headers, timeout=60)
    except OSError:
        # the server may hang up on a body it refuses (413 before reading it); it must live on
        status, raw = 413, b"{}"
    assert 400 <= status < 500, f"{name}: {status} {raw[:300]!r}"
    assert server.alive()
    if status in (413, 422) and raw.strip().startswith(b"{"):
        assert _json(raw).get("detail"), f"{name}: no detail in {raw[:200]!r}"


def test_hostile_requests_on_the_other_endpoints(server):
    cases = [
        ("/optimize-batch", {"model": "torchvision:resnet18", "safety_margin": 5}),
        ("/optimize-batch", {"model": "torchvision:resnet18", "batch_sizes": []}),
        ("/optimize-batch", {"model": "torchvision:resnet18", "batch_sizes": list(range(1, 40))}),
        ("/optimize-batch", {"model": "torchvision:resnet18", "max_batch": 10**9}),
        ("/optimize-batch", {"model": {"model_type": "bert"}}),
        ("/optimize-batch", {"model": "torchvision:resnet18", "gpu": "nope"}),
        ("/compare", {"models": []}),
        ("/compare", {"models": ["torchvision:resnet18"] * 17}),
        ("/compare", {"models": ["torchvision:resnet18"] * 5, "gpus": ["H200", "T4"],
                      "dtypes": ["fp32", "bf16"]}),
        ("/compare", {"models": ["os.system('id')"]}),
        ("/compare", {"models": ["torchvision:resnet18"], "gpus": ["H200", "Z80"]}),
        ("/compare", {"models": ["torchvision:resnet18"], "batch_size": "1"}),
    ]
    for path, body in cases:
        status, _, raw = post(server, path, body)
        assert 400 <= status < 500, f"{path} {body}: {status} {raw[:300]!r}"
    for method, path in [("GET", "/predict"), ("DELETE", "/health"), ("GET", "/nope"),
                         ("POST", "/health")]:
        status, _, _ = request(server.url + path, method)
        assert 400 <= status < 500, (method, path, status)
    assert request(server.url + "/health")[0] == 200


# ---- the worker, the queue and the wall-time bound ------------------------------------------

def test_health_answers_while_work_runs_and_a_full_queue_is_429(server):
    results: dict[int, tuple] = {}

    def slow(i: int) -> None:
        results[i] = post(server, "/predict", {"model": "hf:llama-1b", "batch_size": 1 + i,
                                               "seq_len": 256, "mode": "train"}, timeout=300)

    threads = [threading.Thread(target=slow, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    health_s = []
    while any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        status, _, body = request(server.url + "/health", timeout=10)
        health_s.append(time.monotonic() - t0)
        assert status == 200
        time.sleep(0.2)
    for t in threads:
        t.join()
    statuses = sorted(r[0] for r in results.values())
    # max_queue=2: two are admitted (one runs, one waits), the others are turned away at once
    assert statuses.count(200) >= 2 and 429 in statuses, statuses
    refused = next(r for r in results.values() if r[0] == 429)
    assert refused[1]["retry-after"] and "max_queue" in _json(refused[2])["detail"]
    assert len(health_s) >= 3 and max(health_s) < 2.0, health_s


def test_parameter_limit(tmp_path):
    s = start(str(tmp_path), "--max-params", "100000000")
    try:
        # llama-7b's 6.7e9 parameters are over this server's 1e8: refused before tracing
        status, _, raw = request(s.url + "/predict", "POST",
                                 {"model": "hf:llama-7b", "batch_size": 1}, timeout=120)
        assert status == 422 and "max_params" in _json(raw)["detail"], raw
        assert _json(request(s.url + "/health")[2])["computed"]["predict"] == 1
        status, _, raw = request(s.url + "/compare", "POST",
                                 {"models": ["hf:llama-7b"], "gpus": ["H200"]}, timeout=120)
        assert status == 422 and "max_params" in _json(raw)["detail"], raw
        # a small model passes
        status, _, _ = request(s.url + "/predict", "POST",
                               {"model": "torchvision:resnet18", "batch_size": 1}, timeout=120)
        assert status == 200
    finally:
        stop(s)


def test_wall_time_limit_is_504_and_the_service_lives(tmp_path):
    s = start(str(tmp_path), "--max-wall-s", "0.5")
    try:
        status, _, raw = request(s.url + "/optimize-batch", "POST",
                                 {"model": "hf:bert-base", "mode": "train", "seq_len": 128,
                                  "gpu": "A100-40GB"}, timeout=120)
        assert status == 504 and "max_wall_s" in _json(raw)["detail"]
        assert request(s.url + "/health")[0] == 200
    finally:
        stop(s)


# ---- schemathesis against the service's own OpenAPI schema ----------------------------------
# Hypothesis drives schemathesis' strategies directly (its pytest plugin's fixture loader does
# not run under this pytest): every operation, positive and negative data, bounded in count
# and per-example time.

def _fuzz(op, mode, base_url: str, calls: list[str]) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=20, deadline=60_000, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(base_url=base_url, timeout=120)
        calls.append(f"{op.method.upper()} {op.path} {response.status_code}")
        assert response.status_code < 500, (
            f"{op.method.upper()} {op.path} -> {response.status_code}: "
            f"{response.text[:300]} for {case.body!r:.300}")

    check()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["positive", "negative"])
def test_schemathesis_finds_no_server_error(server, mode):
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    ops = [r.ok() for r in api.get_all_operations()]
    assert {op.path for op in ops} >= {"/predict", "/optimize-batch", "/compare", "/health"}
    if mode is GenerationMode.NEGATIVE:
        ops = [op for op in ops if op.method.upper() == "POST"]  # GETs take no input to break
    calls: list[str] = []
    for op in ops:
        _fuzz(op, mode, server.url, calls)
    assert len(calls) >= len(ops) and server.alive()
    assert request(server.url + "/health")[0] == 200
    print(f"schemathesis ({mode.value}): {len(calls)} requests, statuses "
          f"{sorted({c.rsplit(' ', 1)[1] for c in calls})}")


# ---- the history file -----------------------------------------------------------------------

def test_history_joins_measured_runs_with_their_own_checkpointing(tmp_path):
    # A training step with activation checkpointing is another configuration than the same
    # step without it: each prediction joins the measured run of its own kind only.
    from blink.collect.dataset import DatasetWriter
    from blink.server.history import History

    path = str(tmp_path / "measured")
    w = DatasetWriter(path, preset="smoke", device="cuda", protocol={"samples": 1},
                      env={"gpu_name": "NVIDIA H100"}, env_id="e0", feature_columns=[],
                      planned=2)
    for i, ckpt in enumerate((False, True)):
        w.append({"run_id": f"r{i}", "kind": "model", "status": "ok",
                  "model": "timm:vit_tiny_patch16_224", "batch_size": 2, "seq_len": None,
                  "dtype": "bf16", "mode": "train", "grad_checkpointing": ckpt,
                  "device": "cuda", "feature_gpu": "H100-SXM", "time_median_s": 0.01 + i,
                  "env_id": "e0"}, [])
    w.finish("complete")
    h = History(4, "", [path])
    for ckpt in (False, True):
        h.add(blink.predict("timm:vit_tiny_patch16_224", batch_size=2, mode="train",
                            dtype="bf16", gpu="H100-SXM", grad_checkpointing=ckpt))
    newest, oldest = h.entries()
    assert newest["mode"] == "train+grad_checkpointing" and oldest["mode"] == "train"
    assert newest["measured"]["run_id"] == "r1" and oldest["measured"]["run_id"] == "r0"


def test_history_persists_and_survives_a_damaged_file(tmp_path):
    from blink.server.history import History

    path = str(tmp_path / "h" / "history.json")
    h = History(3, path, [])
    for b in (1, 2, 3, 4):
        h.add(blink.predict("torchvision:resnet18", batch_size=b, gpu="T4"))
    again = History(3, path, [])
    assert [e["batch_size"] for e in again.entries()] == [4, 3, 2]  # newest first, bounded
    assert all(e["measured"] is None for e in again.entries())
    with open(path, "w", encoding="utf-8") as f:
        f.write("{not json")
    damaged = History(3, path, [])
    assert damaged.entries() == [] and "ignored" in damaged.problems[0]
    bad = History(3, "", [str(tmp_path / "no-such-dataset")])
    assert bad.dataset_info()[0]["runs"] == 0 and "no-such-dataset" in bad.problems[0]
