#!/usr/bin/env bash
# Ground-truth collection on a GPU machine, in one go: build blink (with blink._cupti) in place,
# run the GPU tests, validate the CUPTI tracer against torch.profiler, and collect a preset
# into the output folder, resuming the dataset committed under data/ if there is one.
#
#   OUT=/some/empty/dir bash benchmarks/collect_gpu.sh      (or: bash benchmarks/collect_gpu.sh DIR)
#
# Needs only what a bare GPU box has: python3 with torch (2.11+), a C++ compiler, ninja; no
# network, no pip installs, no xgboost. torchvision / transformers / pytest are used when
# present and skipped (with a note in the log) when not.
#
# Environment:
#   BLINK_DEADLINE_S   wall-clock seconds the whole script may take (default 420); the
#                      collection gets what the build, tests and validation leave, minus a margin.
#                      Each Python step also runs under `timeout`, so that a hang (in CUPTI, say)
#                      cannot eat the time of the steps after it.
#   BLINK_VALIDATE_BUDGET_S  seconds after which the validation starts no further model
#                      (default 100; it is killed 60 s after that)
#   BLINK_PRESET       preset to collect (default h200)
#   BLINK_DATASET      dataset name under data/ to resume and to ingest into (default h200)
#   PYTHON             interpreter (default python3)
#   MAX_JOBS           parallel compile jobs (default: all cores)
#   BLINK_REHEARSE_ON_CPU=1   without a GPU, carry on anyway: CPU tests, no validation, and the
#                      smoke preset on --device cpu (checks this script's plumbing anywhere)
#
# Writes into $OUT (at most 8 files, each at most 16 MiB):
#   gpu_run.log  checks.json  data/{provenance.json,runs.csv.gz,units.csv.gz,
#   alloc_history.jsonl.gz,progress.jsonl}
# Then, on the development machine: python benchmarks/collect_ingest.py <that folder>
# Exit status: 0 all good; 1 a check failed (the data is still written); 2 usage or build
# error; 3 no CUDA device (stops after the build).
set -uo pipefail

OUT="${1:-${OUT:-}}"
if [ -z "$OUT" ]; then
  echo "usage: OUT=DIR bash benchmarks/collect_gpu.sh  (or pass DIR as the first argument)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
REPO="$PWD"
PY="${PYTHON:-python3}"
DEADLINE="${BLINK_DEADLINE_S:-420}"
PRESET="${BLINK_PRESET:-h200}"
DATASET="${BLINK_DATASET:-h200}"
START=$(date +%s)
mkdir -p "$OUT"
LOG="$OUT/gpu_run.log"
CHECKS="$OUT/checks.json"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

elapsed() { echo $(( $(date +%s) - START )); }
step() { echo; echo "== [$(elapsed)s] $*"; }
STATUS=0
declare -A RESULT

# capped SECONDS CMD...: run CMD, killed after SECONDS (then SIGKILL 10 s later); says so.
capped() {
  local secs=$1 rc
  shift
  if [ "$secs" -lt 1 ]; then secs=1; fi
  if ! command -v timeout >/dev/null; then
    "$@"
    return
  fi
  timeout -k 10 "$secs" "$@"
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "TIMEOUT: killed after ${secs}s: $*"; fi
  return $rc
}

finish() {
  # checks.json: what each step found (the log has the details), plus the validation report.
  local pairs=""
  for k in "${!RESULT[@]}"; do pairs="$pairs\"$k\": ${RESULT[$k]}, "; done
  "$PY" - "$CHECKS" "{${pairs%, }}" "$OUT/validation.json" "$(elapsed)" <<'EOF'
import json, sys
out, results, validation, elapsed = sys.argv[1:5]
r = json.loads(results)
r["elapsed_s"] = int(elapsed)
try:
    with open(validation, encoding="utf-8") as f:
        r["cupti_validation"] = json.load(f)
except OSError:
    pass
with open(out, "w", encoding="utf-8") as f:
    json.dump(r, f, indent=1)
EOF
  rm -f "$OUT/validation.json"
  step "files in $OUT"
  find "$OUT" -type f -printf '%s %p\n' | sort -k2
  local n big
  n=$(find "$OUT" -type f | wc -l)
  big=$(find "$OUT" -type f -size +16M | wc -l)
  echo "files: $n (limit 8); over 16 MiB: $big"
  if [ "$n" -gt 8 ] || [ "$big" -gt 0 ]; then echo "ERROR: output limits exceeded"; STATUS=1; fi
  step "done: exit $STATUS after $(elapsed)s"
  # Let tee write the log's last lines before the script (and so the job) ends.
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit "$STATUS"
}

step "environment"
"$PY" - <<'EOF'
import importlib.util, platform, sys
import torch
print("python", sys.version.split()[0], "|", platform.platform())
print("torch", torch.__version__, "| CUDA build", torch.version.cuda, "| cuDNN",
      torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("CUDA available:", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name() if torch.cuda.is_available() else "no device")
for m in ("torchvision", "timm", "transformers", "pytest", "numpy"):
    print(f"  python package {m}: {'yes' if importlib.util.find_spec(m) else 'no'}")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
for tool in ninja cmake g++ c++ nvcc; do printf '  %s: %s\n' "$tool" "$(command -v $tool || echo missing)"; done

step "CUPTI search (csrc/cupti/find_cupti.py)"
# BLINK_WITH_CUPTI=1: the finder exits 1 when no usable CUPTI is found (0 only says it ran).
BLINK_WITH_CUPTI=1 "$PY" csrc/cupti/find_cupti.py
RESULT[cupti_found]=$([ $? -eq 0 ] && echo true || echo false)

step "build blink._C and blink._cupti in place (BLINK_WITH_CUPTI=1)"
if ! command -v ninja >/dev/null; then
  echo "WARNING: ninja is not on PATH: torch compiles the extensions one file at a time (minutes)"
fi
BUILD_LOG=/tmp/blink_build_$$.log
if BLINK_WITH_CUPTI=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" setup.py build_ext --inplace >"$BUILD_LOG" 2>&1; then
  grep -E "^blink\._cupti:" "$BUILD_LOG"
  tail -n 3 "$BUILD_LOG"
  RESULT[build]=true
else
  tail -n 60 "$BUILD_LOG"
  echo "ERROR: the build failed (full log: $BUILD_LOG)"
  RESULT[build]=false
  STATUS=2
  finish
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m blink.info
"$PY" -c "from blink import _cupti; print('blink._cupti built with', _cupti.build_info(), '| CUPTI library API', _cupti.library_api_version())" \
  || echo "WARNING: blink._cupti does not load or cannot ask CUPTI its version"

DEVICE=cuda
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  RESULT[gpu]=false
  if [ "${BLINK_REHEARSE_ON_CPU:-0}" != 1 ]; then
    echo "no CUDA device: the build works; GPU tests, validation and collection need a GPU."
    STATUS=3
    finish
  fi
  echo "no CUDA device: rehearsal on the CPU (smoke preset, --device cpu, no validation)"
  DEVICE=cpu
  PRESET=smoke
else
  RESULT[gpu]=true
fi

step "GPU tests"
# No -x: on the one GPU run, every failing test is worth seeing.
if "$PY" -c "import pytest" 2>/dev/null; then
  capped 150 "$PY" -m pytest -q -p no:cacheprovider --durations=8 tests/test_cupti.py tests/test_collect.py
  rc=$?
else
  echo "pytest is not installed: running the tracer checks directly (--quick)"
  capped 150 "$PY" benchmarks/cupti_validate.py --quick --reps 2
  rc=$?
fi
RESULT[tests]=$([ $rc -eq 0 ] && echo true || echo false)
[ $rc -eq 0 ] || STATUS=1

step "CUPTI tracer vs torch.profiler"
if [ "$DEVICE" = cuda ]; then
  VBUDGET="${BLINK_VALIDATE_BUDGET_S:-100}"
  capped $(( VBUDGET + 60 )) "$PY" benchmarks/cupti_validate.py --out "$OUT/validation.json" \
    --budget "$VBUDGET"
  rc=$?
  RESULT[cupti_validation_ok]=$([ $rc -eq 0 ] && echo true || echo false)
  [ $rc -eq 0 ] || STATUS=1
else
  echo "skipped (no GPU)"
fi

step "collect preset $PRESET"
mkdir -p "$OUT/data"
if [ "$DEVICE" = cuda ] && [ -f "data/$DATASET/provenance.json" ] \
    && [ ! -f "$OUT/data/provenance.json" ]; then
  echo "resuming data/$DATASET"
  cp data/"$DATASET"/provenance.json data/"$DATASET"/progress.jsonl data/"$DATASET"/*.gz "$OUT/data/"
fi
# The margin covers the dataset check and the summary below; the collection starts no
# configuration past its budget and is killed 12 s after it (a killed run is rolled back on
# resume), so the script ends before the deadline.
BUDGET=$(( DEADLINE - $(elapsed) - 25 ))
if [ "$BUDGET" -lt 20 ]; then
  echo "ERROR: no time left for the collection (budget ${BUDGET}s): skipped"
  RESULT[collect]=false
  STATUS=1
  finish
fi
echo "time budget: ${BUDGET}s"
capped $(( BUDGET + 12 )) "$PY" -m blink.collect --preset "$PRESET" --out "$OUT/data" \
  --device "$DEVICE" --time-budget "$BUDGET"
rc=$?
RESULT[collect]=$([ $rc -eq 0 ] && echo true || echo false)
[ $rc -eq 0 ] || STATUS=1
capped 20 "$PY" -m blink.collect --validate "$OUT/data"
rc=$?
RESULT[dataset_valid]=$([ $rc -eq 0 ] && echo true || echo false)
[ $rc -eq 0 ] || STATUS=1
finish
