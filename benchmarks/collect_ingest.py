"""Second step of a GPU collection: turn the output folder of benchmarks/collect_gpu.sh into
the committed form under data/.

    python benchmarks/collect_ingest.py RUN_OUTPUT_DIR [--name h200] [--data data] [--force]

RUN_OUTPUT_DIR holds gpu_run.log, checks.json and data/ (the dataset). The dataset is loaded
with every check (schema, SHA-256, keys); the result goes to data/NAME/ as provenance.json
(with the run's checks and log tail added under "ingest"), runs.csv.gz, units.csv.gz,
alloc_history.jsonl.gz when present, and progress.jsonl so that the next GPU session resumes
it. An existing data/NAME/ is replaced only by a dataset that contains all of its runs (the GPU
script resumes from it), unless --force.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from blink.collect.dataset import (
    HISTORY,
    PROGRESS,
    PROVENANCE,
    TABLES,
    load_dataset,
    read_history,
    summary,
)
from blink.errors import DatasetError

MAX_BYTES = 16 * 2**20


def _log_tail(path: str, lines: int = 40) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [ln.rstrip("\n") for ln in f.readlines()[-lines:]]
    except OSError:
        return []


def ingest(src: str, name: str, data_dir: str, force: bool = False,
           allow_cpu: bool = False) -> str:
    ds_dir = os.path.join(src, "data")
    if not os.path.isdir(ds_dir):
        raise DatasetError(f"{src} has no data/ folder: is it the output of collect_gpu.sh?")
    ds = load_dataset(ds_dir)
    for _ in read_history(ds_dir):
        pass
    if ds.provenance.get("device") != "cuda" and not allow_cpu:
        raise DatasetError(f"{ds_dir} was collected on {ds.provenance.get('device')!r}, not a "
                           "GPU; only GPU collections are committed")
    checks: dict = {}
    try:
        with open(os.path.join(src, "checks.json"), encoding="utf-8") as f:
            checks = json.load(f)
    except (OSError, ValueError):
        checks = {"note": "checks.json missing or unreadable"}
    dest = os.path.join(data_dir, name)
    if os.path.exists(os.path.join(dest, PROVENANCE)) and not force:
        old = load_dataset(dest, verify=True)
        lost = {r["run_id"] for r in old.runs} - {r["run_id"] for r in ds.runs}
        if lost:
            raise DatasetError(f"{dest} holds {len(lost)} runs that {ds_dir} lacks: it was not "
                               "resumed from the committed dataset. Use another --name, or "
                               "--force to replace it.")
    files = list(TABLES.values()) + [PROGRESS] + ([HISTORY] if os.path.exists(
        os.path.join(ds_dir, HISTORY)) else [])
    for f in files:
        size = os.path.getsize(os.path.join(ds_dir, f))
        if size > MAX_BYTES:
            raise DatasetError(f"{ds_dir}/{f} is {size / 2**20:.1f} MiB, over the 16 MiB a "
                               "committed file may take")
    os.makedirs(data_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=data_dir)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the committed folder is not
    try:
        for f in files:
            shutil.copy2(os.path.join(ds_dir, f), os.path.join(tmp, f))
        prov = dict(ds.provenance)
        prov["ingest"] = {"source": os.path.abspath(src), "checks": checks,
                          "log_tail": _log_tail(os.path.join(src, "gpu_run.log"))}
        with open(os.path.join(tmp, PROVENANCE), "w", encoding="utf-8") as fh:
            json.dump(prov, fh, indent=1, sort_keys=True)
            fh.write("\n")
        load_dataset(tmp)  # the committed form must load as it is
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary(load_dataset(dest))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="the folder collect_gpu.sh wrote ($OUT)")
    ap.add_argument("--name", default="h200", help="dataset name under data/ (default h200)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "data"))
    ap.add_argument("--force", action="store_true", help="replace data/NAME even if it loses runs")
    ap.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # tests
    a = ap.parse_args()
    try:
        print(ingest(a.src, a.name, os.path.normpath(a.data), a.force, a.allow_cpu))
    except DatasetError as exc:
        print(f"collect_ingest: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
