"""The graph stage's network in PyTorch: message passing over the unit graph, predicting a log
correction of the end-to-end time. The C++ core re-implements its forward pass
(csrc/core/gnn.cpp, blink._C.Gnn) so predict needs no torch_geometric; the two must agree
(tests/test_gnn.py). Training lives in blink/train/; this module only defines the network, its
inputs (`unit_graph`) and its safetensors format (`save` / `load_native`).

Format: safetensors; `__metadata__` holds format "blink.gnn", format_version, hidden, layers,
clip and the node / graph feature names (JSON strings), checked by the C++ loader.
"""
from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn

from ._ext import load

_C = load()

FORMAT = "blink.gnn"
FORMAT_VERSION = 1


def node_feature_names() -> list[str]:
    return list(_C.gnn_node_feature_names())


def graph_feature_names() -> list[str]:
    return list(_C.gnn_graph_feature_names())


def unit_graph(t: Any, gpu: Any, *, models: Any = None, allow_tf32_matmul: bool = False,
               allow_tf32_cudnn: bool = True) -> dict[str, Any]:
    """The GNN's input for a Trace on `gpu`, built in C++ exactly as predict builds it: {x:
    float64 array units x node_features, edges: int64 array E x 2 (producer, consumer unit
    index), g: graph features, op: unit op ids, ...}. `models`: a blink.learned.LearnedModels
    whose forests set the node times first (as predict does), or None for analytic times."""
    from .cost import core_gpu_spec

    um = models.unit_models if models is not None and models.forests else None
    return t.native().unit_graph(core_gpu_spec(gpu), allow_tf32_matmul, allow_tf32_cudnn, um)


class UnitGNN(nn.Module):
    """h0 = relu(W_in x~ + b); h <- relu(S h + b + A mean_in(h) + B mean_out(h)) per layer;
    c = clip(head(relu(W_r [mean h, max h, g~] + b_r))), x~ and g~ normalised by buffers."""

    def __init__(self, hidden: int = 32, layers: int = 2, clip: tuple[float, float] = (-1.0, 1.0)):
        super().__init__()
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

    def forward(self, x: torch.Tensor, edges: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if n == 0:
            return torch.zeros((), dtype=x.dtype)
        h = torch.relu(self.inp((x - self.node_mean) / self.node_std))
        src, dst = edges[:, 0].long(), edges[:, 1].long()
        ones = torch.ones(src.shape[0], dtype=x.dtype)
        indeg = torch.zeros(n, dtype=x.dtype).index_add_(0, dst, ones).clamp(min=1.0)
        outdeg = torch.zeros(n, dtype=x.dtype).index_add_(0, src, ones).clamp(min=1.0)
        for layer in self.layers:
            m_in = torch.zeros_like(h).index_add_(0, dst, h[src]) / indeg[:, None]
            m_out = torch.zeros_like(h).index_add_(0, src, h[dst]) / outdeg[:, None]
            h = torch.relu(layer.self(h) + layer.msg_in(m_in) + layer.msg_out(m_out))
        r = torch.cat([h.mean(0), h.max(0).values, (g - self.graph_mean) / self.graph_std])
        c = self.head(torch.relu(self.readout(r)))[0]
        return c.clamp(self.clip[0], self.clip[1])

    def forward_graph(self, graph: dict[str, Any]) -> torch.Tensor:
        """forward() on a unit_graph() dict, in the module's dtype."""
        dt = self.inp.weight.dtype
        return self(torch.as_tensor(graph["x"], dtype=dt),
                    torch.as_tensor(graph["edges"], dtype=torch.int64).reshape(-1, 2),
                    torch.as_tensor(graph["g"], dtype=dt))


def save(model: UnitGNN, path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> None:
    """Write the weights and their config as safetensors (what blink._C.load_gnn reads)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
            "hidden": str(model.hidden), "layers": str(len(model.layers)),
            "clip": json.dumps(list(model.clip)),
            "node_features": json.dumps(node_feature_names()),
            "graph_features": json.dumps(graph_feature_names())}
    save_file(tensors, os.fspath(path), metadata=meta)


def load_native(path: str | os.PathLike[str]) -> Any:
    """The C++ network (blink._C.Gnn) from a saved file; blink._C.Error names a bad file."""
    return _C.load_gnn(os.fspath(path))
