"""README's Use section runs exactly as written: every python block and every `blink` command,
in a fresh process each, in a scratch directory (they write timeline.json, out.json, ...)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _use_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    use = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    return [(lang, body) for lang, body in re.findall(r"```(\w*)\n(.*?)```", use, flags=re.S)]


def _commands() -> list[str]:
    out = []
    for lang, body in _use_blocks():
        if lang == "":
            for line in body.splitlines():
                cmd = line.split("  #", 1)[0].strip()
                if cmd.startswith("blink "):
                    out.append(cmd)
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_use_section_has_examples():
    blocks = _use_blocks()
    assert sum(1 for lang, _ in blocks if lang == "python") >= 3
    assert len(_commands()) >= 6


@pytest.mark.parametrize("index", range(sum(1 for lang, _ in _use_blocks() if lang == "python")))
def test_python_block_runs(index, tmp_path):
    body = [b for lang, b in _use_blocks() if lang == "python"][index]
    r = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("cmd", _commands())
def test_command_runs(cmd, tmp_path):
    exe = Path(sys.executable).parent / "blink"
    args = shlex.split(cmd)
    r = subprocess.run([str(exe), *args[1:]], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() or r.stderr.strip()
    for path in re.findall(r"-o (\S+)", cmd):
        assert (tmp_path / path).stat().st_size > 0
