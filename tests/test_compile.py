"""torch.compile cost queries on real torch.compile (CPU): the "blink" Dynamo backend sees
every graph, estimate_graph agrees with blink.predict, the Inductor estimator runs inside a
real Inductor compile, and the compiled-mode prediction fuses pointwise chains."""
from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._subclasses.fake_tensor import FakeTensorMode

import blink
import blink.compile
from blink.cli import main


class Broken(torch.nn.Module):
    """Two linear blocks with a graph break between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(y).softmax(-1)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 128)
        self.b = torch.nn.Linear(128, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.b(torch.nn.functional.gelu(self.a(x))))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    blink.compile_report(clear=True)
    yield
    torch._dynamo.reset()


def test_backend_sees_every_graph_and_runs_it_unchanged():
    torch.manual_seed(0)
    net, x = Broken(), torch.randn(8, 32)
    counter = CompileCounter()  # torch's own count of the graphs Dynamo makes
    torch.compile(net, backend=counter)(x)
    torch._dynamo.reset()
    out = torch.compile(net, backend="blink")(x)
    assert torch.equal(out, net(x))
    report = blink.compile_report()
    assert len(report) == counter.frame_count == 2
    for g in report.graphs:
        assert g.error == "" and g.prediction is not None
        assert g.time_ms > 0 and g.peak_reserved_bytes > 0 and g.gpu == "H200"
    assert report.time_ms == pytest.approx(sum(g.time_ms for g in report.graphs))
    assert "2 graph(s)" in str(report)
    assert len(blink.compile_report(clear=True)) == 2 and len(blink.compile_report()) == 0


def test_backend_for_another_gpu_and_each_graph_matches_its_part():
    net, x = Broken(), torch.randn(8, 32)
    torch.compile(net, backend=blink.compile_backend("L4"))(x)
    g0, g1 = blink.compile_report().graphs
    assert g0.gpu == g1.gpu == "L4"
    # graph 0 is a's linear + relu, graph 1 b's linear + softmax: the same ops eager predicts
    first = blink.predict(torch.nn.Sequential(net.a, torch.nn.ReLU()), inputs=(x,), gpu="L4",
                          host_time="table")
    # the same kernels; the graph (modules inlined) pays no module-call Python time
    assert g0.prediction.gpu_busy_ms == pytest.approx(first.gpu_busy_ms, rel=0.01)
    assert g0.time_ms <= first.time_ms * 1.01


def test_estimate_graph_agrees_with_predict():
    torch.manual_seed(0)
    net, x = Block(), torch.randn(16, 32)
    ref = blink.predict(net, inputs=(x,), gpu="A100-80GB", host_time="table")
    gm = torch.fx.symbolic_trace(net)
    p = blink.estimate_graph(gm, [x], gpu="A100-80GB")
    assert p.time_ms == pytest.approx(ref.time_ms, rel=0.01)
    assert p.peak_allocated_bytes == pytest.approx(ref.peak_allocated_bytes, rel=0.01)
    assert p.params == ref.params
    # fake inputs (what a compiler pass usually holds) give the same answer
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    assert blink.estimate_graph(gm, [fake], gpu="A100-80GB").time_ms == pytest.approx(p.time_ms)
    # a Dynamo graph: parameters arrive as graph inputs
    graphs = []

    def grab(g, ex):
        graphs.append((g, ex))
        return g.forward

    torch.compile(net, backend=grab)(x)
    (g, ex), = graphs
    assert any(isinstance(e, torch.nn.Parameter) for e in ex)
    dyn = blink.estimate_graph(g, ex, gpu="A100-80GB")
    # the same kernels; a Dynamo graph has its modules inlined, so no module-call Python
    assert dyn.gpu_busy_ms == pytest.approx(ref.gpu_busy_ms, rel=0.01)
    assert dyn.time_ms <= ref.time_ms * 1.01
    assert dyn.memory_by_category["weights"] == pytest.approx(
        ref.memory_by_category["weights"], rel=0.01)
    with pytest.raises(blink.ConfigError, match="GraphModule"):
        blink.estimate_graph(net, [x])


class _Logged:
    """Module-level, so Inductor can pickle it into its cache key like the estimator itself."""

    def __init__(self, gpu: str) -> None:
        self.estimate = blink.compile.inductor_estimator(gpu)
        self.seen: list[tuple[object, float]] = []

    def __call__(self, snode: object) -> float:
        ms = self.estimate(snode)
        self.seen.append((snode, ms))
        return ms

    def __getstate__(self) -> dict:  # scheduler nodes are not picklable: keep them out
        return {"estimate": self.estimate, "seen": []}


def test_inductor_estimator_inside_real_compile():
    import torch._inductor.config as ic
    from torch._inductor import scheduler

    logged = _Logged("H100-SXM")
    seen = logged.seen

    torch.manual_seed(0)
    net, x = Block(), torch.randn(64, 32)
    # caches off: a cached graph would skip the scheduler (and the estimator) on a rerun
    with ic.patch(estimate_op_runtime=logged, reorder_for_compute_comm_overlap=True,
                  fx_graph_cache=False,
                  reorder_for_compute_comm_overlap_passes=["reorder_compute_for_overlap"]):
        out = torch.compile(net)(x)
    assert torch.allclose(out, net(x), atol=1e-5)
    assert seen and all(math.isfinite(ms) and ms > 0 for _n, ms in seen)
    externs = [ms for n, ms in seen if isinstance(n, scheduler.ExternKernelSchedulerNode)]
    assert len(externs) >= 2  # the two GEMMs, costed by the GEMM rule
    # a 64x32x128 GEMM on an H100 is a few microseconds: launch-bound, nowhere near 1 ms
    assert all(1e-4 < ms < 0.1 for ms in externs)


def test_compiled_mode_fuses_a_pointwise_chain():
    class Chain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).sigmoid().tanh().neg()

    x = torch.randn(1024, 1024)
    eager = blink.predict(Chain(), inputs=(x,), gpu="H100-SXM")
    comp = blink.predict(Chain(), inputs=(x,), gpu="H100-SXM", compiled=True)
    assert comp.compiled and not eager.compiled
    fused = [u for u in comp.units if u.kind == "fused"]
    assert len(fused) == 1 and len(eager.units) == 4
    # one kernel reads x once and writes the result once; eager moves 4 times that
    assert fused[0].bytes == 2 * x.numel() * 4
    assert sum(u.bytes for u in eager.units) == 4 * fused[0].bytes
    assert comp.time_ms < eager.time_ms
    assert sum(r.wall_ms for r in comp.breakdown("phase")) == pytest.approx(comp.time_ms)
    # memory: eager holds x and two intermediates at once; the fused kernel only x and its output
    mib4 = x.numel() * 4
    assert eager.peak_allocated_bytes == 3 * mib4
    assert comp.peak_allocated_bytes == 2 * mib4
    assert comp.memory_by_category["activations"] == mib4


def test_compiled_mode_keeps_gemms_and_cli_says_so(capsys):
    eager = blink.predict("torchvision:resnet18", batch_size=8, mode="train")
    comp = blink.predict("torchvision:resnet18", batch_size=8, mode="train", compiled=True)
    kinds = {u.kind for u in comp.units}
    assert "fused" in kinds and "conv" in kinds
    convs = [u.time_ms for u in eager.units if u.kind == "conv"]
    assert sorted(u.time_ms for u in comp.units if u.kind == "conv") == sorted(convs)
    assert len(comp.units) < len(eager.units)
    assert comp.gpu_busy_ms < eager.gpu_busy_ms and comp.time_ms < eager.time_ms
    # the optimizer step is not compiled by torch.compile(model): its units stay
    opt = sorted(u.op for u in eager.units if u.phase == "optimizer")
    assert sorted(u.op for u in comp.units if u.phase == "optimizer") == opt
    assert main(["predict", "torchvision:resnet18", "-b", "8", "--compiled"]) == 0
    out = capsys.readouterr().out
    assert "compiled" in out.splitlines()[0] and "fused[" in out


def test_inductor_example_runs():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "examples" / "inductor_estimator.py")],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in r.stdout.splitlines() if x.endswith("us on H100-SXM")]
    assert any(x.startswith("ExternKernelSchedulerNode") for x in lines) and len(lines) >= 3
