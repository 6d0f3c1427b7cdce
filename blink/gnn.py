"""The graph stage's network in PyTorch: message passing over the unit graph, predicting a log
correction of the end-to-end time. The C++ core re-implements its forward pass
(csrc/core/gnn.cpp, blink._C.Gnn) so predict needs no torch_geometric; the two must agree
(tests/test_gnn.py). Training lives in blink/train/; this module only defines the network, its
inputs (`unit_graph`) and its safetensors format (`save` / `load_native`).

Format: safetensors; `__metadata__` holds format "blink.gnn", format_version, members, hidden,
layers, clip and the node / graph feature names (JSON strings), checked by the C++ loader. The
tensors are a GnnEnsemble's state_dict: "members.<k>.<UnitGNN tensor>".
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import torch
from torch import nn

from ._ext import load

_C = load()

FORMAT = "blink.gnn"
# 3: a time-weighted per-unit correction (node_head) beside the pooled head; 2: a seed ensemble
# (members); 1 held one network.
FORMAT_VERSION = 3
# The node feature that carries the unit's time (log1p of microseconds): the per-unit
# corrections are weighted by it.
TIME_FEATURE = "log_time_us"
# Smallest weight a unit gets (microseconds), so a graph of zero-time units still has weights:
# the C++ forward's constant (csrc/include/blink/gnn.h).
MIN_UNIT_US = float(_C.kGnnMinUnitUs)


def node_feature_names() -> list[str]:
    return list(_C.gnn_node_feature_names())


def graph_feature_names() -> list[str]:
    return list(_C.gnn_graph_feature_names())


def unit_graph(t: Any, gpu: Any, *, models: Any = None, allow_tf32_matmul: bool = False,
               allow_tf32_cudnn: bool = True, cudnn_benchmark: bool = False) -> dict[str, Any]:
    """The GNN's input for a Trace on `gpu`, built in C++ exactly as predict builds it: {x:
    float64 array units x node_features, edges: int64 array E x 2 (producer, consumer unit
    index), g: graph features, op: unit op ids, ...}. `models`: a blink.learned.LearnedModels
    whose forests set the node times first (as predict does where the GNN applies: on every
    GPU generation, their card ranges notwithstanding), or None for analytic times."""
    from .cost import core_gpu_spec

    um = models.unit_models if models is not None and models.forests else None
    return t.native().unit_graph(core_gpu_spec(gpu), allow_tf32_matmul, allow_tf32_cudnn, um,
                                 cudnn_benchmark, extrapolate_forests=True)


class UnitGNN(nn.Module):
    """h0 = relu(W_in x~ + b); h <- relu(S h + b + A mean_in(h) + B mean_out(h)) per layer;
    c = clip(head(relu(W_r [mean h, max h, g~] + b_r)) + log(sum_v t_v exp(u_v) / sum_v t_v)),
    u_v = node_head(h_v), t_v the unit's time (max(expm1(x[log_time_us]), MIN_UNIT_US)), x~ and
    g~ normalised by buffers.

    The second term is a per-unit log correction averaged over the units' shares of the summed
    unit time, so each unit's correction counts by how much of the model's time it is. With mean
    / max pooling alone the network sees a unit's time only as one input among many and learns
    mostly one model-wide shrink. Its held-out effect: benchmarks/gnn_readout.py."""

    def __init__(self, hidden: int = 32, layers: int = 2, clip: tuple[float, float] = (-1.0, 1.0),
                 unit_term: bool = True):
        super().__init__()
        # unit_term=False drops the per-unit term (the pooled head alone, format 2's network):
        # for the ablation in benchmarks/gnn_readout.py only; save() refuses it.
        self.unit_term = bool(unit_term)
        nf, ng = len(node_feature_names()), len(graph_feature_names())
        self.hidden, self.clip = hidden, (float(clip[0]), float(clip[1]))
        self.register_buffer("node_mean", torch.zeros(nf))
        self.register_buffer("node_std", torch.ones(nf))
        self.register_buffer("graph_mean", torch.zeros(ng))
        self.register_buffer("graph_std", torch.ones(ng))
        self.inp = nn.Linear(nf, hidden)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            layer = nn.Module()
            layer.self = nn.Linear(hidden, hidden)
            layer.msg_in = nn.Linear(hidden, hidden, bias=False)
            layer.msg_out = nn.Linear(hidden, hidden, bias=False)
            self.layers.append(layer)
        self.readout = nn.Linear(2 * hidden + ng, hidden)
        self.head = nn.Linear(hidden, 1)
        self.node_head = nn.Linear(hidden, 1)
        self.time_index = node_feature_names().index(TIME_FEATURE)

    def forward(self, x: torch.Tensor, edges: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return torch.zeros((), dtype=x.dtype)
        seg = torch.zeros(x.shape[0], dtype=torch.int64)
        return self.forward_batch(x, edges, g[None, :], seg)[0]

    def forward_batch(self, x: torch.Tensor, edges: torch.Tensor, g: torch.Tensor,
                      seg: torch.Tensor) -> torch.Tensor:
        """forward() of B disjoint graphs at once (training): x holds every graph's nodes,
        `edges` global node indices, g is B x graph_features, seg[i] the graph of node i (every
        graph non-empty). Returns the B corrections."""
        n, b = x.shape[0], g.shape[0]
        h = torch.relu(self.inp((x - self.node_mean) / self.node_std))
        src, dst = edges[:, 0].long(), edges[:, 1].long()
        ones = torch.ones(src.shape[0], dtype=x.dtype)
        indeg = torch.zeros(n, dtype=x.dtype).index_add_(0, dst, ones).clamp(min=1.0)
        outdeg = torch.zeros(n, dtype=x.dtype).index_add_(0, src, ones).clamp(min=1.0)
        for layer in self.layers:
            m_in = torch.zeros_like(h).index_add_(0, dst, h[src]) / indeg[:, None]
            m_out = torch.zeros_like(h).index_add_(0, src, h[dst]) / outdeg[:, None]
            h = torch.relu(layer.self(h) + layer.msg_in(m_in) + layer.msg_out(m_out))
        count = torch.zeros(b, dtype=x.dtype).index_add_(0, seg, torch.ones(n, dtype=x.dtype))
        mean = torch.zeros(b, h.shape[1], dtype=x.dtype).index_add_(0, seg, h) / count[:, None]
        # h >= 0 after the ReLU, so a zero start is the max of a non-empty graph (as in C++).
        mx = torch.zeros(b, h.shape[1], dtype=x.dtype).scatter_reduce(
            0, seg[:, None].expand(-1, h.shape[1]), h, reduce="amax", include_self=True)
        r = torch.cat([mean, mx, (g - self.graph_mean) / self.graph_std], dim=1)
        c = self.head(torch.relu(self.readout(r)))[:, 0]
        if not self.unit_term:
            return c.clamp(self.clip[0], self.clip[1])
        # log(sum t exp(u) / sum t) per graph, shifted by the graph's max u (no overflow).
        u = self.node_head(h)[:, 0]
        t = torch.expm1(x[:, self.time_index]).clamp(min=MIN_UNIT_US)
        umax = torch.full((b,), -math.inf, dtype=x.dtype).scatter_reduce(
            0, seg, u, reduce="amax", include_self=True)
        num = torch.zeros(b, dtype=x.dtype).index_add_(0, seg, t * torch.exp(u - umax[seg]))
        den = torch.zeros(b, dtype=x.dtype).index_add_(0, seg, t)
        c = c + umax + torch.log(num / den)
        return c.clamp(self.clip[0], self.clip[1])

    def forward_graph(self, graph: dict[str, Any]) -> torch.Tensor:
        """forward() on a unit_graph() dict, in the module's dtype."""
        dt = self.inp.weight.dtype
        return self(torch.as_tensor(graph["x"], dtype=dt),
                    torch.as_tensor(graph["edges"], dtype=torch.int64).reshape(-1, 2),
                    torch.as_tensor(graph["g"], dtype=dt))


class GnnEnsemble(nn.Module):
    """K UnitGNNs of one configuration (trained from different seeds): the correction is the
    mean of the members' clipped corrections, as the C++ Gnn::forward computes it."""

    def __init__(self, members: list[UnitGNN]):
        super().__init__()
        if not members:
            raise ValueError("a GnnEnsemble needs at least one member")
        first = members[0]
        for m in members[1:]:
            if ((m.hidden, len(m.layers), m.clip, m.unit_term)
                    != (first.hidden, len(first.layers), first.clip, first.unit_term)):
                raise ValueError("the members of a GnnEnsemble must share hidden, layers, clip, "
                                 "unit_term")
        self.members = nn.ModuleList(members)
        self.hidden, self.clip = first.hidden, first.clip

    def _mean(self, method: str, *args: Any) -> torch.Tensor:
        return torch.stack([getattr(m, method)(*args) for m in self.members]).mean(dim=0)

    def forward(self, x: torch.Tensor, edges: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return self._mean("forward", x, edges, g)

    def forward_batch(self, x: torch.Tensor, edges: torch.Tensor, g: torch.Tensor,
                      seg: torch.Tensor) -> torch.Tensor:
        return self._mean("forward_batch", x, edges, g, seg)

    def forward_graph(self, graph: dict[str, Any]) -> torch.Tensor:
        return self._mean("forward_graph", graph)


_ST_DTYPES = {torch.float32: "F32", torch.float64: "F64"}


def save(model: UnitGNN | GnnEnsemble, path: str | os.PathLike[str],
         dtype: torch.dtype = torch.float32) -> None:
    """Write the weights and their config as safetensors (what blink._C.load_gnn reads); a
    single UnitGNN is written as an ensemble of one.

    Written here rather than by safetensors.save_file, whose header orders the metadata by a
    per-process hash: the same network must give the same bytes (blink train is deterministic).
    The layout is the safetensors format: an 8-byte little-endian header length, a JSON header
    (tensors by name with dtype, shape and data offsets, plus __metadata__), padded with spaces
    to a multiple of 8, then the tensors' little-endian bytes in header order."""
    if dtype not in _ST_DTYPES:
        raise ValueError(f"dtype {dtype} is not one of {', '.join(map(str, _ST_DTYPES))}")
    ens = model if isinstance(model, GnnEnsemble) else GnnEnsemble([model])
    if not ens.members[0].unit_term:
        raise ValueError("a network without the per-unit term (unit_term=False) is an ablation: "
                         "the C++ forward always applies that term, so it cannot be saved")
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in ens.state_dict().items()}
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
            "members": str(len(ens.members)),
            "hidden": str(ens.hidden), "layers": str(len(ens.members[0].layers)),
            "clip": json.dumps(list(ens.clip)),
            "node_features": json.dumps(node_feature_names()),
            "graph_features": json.dumps(graph_feature_names())}
    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        b = tensors[name].numpy().astype(tensors[name].numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.fspath(path), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_native(path: str | os.PathLike[str]) -> Any:
    """The C++ network (blink._C.Gnn) from a saved file; blink._C.Error names a bad file."""
    return _C.load_gnn(os.fspath(path))
