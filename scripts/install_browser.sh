#!/usr/bin/env bash
# Headless Chromium and its WebDriver from Debian's packages, for tests/test_dashboard.py
# (idempotent: does nothing when both are installed). Needs root apt-get. Where that is missing
# or the install fails, it says so and exits 0: the dashboard tests then skip, naming this
# script, rather than the whole suite failing on a package mirror.
set -uo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
if have chromium && have chromedriver; then
  exit 0
fi
if ! have apt-get || [ "$(id -u)" != 0 ]; then
  echo "install_browser.sh: no root apt-get here; install the Debian packages chromium and" \
       "chromium-driver by hand to run the dashboard tests" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -q >/dev/null &&
   apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-dejavu-core \
     >/dev/null; then
  echo "install_browser.sh: $(chromium --version 2>/dev/null || echo chromium installed)"
else
  echo "install_browser.sh: WARNING: apt-get could not install chromium chromium-driver;" \
       "tests/test_dashboard.py will skip" >&2
fi
exit 0
