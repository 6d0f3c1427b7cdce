"""The GNN: the C++ forward (blink._C.Gnn) against the PyTorch network (blink.gnn.UnitGNN) on
random weights over real traced unit graphs, the graph's dataflow edges, bad weight files, and
predict's use of models/gnn.safetensors."""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import blink
from blink import gnn, learned
from blink.errors import ArtifactError
from blink.predict import predict_trace

ROOT = Path(__file__).resolve().parent.parent
GPU = "H100-SXM"


@pytest.fixture(scope="module")
def graphs():
    resnet = blink.trace_model("torchvision:resnet18", batch_size=4)
    gpt2 = blink.trace_model("hf:gpt2", batch_size=1, seq_len=32, mode="train")
    return {"resnet18-inference": (resnet, gnn.unit_graph(resnet, GPU)),
            "gpt2-train": (gpt2, gnn.unit_graph(gpt2, GPU))}


@pytest.fixture(autouse=True)
def _fresh_cache():
    learned._CACHE.clear()
    yield
    learned._CACHE.clear()


def _random_net(graph: dict, seed: int, hidden: int = 24, layers: int = 2,
                clip: tuple[float, float] = (-50.0, 50.0), dtype=torch.float64) -> gnn.UnitGNN:
    torch.manual_seed(seed)
    m = gnn.UnitGNN(hidden=hidden, layers=layers, clip=clip).to(dtype)
    x = torch.as_tensor(graph["x"], dtype=dtype)
    g = torch.as_tensor(graph["g"], dtype=dtype)
    with torch.no_grad():
        # torch's default init for the weights (random per seed), random biases too
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.3)
        m.node_mean.copy_(x.mean(0))
        m.node_std.copy_(x.std(0, correction=0).clamp(min=0.05))
        m.graph_mean.copy_(g * 0.9)
        m.graph_std.copy_(g.abs().clamp(min=0.5))
    return m


def test_graph_is_the_traces_dataflow(graphs):
    t, g = graphs["resnet18-inference"]
    units = g["op"]
    assert g["x"].shape == (len(units), len(gnn.node_feature_names()))
    assert len(g["g"]) == len(gnn.graph_feature_names())
    edges = {tuple(e) for e in g["edges"].tolist()}
    assert len(edges) == len(g["edges"]) and all(s < d for s, d in edges)
    # re-derived from the Python trace: v reads a storage u wrote last
    last: dict[int, int] = {}
    want = set()
    for i, op in enumerate(units):
        o = t.ops[op]
        for v in o.tensors("inputs"):
            if v.storage and v.storage in last and last[v.storage] != i:
                want.add((last[v.storage], i))
        for v in o.tensors("outputs"):
            if v.storage:
                last[v.storage] = i
    assert edges == want
    # every residual add reads two producers
    adds = [i for i, op in enumerate(units) if t.ops[op].name == "aten::add_"]
    assert adds and all(sum(d == i for _s, d in edges) == 2 for i in adds)
    kinds = gnn.node_feature_names().index("kind_conv")
    assert g["x"][:, kinds].sum() == 20  # resnet18's 20 convolutions, one-hot


def test_graph_edges_are_the_same_in_every_process():
    # The edges come from storage ids; an id handed on through a recycled address (zero-byte
    # reserve tensors of timm's NF-ResNet weight standardisation) once gave a different graph,
    # and so a different GNN prediction, in each process (746-750 edges; 720 are real).
    code = ("import hashlib, numpy as np, blink; from blink import gnn; "
            "t = blink.trace_model('timm:nf_resnet26', batch_size=2); "
            f"e = np.ascontiguousarray(gnn.unit_graph(t, {GPU!r})['edges'], dtype=np.int64); "
            "print(len(e), hashlib.sha256(e.tobytes()).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=ROOT).stdout.split()[-1] for _ in range(3)}
    assert len(runs) == 1, runs


@pytest.mark.parametrize("name", ["resnet18-inference", "gpt2-train"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cxx_forward_matches_pytorch(graphs, name, seed, tmp_path):
    _t, graph = graphs[name]
    m = _random_net(graph, seed, layers=1 + seed)
    path = tmp_path / "g.safetensors"
    gnn.save(m, path, dtype=torch.float64)
    ours = gnn.load_native(path).forward(graph)
    with torch.no_grad():
        ref = float(m.forward_graph(graph))
    assert abs(ref) > 1e-3 and abs(ref) < 50  # a non-trivial, unclipped value
    assert ours == pytest.approx(ref, rel=1e-5, abs=1e-5)
    # float32 weights (the shipped dtype), float32 PyTorch
    m32 = m.float()
    gnn.save(m32, path)
    with torch.no_grad():
        ref32 = float(m32.forward_graph(graph))
    assert gnn.load_native(path).forward(graph) == pytest.approx(ref32, rel=1e-5, abs=1e-5)


def test_ensemble_forward_is_the_members_mean(graphs, tmp_path):
    """A seed ensemble: the C++ forward of a 3-member file equals PyTorch's GnnEnsemble (the mean
    of the members' clipped corrections), and each member equals its own UnitGNN."""
    _t, graph = graphs["resnet18-inference"]
    nets = [_random_net(graph, s, hidden=12, layers=2) for s in (4, 5, 6)]
    ens = gnn.GnnEnsemble(nets)
    gnn.save(ens, tmp_path / "e.safetensors", dtype=torch.float64)
    native = gnn.load_native(tmp_path / "e.safetensors")
    assert native.members == 3 and native.hidden == 12 and native.layers == 2
    with torch.no_grad():
        each = [float(n.forward_graph(graph)) for n in nets]
        ref = float(ens.forward_graph(graph))
    assert len({round(v, 6) for v in each}) == 3  # three different members
    assert ref == pytest.approx(sum(each) / 3, abs=1e-12)
    for k, v in enumerate(each):
        assert native.forward_member(k, graph) == pytest.approx(v, rel=1e-5, abs=1e-5)
    assert native.forward(graph) == pytest.approx(ref, rel=1e-5, abs=1e-5)
    # each member is clipped before the mean (a narrow clip that binds some members only)
    tight = [_random_net(graph, s, hidden=12, layers=2, clip=(-0.1, 0.1)) for s in (4, 5, 6)]
    gnn.save(gnn.GnnEnsemble(tight), tmp_path / "t.safetensors", dtype=torch.float64)
    with torch.no_grad():
        clipped = [float(n.forward_graph(graph)) for n in tight]
    assert 0.1 in [abs(v) for v in clipped] and min(abs(v) for v in clipped) < 0.1
    assert gnn.load_native(tmp_path / "t.safetensors").forward(graph) == pytest.approx(
        sum(clipped) / 3, rel=1e-5, abs=1e-5)
    with pytest.raises(blink.BlinkError, match="member 3 of 3"):
        native.forward_member(3, graph)
    with pytest.raises(ValueError, match="share hidden, layers, clip"):
        gnn.GnnEnsemble([nets[0], _random_net(graph, 7, hidden=8)])


def test_random_graphs_and_clip(tmp_path):
    rng = np.random.default_rng(3)
    nf, ng = len(gnn.node_feature_names()), len(gnn.graph_feature_names())
    for n in (1, 2, 17, 300):
        e = rng.integers(0, n, size=(3 * n, 2))
        graph = {"x": rng.normal(size=(n, nf)), "edges": e, "g": rng.normal(size=ng).tolist()}
        m = _random_net(graph, n, hidden=8, layers=3)
        gnn.save(m, tmp_path / "r.safetensors", dtype=torch.float64)
        with torch.no_grad():
            ref = float(m.forward_graph(graph))
        ours = gnn.load_native(tmp_path / "r.safetensors").forward(graph)
        assert ours == pytest.approx(ref, rel=1e-5, abs=1e-5)
    # clipping: the same net with a narrow clip answers the bound
    m = _random_net(graph, 5, hidden=8, clip=(-1e-4, 1e-4))
    gnn.save(m, tmp_path / "c.safetensors")
    assert abs(gnn.load_native(tmp_path / "c.safetensors").forward(graph)) == pytest.approx(1e-4)
    empty = {"x": np.zeros((0, nf)), "edges": np.zeros((0, 2)), "g": [0.0] * ng}
    assert gnn.load_native(tmp_path / "c.safetensors").forward(empty) == 0.0
    with pytest.raises(blink.BlinkError, match="names a node outside"):
        gnn.load_native(tmp_path / "c.safetensors").forward(
            {"x": np.zeros((2, nf)), "edges": [[0, 2]], "g": [0.0] * ng})


def test_unit_corrections_count_by_their_share_of_the_unit_time(graphs, tmp_path):
    """The per-unit term: with the pooled head silenced and node corrections u = A on the
    convolutions, B elsewhere, the correction is log((T_conv e^A + T_rest e^B) / T), T the unit
    times the graph carries, in C++ as in PyTorch; a uniform u = A gives exactly A."""
    _t, graph = graphs["resnet18-inference"]
    x = np.asarray(graph["x"])
    names = gnn.node_feature_names()
    # units without a kernel (views) weigh MIN_UNIT_US
    times = np.maximum(np.expm1(x[:, names.index("log_time_us")]), gnn.MIN_UNIT_US)
    conv = x[:, names.index("kind_conv")] == 1.0
    assert 0.2 < times[conv].sum() / times.sum() < 0.99
    m = gnn.UnitGNN(hidden=4, layers=0, clip=(-5.0, 5.0)).double()
    a, b = 0.7, -0.4
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.node_std.fill_(1.0)
        m.graph_std.fill_(1.0)
        # h = relu(kind_conv), 1 on convolutions, 0 elsewhere; u = (a - b) h + b
        m.inp.weight[0, names.index("kind_conv")] = 1.0
        m.node_head.weight[0, 0] = a - b
        m.node_head.bias.fill_(b)
    want = math.log((times[conv].sum() * math.exp(a) + times[~conv].sum() * math.exp(b))
                    / times.sum())
    gnn.save(m, tmp_path / "w.safetensors", dtype=torch.float64)
    with torch.no_grad():
        assert float(m.forward_graph(graph)) == pytest.approx(want, rel=1e-9)
    assert gnn.load_native(tmp_path / "w.safetensors").forward(graph) == pytest.approx(
        want, rel=1e-9)
    # not the unweighted mean of the units' corrections
    assert abs(want - (a * conv.mean() + b * (1 - conv.mean()))) > 0.05
    with torch.no_grad():
        m.node_head.weight.zero_()
        m.node_head.bias.fill_(a)
    gnn.save(m, tmp_path / "u.safetensors", dtype=torch.float64)
    assert gnn.load_native(tmp_path / "u.safetensors").forward(graph) == pytest.approx(a, abs=1e-12)


def test_ablation_without_the_unit_term_is_the_pooled_head_and_cannot_be_saved(graphs, tmp_path):
    """unit_term=False (benchmarks/gnn_readout.py's baseline) answers the pooled head alone: the
    same weights with a zero per-unit correction give the same value, a non-zero one another;
    save() refuses it, since the C++ forward always applies the term."""
    _t, graph = graphs["gpt2-train"]
    full = _random_net(graph, 3, hidden=8)
    pooled = gnn.UnitGNN(hidden=8, layers=2, clip=full.clip, unit_term=False).double()
    pooled.load_state_dict(full.state_dict())
    with torch.no_grad():
        a, b = float(full.forward_graph(graph)), float(pooled.forward_graph(graph))
        assert abs(a - b) > 1e-3
        full.node_head.weight.zero_()
        full.node_head.bias.zero_()
        assert float(full.forward_graph(graph)) == pytest.approx(b, abs=1e-12)
    with pytest.raises(ValueError, match="unit_term=False"):
        gnn.save(pooled, tmp_path / "p.safetensors")
    assert not (tmp_path / "p.safetensors").exists()


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path: Path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def _meta(key, value):
    def fn(h, d):
        h["__metadata__"][key] = value
        return h, d
    return fn


def _tensor(name, key, value):
    def fn(h, d):
        h[name][key] = value
        return h, d
    return fn


def _drop(name):
    def fn(h, d):
        del h[name]
        return h, d
    return fn


BAD = [
    ("version", _meta("format_version", "1"), "format_version 1"),
    ("version_2", _meta("format_version", "2"), "format_version 2; this build reads version 3"),
    ("format", _meta("format", "other"), "format is not \"blink.gnn\""),
    ("schema", _meta("node_features", json.dumps(["a"])), "feature names differ"),
    ("hidden", _meta("hidden", "12"), "has shape [24, 22], the config implies [12, 22]"),
    ("members", _meta("members", "2"), "tensor \"members.1.node_mean\" is missing"),
    ("no_members", _meta("members", "0"), "members 0 out of range"),
    ("dtype", _tensor("members.0.inp.bias", "dtype", "I64"), "dtype I64"),
    ("offsets", _tensor("members.0.head.bias", "data_offsets", [0, 10 ** 9]), "do not span"),
    ("missing", _drop("members.0.readout.weight"),
     "tensor \"members.0.readout.weight\" is missing"),
    ("no_node_head", _drop("members.0.node_head.weight"),
     "tensor \"members.0.node_head.weight\" is missing"),
    ("truncated", lambda h, d: (h, d[: len(d) // 2]), "past the end of the file"),
]


def test_bad_weight_files_in_a_subprocess(graphs, tmp_path):
    _t, graph = graphs["resnet18-inference"]
    good = tmp_path / "good.safetensors"
    gnn.save(_random_net(graph, 0), good)
    paths = {}
    for case, edit, _msg in BAD:
        h, d = edit(*_header(good))
        paths[case] = str(tmp_path / f"{case}.safetensors")
        _write(Path(paths[case]), h, d)
    raw = good.read_bytes()
    paths["short"] = str(tmp_path / "short.safetensors")
    Path(paths["short"]).write_bytes(raw[:5])
    paths["length"] = str(tmp_path / "length.safetensors")
    Path(paths["length"]).write_bytes(struct.pack("<Q", 2 ** 62) + raw[8:])
    probe = ("import json, sys\nfrom blink import _C\nout = {}\n"
             "for k, p in json.loads(sys.argv[1]).items():\n"
             "    try:\n        _C.load_gnn(p)\n        out[k] = 'LOADED'\n"
             "    except _C.Error as e:\n        out[k] = 'ERR ' + str(e)\n"
             "print(json.dumps(out))\n")
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(paths)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    for case, _edit, msg in BAD + [("short", None, "shorter than a safetensors header"),
                                   ("length", None, "exceeds the file")]:
        assert res[case].startswith("ERR " + paths[case]), (case, res[case])
        assert msg in res[case], (case, res[case])


def test_predict_uses_the_gnn(graphs, tmp_path, monkeypatch):
    t, graph = graphs["resnet18-inference"]
    d = tmp_path / "m"
    d.mkdir()
    # a two-member seed ensemble, as blink train ships (three there)
    m = gnn.GnnEnsemble([_random_net(graph, s, clip=(-0.5, 0.5)) for s in (7, 8)])
    gnn.save(m, d / "gnn.safetensors")
    card = {"format_version": 1, "feature_schema_version": 1, "forests": {},
            "gnn": {"file": "gnn.safetensors"}}
    (d / "card.json").write_text(json.dumps(card))
    monkeypatch.setenv("BLINK_MODELS_DIR", str(d))
    # host_time="table": the graph gnn.unit_graph builds is the table-host one
    base = predict_trace(t, GPU, predictor="analytic", host_time="table")
    p = predict_trace(t, GPU, host_time="table")
    with torch.no_grad():
        c = float(m.forward_graph(gnn.unit_graph(t, GPU)))
    assert p.predictor == "gnn"
    assert p.time_ms == pytest.approx(base.time_ms * math.exp(c), rel=1e-5)
    assert p.gpu_busy_ms == base.gpu_busy_ms  # per-unit schedule unchanged
    assert any("from the GNN" in n and "the mean of its 2 seed members" in n for n in p.notes)
    assert predict_trace(t, GPU, host_time="table").to_dict() == p.to_dict()  # deterministic
    # a corrupt GNN is a clear error, not a silent analytic answer
    (d / "gnn.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    learned._CACHE.clear()
    (d / "card.json").write_text(json.dumps(card) + " ")  # new mtime/size: reload
    with pytest.raises(ArtifactError, match="gnn.safetensors: not a usable Blink GNN"):
        predict_trace(t, GPU)
