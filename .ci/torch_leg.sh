#!/usr/bin/env bash
# CI's second leg: the whole test suite again on another torch release (default 2.11.0, the
# H200's, the oldest Blink supports), so a version difference (2.11's stricter Library.impl
# override rule broke every trace until 2026-12-07 and only a manual check found it) fails CI
# rather than the GPU session that needs the build.
#
#   bash .ci/torch_leg.sh [TORCH_VERSION TORCHVISION_VERSION]     (idempotent)
#
# The extension is built in place (blink/_C*.so), so the leg runs in a copy of this working
# tree (tracked and untracked, not ignored, files) under .ci/work/, with its own .venv and the
# torch pins of requirements-dev.txt swapped; ../shared (the public data) is linked beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="${1:-2.11.0}"
VISION="${2:-0.26.0}"
ROOT="$PWD"
WORK="$ROOT/.ci/work/torch-$TORCH"
SRC="$WORK/src"
mkdir -p "$SRC"
# Refresh the copy, keeping its venv and build objects (a rerun reinstalls and recompiles only
# what changed: tar keeps the sources' mtimes, which ninja compares).
find "$SRC" -mindepth 1 -maxdepth 1 ! -name .venv ! -name build -exec rm -rf {} +
git ls-files -z --cached --others --exclude-standard |
  tar --null --no-recursion -T - -c --ignore-failed-read 2>/dev/null | tar -x -C "$SRC"
if [ -d "$ROOT/../shared" ] && [ ! -e "$WORK/shared" ]; then
  ln -s "$(cd "$ROOT/../shared" && pwd)" "$WORK/shared"
fi
sed -i -e "s/^torch==.*/torch==$TORCH/" -e "s/^torchvision==.*/torchvision==$VISION/" \
  "$SRC/requirements-dev.txt"
grep -q "^torch==$TORCH$" "$SRC/requirements-dev.txt" || {
  echo "torch_leg.sh: could not pin torch==$TORCH in the copy's requirements-dev.txt" >&2
  exit 1
}
cd "$SRC"
bash scripts/install.sh
.venv/bin/python -c "import torch; v = torch.__version__.split('+')[0]; \
assert v == '$TORCH', f'torch {v} installed, wanted $TORCH'"
echo "torch_leg.sh: pytest on torch $TORCH"
.venv/bin/python -m pytest -q -p no:cacheprovider
