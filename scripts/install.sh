#!/usr/bin/env bash
# Set up a fresh machine (idempotent): .venv with torch 2.14.1 / torchvision 0.29.1 and the
# test dependencies, then build blink's extension into it (editable, so tests see the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${BLINK_PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-dev.txt
# --no-build-isolation: compile against the torch installed above; MAX_JOBS=2 for 2 cores.
MAX_JOBS="${MAX_JOBS:-2}" .venv/bin/python -m pip install -q --no-build-isolation -e .
.venv/bin/python -m blink.info >/dev/null || { .venv/bin/python -m blink.info; exit 1; }
echo "install.sh: ready (.venv/bin/blink)"
