#!/usr/bin/env bash
# Run the whole test suite (installing first if needed; idempotent). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/install_browser.sh  # headless Chromium for tests/test_dashboard.py
.venv/bin/python -m ruff check blink tests benchmarks
.venv/bin/python -m pytest -q "$@"
