"""The GNN's training set: the unit graph of every cached timm model, twice.

For each model of the timm cache (blink/train/timm_cache.py: same build, batch, image size,
GPU and math settings), the trace is cut into units and turned into the GNN's input exactly as
``blink.predict`` builds it (C++ ``build_unit_graph``):

- ``analytic``: node times from the analytic engine (what the GNN corrects without forests);
- ``trees``: node times from the shipped per-unit forests (``models/``), timeline re-run with
  them (what predict hands the GNN when forests are present), on the RTX 3090 also by forests
  whose card range of GPU generations does not reach it (the GNN applies there, so predict
  extrapolates them on purpose).

Beside each graph, the end-to-end time of the forests' timeline as predict makes it where no
GNN applies: such forests off (``forests_ms``, what the ``trees`` predictor is judged on).

Stored as one compressed ``.npz`` of plain arrays (``numpy.load(..., allow_pickle=False)``),
with a provenance JSON naming the forests' sha256 the ``trees`` graphs were built with: a
retrained forest makes them stale, and ``load_graphs`` says so.

    python -m blink.train.timm_graphs           # or: blink train --refresh-timm
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .timm_cache import GPU, _git_commit, build_model, default_cache_path, load_cache

__all__ = ["GRAPHS_NAME", "GraphSet", "build_graphs", "default_graphs_path", "load_graphs"]

GRAPHS_NAME = "timm_rtx3090_graphs.npz"
VARIANTS = ("analytic", "trees")
# The node features the two variants differ in (the rest are the unit's own).
TREE_COLUMNS = ("log_time_us", "log_ratio", "from_trees")


def _kind_columns(names: list[str]) -> list[int]:
    return [j for j, n in enumerate(names) if n.startswith("kind_")]


def default_graphs_path() -> Path:
    return default_cache_path().with_name(GRAPHS_NAME)


def _provenance_path(path: Path) -> Path:
    return path.with_suffix(".provenance.json")


# The card fields that change a forest's unit times besides its file (blink/learned.py).
_APPLIED_FIELDS = ("features", "clip", "scale", "ops", "cc_major_range")


def forest_hashes(models_dir: Path, forests: dict[str, Any] | None = None) -> dict[str, str]:
    """Per forest of `models_dir` (those `forests` ({kind: card entry}) names, by default those
    its card.json ships): the sha256 of its file and of the card fields that change how predict
    applies it (a new scale leaves the file as it was but not the graphs)."""
    from .data import sha256_file

    if forests is None:
        forests = json.loads((models_dir / "card.json").read_text()).get("forests", {})
    out = {}
    for k, e in sorted(forests.items()):
        applied = json.dumps({f: e.get(f) for f in _APPLIED_FIELDS}, sort_keys=True)
        both = sha256_file(models_dir / e["file"]) + applied
        out[k] = hashlib.sha256(both.encode()).hexdigest()
    return out


class GraphWriter:
    """Collects the two graph variants of traced timm models and writes the cache."""

    def __init__(self, models_dir: Path, forests: dict[str, Any] | None = None) -> None:
        from ..cost import core_gpu_spec
        from ..hardware import get_gpu
        from ..learned import load_models

        models = load_models(models_dir)
        if models is None or not models.forests:
            raise FileNotFoundError(f"{models_dir}: no forests to build the 'trees' graphs "
                                    "with; run `blink train` first")
        self.unit_models = models.unit_models
        self.hashes = forest_hashes(models_dir, forests)
        self.spec = core_gpu_spec(get_gpu(GPU))
        self.commit = _git_commit()
        self.t0 = time.time()
        self.names: list[str] = []
        self.sizes: list[tuple[int, int]] = []
        self.x: dict[str, list[np.ndarray]] = {v: [] for v in VARIANTS}
        self.g: dict[str, list[np.ndarray]] = {v: [] for v in VARIANTS}
        self.edges: list[np.ndarray] = []
        self.forests_ms: list[float] = []
        self.node_names: list[str] = []
        self.graph_names: list[str] = []

    def add(self, name: str, batch: int, img: int, t: Any) -> None:
        native = t.native()
        # timm's benchmark: TF32 matmul on, cudnn.benchmark on (as in the timm cache).
        ga = native.unit_graph(self.spec, True, True, None, True)
        gt = native.unit_graph(self.spec, True, True, self.unit_models, True,
                               extrapolate_forests=True)
        if not np.array_equal(ga["edges"], gt["edges"]):
            raise RuntimeError(f"{name}: the two graph variants have different edges")
        self.node_names, self.graph_names = list(ga["node_features"]), list(ga["graph_features"])
        self.names.append(name)
        self.sizes.append((int(batch), int(img)))
        for v, gr in (("analytic", ga), ("trees", gt)):
            self.x[v].append(np.asarray(gr["x"], dtype=np.float32))
            self.g[v].append(np.asarray(gr["g"], dtype=np.float64))
        self.edges.append(np.asarray(ga["edges"], dtype=np.int32).reshape(-1, 2))
        # The timeline alone (no graph): forests outside their generations left analytic.
        gf = native.cost(self.spec, True, True, "table", cudnn_benchmark=True,
                         models=self.unit_models)
        self.forests_ms.append(float(gf["end_to_end_s"]) * 1e3)

    def write(self, out: Path, cache: Path, command: str) -> Path:
        from .data import sha256_file

        nn, gn = self.node_names, self.graph_names
        xa = np.concatenate(self.x["analytic"]) if self.names else np.zeros((0, len(nn)),
                                                                              np.float32)
        xt = np.concatenate(self.x["trees"]) if self.names else xa
        e_all = np.concatenate(self.edges) if self.edges else np.zeros((0, 2), np.int32)
        kinds = _kind_columns(nn)
        scal = [j for j in range(len(nn)) if j not in kinds]
        tree_cols = [nn.index(c) for c in TREE_COLUMNS]
        if not np.array_equal(np.delete(xa, tree_cols, axis=1),
                              np.delete(xt, tree_cols, axis=1)):
            raise RuntimeError("the trees graphs differ from the analytic ones outside "
                               f"{', '.join(TREE_COLUMNS)}")
        n_nodes = [x.shape[0] for x in self.x["analytic"]]
        n_edges = [e.shape[0] for e in self.edges]
        # Compact: the kind one-hot as one index, the trees variant as its three own columns,
        # the edge list delta-coded (it is sorted by producer).
        arrays = {
            "model": np.array(self.names),
            # (batch, image side): one timm name may be benchmarked at several image sizes
            "batch_img": np.array(self.sizes, dtype=np.int64).reshape(-1, 2),
            "node_offsets": np.concatenate([[0], np.cumsum(n_nodes)]).astype(np.int64),
            "edge_offsets": np.concatenate([[0], np.cumsum(n_edges)]).astype(np.int64),
            "edges_delta": np.diff(e_all, axis=0, prepend=np.zeros((1, 2), np.int32)),
            "node_features": np.array(nn),
            "graph_features": np.array(gn),
            "scalars": xa[:, scal],
            "kind": np.argmax(xa[:, kinds], axis=1).astype(np.uint8) if len(kinds) else
            np.zeros(len(xa), np.uint8),
            "trees_columns": xt[:, tree_cols],
            "forests_ms": np.array(self.forests_ms, dtype=np.float64),
        }
        for v in VARIANTS:
            arrays[f"g_{v}"] = np.stack(self.g[v]) if self.g[v] else np.zeros((0, len(gn)))
        out.parent.mkdir(parents=True, exist_ok=True)
        # np.savez_compressed stamps no time, so the same graphs give the same bytes.
        np.savez_compressed(out, **arrays)
        prov = {
            "format_version": 1, "file": out.name,
            "timm_cache": {"path": cache.name, "sha256": sha256_file(cache)},
            "forests_sha256": self.hashes,
            "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "blink_commit": self.commit, "gpu": GPU, "dtype": "amp-fp16", "mode": "inference",
            "models": len(self.names), "nodes": int(arrays["node_offsets"][-1]),
            "edges": int(arrays["edge_offsets"][-1]), "command": command,
            "seconds": round(time.time() - self.t0, 1),
        }
        _provenance_path(out).write_text(json.dumps(prov, indent=1) + "\n")
        return out


def build_graphs(models_dir: Path, out: Path | None = None, cache: Path | None = None,
                 log: Any = sys.stderr, forests: dict[str, Any] | None = None) -> Path:
    """Trace every cached timm model and write both graph variants of each (the trees variant
    with `models_dir`'s forests: those `forests` names, default its card's)."""
    cache = cache or default_cache_path()
    rows = load_cache(cache)
    w = GraphWriter(models_dir, forests)
    for i, r in enumerate(rows):
        t, _ = build_model(r["model"], int(r["batch"]), int(r["img_size"]))
        w.add(r["model"], int(r["batch"]), int(r["img_size"]), t)
        if log is not None and (i + 1) % 50 == 0:
            print(f"timm graphs: {i + 1}/{len(rows)} models, {time.time() - w.t0:.0f}s",
                  file=log)
    return w.write(out or default_graphs_path(), cache, "python -m blink.train.timm_graphs")


@dataclass
class GraphSet:
    """The cached graphs: graph i's nodes are rows node_offsets[i]:node_offsets[i+1] of x_*, its
    edges rows edge_offsets[i]:edge_offsets[i+1] of `edges` (node indices local to the graph)."""

    model: np.ndarray
    batch_img: np.ndarray       # graph i's (batch, image side)
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    edges: np.ndarray
    x: dict[str, np.ndarray]
    g: dict[str, np.ndarray]
    node_features: list[str]
    graph_features: list[str]
    provenance: dict[str, Any]
    # per graph: the forests' timeline as predict makes it where no GNN applies (forests off on
    # a GPU generation outside their card range), ms
    forests_ms: np.ndarray

    def __len__(self) -> int:
        return int(self.model.size)

    def end_to_end_ms(self, variant: str) -> np.ndarray:
        """The timeline's end-to-end time of each graph (graph feature log1p(us))."""
        j = self.graph_features.index("log_end_to_end_us")
        return np.expm1(self.g[variant][:, j]) / 1e3


def load_graphs(path: Path | None = None, models_dir: Path | None = None,
                forests: dict[str, Any] | None = None) -> GraphSet:
    """The cached graphs. With `models_dir`, checks that the 'trees' graphs were built with its
    forests (those `forests` names, default its card's); raises ValueError naming the stale
    cache and the command that rebuilds it."""
    from ..gnn import graph_feature_names, node_feature_names

    path = path or default_graphs_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no timm graph cache; create it with "
                                "`python -m blink.train.timm_graphs` (after `blink train`)")
    prov_path = _provenance_path(path)
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    with np.load(path, allow_pickle=False) as z:
        d = {k: z[k] for k in z.files}
    nf, gf = [str(s) for s in d["node_features"]], [str(s) for s in d["graph_features"]]
    if nf != node_feature_names() or gf != graph_feature_names():
        raise ValueError(f"{path}: built with other GNN features than this blink computes; "
                         "rebuild with `python -m blink.train.timm_graphs`")
    if "forests_ms" not in d:
        raise ValueError(f"{path}: built before the forests' GPU-generation range (no "
                         "forests_ms); rebuild with `python -m blink.train.timm_graphs`")
    if models_dir is not None and prov.get("forests_sha256") != forest_hashes(models_dir,
                                                                              forests):
        raise ValueError(f"{path}: its 'trees' graphs were built with other forests than "
                         f"{models_dir}'s; rebuild with `python -m blink.train.timm_graphs`")
    kinds = _kind_columns(nf)
    scal = [j for j in range(len(nf)) if j not in kinds]
    n = d["scalars"].shape[0]
    xa = np.zeros((n, len(nf)), np.float32)
    xa[:, scal] = d["scalars"]
    if kinds:
        if n and int(d["kind"].max()) >= len(kinds):
            raise ValueError(f"{path}: a node kind is outside the {len(kinds)} unit kinds")
        xa[np.arange(n), np.asarray(kinds)[d["kind"].astype(np.int64)]] = 1.0
    xt = xa.copy()
    xt[:, [nf.index(c) for c in TREE_COLUMNS]] = d["trees_columns"]
    edges = np.cumsum(d["edges_delta"].astype(np.int64), axis=0)
    return GraphSet(d["model"].astype(str), d["batch_img"], d["node_offsets"],
                    d["edge_offsets"], edges, {"analytic": xa, "trees": xt},
                    {v: d[f"g_{v}"] for v in VARIANTS}, nf, gf, prov,
                    d["forests_ms"].astype(np.float64))


def main(argv: list[str] | None = None) -> int:
    from .pipeline import default_models_dir

    ap = argparse.ArgumentParser(prog="python -m blink.train.timm_graphs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="forests to build the trees graphs with "
                    "(default models/)")
    ap.add_argument("--out", default=None, help=f"default data/derived/{GRAPHS_NAME}")
    a = ap.parse_args(argv)
    p = build_graphs(Path(a.models) if a.models else default_models_dir(),
                     Path(a.out) if a.out else None)
    print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
