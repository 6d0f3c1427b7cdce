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


def main() -> None:
    estimate = blink.compile.inductor_estimator("H100-SXM")
    seen: list[tuple[str, float]] = []

    def logged(snode: object) -> float:
        ms = estimate(snode)
        seen.append((type(snode).__name__, ms))
        return ms

    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256))
    x = torch.randn(64, 256)
    with inductor_config.patch(
        estimate_op_runtime=logged,
        # the built-in pass that asks every node's runtime (torch/_inductor/comms.py)
        reorder_for_compute_comm_overlap=True,
        reorder_for_compute_comm_overlap_passes=["reorder_compute_for_overlap"],
    ):
        out = torch.compile(net)(x)
    assert torch.allclose(out, net(x), atol=1e-4)
    for name, ms in seen:
        print(f"{name:<32} {ms * 1e3:9.2f} us on H100-SXM")


if __name__ == "__main__":
    main()
