"""Let Inductor's scheduling heuristics use Blink's per-kernel times for a target GPU.

Inductor asks `torch._inductor.config.estimate_op_runtime` (a callable taking a scheduler node
and returning milliseconds) whenever a pass needs a node's runtime, e.g. the compute/comm
overlap reordering. This script installs Blink's estimator for an H100 and compiles a small
model on whatever device is here (a CPU works), printing what Inductor was told.

    python examples/inductor_estimator.py
"""
from __future__ import annotations

import torch
import torch._inductor.config as inductor_config

import blink.compile


class Logged:
    """The estimator, remembering what it told Inductor (a module-level class: Inductor
    pickles its config, this callable included, into its cache key)."""

    def __init__(self, gpu: str) -> None:
        self.estimate = blink.compile.inductor_estimator(gpu)
        self.seen: list[tuple[str, float]] = []

    def __call__(self, snode: object) -> float:
        ms = self.estimate(snode)
        self.seen.append((type(snode).__name__, ms))
        return ms


def main() -> None:
    logged = Logged("H100-SXM")

    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256))
    x = torch.randn(64, 256)
    with inductor_config.patch(
        estimate_op_runtime=logged,
        fx_graph_cache=False,  # a cached graph would skip the scheduler, and Blink
        # the built-in pass that asks every node's runtime (torch/_inductor/comms.py)
        reorder_for_compute_comm_overlap=True,
        reorder_for_compute_comm_overlap_passes=["reorder_compute_for_overlap"],
    ):
        out = torch.compile(net)(x)
    assert torch.allclose(out, net(x), atol=1e-4)
    for name, ms in logged.seen:
        print(f"{name:<32} {ms * 1e3:9.2f} us on H100-SXM")


if __name__ == "__main__":
    main()
