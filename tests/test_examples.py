"""The scripts in examples/ run as written (each in its own interpreter, as a user runs them)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args: list[str], cwd: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def test_trace_model_example(tmp_path):
    out = _run([os.path.join(ROOT, "examples", "trace_model.py"), "--out", "t.json"],
               str(tmp_path))
    assert "aten::convolution" in out and (tmp_path / "t.json").stat().st_size > 1000


def test_predict_and_plan_example(tmp_path):
    out = _run([os.path.join(ROOT, "examples", "predict_and_plan.py"), "--plot", "s.svg"],
               str(tmp_path))
    assert "largest batch" in out and "<- best" in out and "1.00x" in out
    assert (tmp_path / "s.svg").read_bytes().lstrip().startswith(b"<?xml")


def test_call_service_example(tmp_path):
    out = _run([os.path.join(ROOT, "examples", "call_service.py")], str(tmp_path))
    assert "health: ok" in out and "optimize-batch: largest" in out
    assert "a code string as model: 422" in out
