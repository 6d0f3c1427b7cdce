"""The CLI, `python -m blink.info`, the load error and the torch-free C++17 core."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import blink
from blink.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_cli_trace_table(capsys):
    assert main(["trace", "torchvision:resnet18", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "aten::conv2d" in out and "model=torchvision:resnet18" in out


def test_cli_trace_json(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["trace", "hf:gpt2", "-b", "1", "--seq-len", "16", "--dtype", "bf16",
                 "--mode", "train", "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["format"] == "blink.trace" and doc["meta"]["dtype"] == "bf16"
    t = blink.Trace.from_json(path)
    assert {op.phase for op in t.ops} == {"forward", "backward", "optimizer"}


def test_cli_errors_are_one_line(capsys):
    assert main(["trace", "torchvision:nope", "-b", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blink: error: unknown model 'torchvision:nope'")
    assert main(["trace", "torchvision:resnet18", "-b", "0"]) == 2
    assert "batch_size must be a positive integer" in capsys.readouterr().err


def test_console_script_and_module():
    exe = Path(sys.executable).parent / "blink"
    out = subprocess.run([str(exe), "models"], capture_output=True, text=True, check=True)
    assert "hf:llama-7b" in out.stdout
    info = subprocess.run([sys.executable, "-m", "blink.info"], capture_output=True, text=True,
                          check=True)
    assert "built_for_torch" in info.stdout and "extension" in info.stdout


def test_load_error_names_versions(tmp_path):
    # A package copy without the compiled module: the import error must say what to do.
    pkg = tmp_path / "blink"
    shutil.copytree(ROOT / "blink", pkg,
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    (pkg / "_build.json").write_text(json.dumps({"torch_version": "2.11.0",
                                                 "python_version": "3.12"}))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # Drop the editable-install finder so that the copy, not the checkout, is imported.
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'editable' not in repr(f).lower()]; import blink; print(blink.__file__); "
            "blink.Trace")  # attributes load lazily: the first use loads the extension
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert out.returncode != 0
    assert "built for torch 2.11.0 / Python 3.12" in out.stderr
    assert "pip install --no-build-isolation" in out.stderr


def test_core_is_torch_free_cxx17():
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    core = sorted((ROOT / "csrc" / "core").glob("*.cpp"))
    for header in (ROOT / "csrc" / "include" / "blink").glob("*.h"):
        text = header.read_text()
        for banned in ("<torch/", "<ATen/", "<c10/", "<pybind11/"):
            assert banned not in text, f"{header.name} includes {banned}"
    for src in core:
        subprocess.run([gxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror",
                        f"-I{ROOT / 'csrc' / 'include'}", str(src)], check=True)
