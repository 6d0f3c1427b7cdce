"""The core's artifact readers (JSON, XGBoost forests, GNN safetensors) compiled alone, torch-free,
with AddressSanitizer + UBSan, and fed every bad file of tests/test_forest.py and
tests/test_gnn.py plus hundreds of random mutations of valid files: each must load or raise
blink::Error, and never read out of bounds, overflow or crash."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "csrc" / "core"
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    d = tmp_path_factory.mktemp("driver")
    inc = f"-I{ROOT / 'csrc' / 'include'}"
    # The readers under the sanitizers; the rest of the core (feature tables the GNN's names
    # come from) plain, to keep the build short.
    plain = []
    for src in ("features.cpp", "roofline.cpp", "gemm_cost.cpp", "conv_cost.cpp", "rnn.cpp"):
        obj = d / (src + ".o")
        subprocess.run([gxx, "-std=c++17", "-O0", "-c", inc, str(CORE / src), "-o", str(obj)],
                       check=True)
        plain.append(str(obj))
    exe = d / "driver"
    srcs = [str(CORE / s) for s in ("json.cpp", "forest.cpp", "gnn.cpp")]
    srcs.append(str(ROOT / "tests" / "core_artifact_driver.cpp"))
    out = subprocess.run([gxx, "-std=c++17", "-O1", "-g", *SANITIZE, inc, *srcs, *plain, "-o",
                          str(exe)], capture_output=True, text=True)
    if out.returncode != 0 and "asan" in out.stderr.lower():
        pytest.skip(f"this g++ cannot link AddressSanitizer: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    return exe


def _run(driver: Path, mode: str, paths: list[Path]) -> list[str]:
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    out = subprocess.run([str(driver), mode, *map(str, paths)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Sanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(paths), out.stdout[-2000:]
    results = [line.split("\t", 1)[1] for line in lines]
    for r in results:
        assert r.startswith(("OK ", "ERR ")), r
    return results


def _mutants(data: bytes, n: int, seed: int) -> list[bytes]:
    """Deterministic random edits: span deletions, digit swaps, byte insertions, number blow-ups
    and truncations."""
    rng = np.random.default_rng(seed)
    out = []
    digits = [i for i, b in enumerate(data) if chr(b).isdigit()]
    for _ in range(n):
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            op = int(rng.integers(0, 5))
            i = int(rng.integers(0, len(b)))
            if op == 0:
                del b[i:i + int(rng.integers(1, 40))]
            elif op == 1 and digits:
                j = digits[int(rng.integers(0, len(digits)))]
                if j < len(b):
                    b[j] = ord(str(int(rng.integers(0, 10))))
            elif op == 2:
                b.insert(i, int(rng.choice(list(b'[]{},:"-0123456789eE.'))))
            elif op == 3 and digits:
                j = digits[int(rng.integers(0, len(digits)))]
                b[j:j] = b"99999999999"
            else:
                del b[i:]
        out.append(bytes(b))
    return out


def test_forest_bad_files_and_mutants_under_sanitizers(driver, tmp_path):
    from test_forest import BAD, _model_doc

    paths = []
    for case, make, _message in BAD:
        p = tmp_path / f"{case}.json"
        p.write_text(make())
        paths.append(p)
    good = json.dumps(_model_doc(rounds=4)).encode()
    for i, m in enumerate(_mutants(good, 400, seed=1)):
        p = tmp_path / f"mutant{i}.json"
        p.write_bytes(m)
        paths.append(p)
    (tmp_path / "good.json").write_bytes(good)
    paths.append(tmp_path / "good.json")
    results = _run(driver, "forest", paths)
    assert results[-1].startswith("OK ")
    for (case, _make, message), r in zip(BAD, results, strict=False):
        assert r.startswith("ERR ") and message in r, (case, r)
    # the mutants exercise both outcomes
    mutant = results[len(BAD):-1]
    n_err = sum(r.startswith("ERR ") for r in mutant)
    print(f"forest mutants: {n_err} rejected, {len(mutant) - n_err} loaded and evaluated")
    assert n_err > 200


def test_gnn_bad_files_and_mutants_under_sanitizers(driver, tmp_path):
    import torch

    from blink import gnn

    torch.manual_seed(0)
    good = tmp_path / "good.safetensors"
    gnn.save(gnn.UnitGNN(hidden=8, layers=2), good)
    data = good.read_bytes()
    paths = [good]
    for i, m in enumerate(_mutants(data, 300, seed=2)):
        p = tmp_path / f"mutant{i}.safetensors"
        p.write_bytes(m)
        paths.append(p)
    # header length fields that lie
    for i, n in enumerate((0, 7, len(data), 2 ** 63, 2 ** 40)):
        p = tmp_path / f"len{i}.safetensors"
        p.write_bytes(n.to_bytes(8, "little") + data[8:])
        paths.append(p)
    results = _run(driver, "gnn", paths)
    assert results[0].startswith("OK ")
    n_err = sum(r.startswith("ERR ") for r in results[1:])
    print(f"gnn mutants: {n_err} rejected, {len(results) - 1 - n_err} loaded and run")
    assert n_err > 150
    assert all(r.startswith("ERR ") for r in results[-5:])
