"""The collected dataset on disk: schema, writer (append as it goes, resume) and loader.

A dataset is a directory:

    provenance.json        format, schema version, preset, protocol, environments, sessions,
                           feature columns, and (once finished) each file's rows, bytes, SHA-256
    runs.csv.gz            one row per configuration (a model step or one op call): timings,
                           peaks, status, environment
    units.csv.gz           one row per cost unit of a run, keyed by run_id: measured device and
                           host time, kernel geometry, and the predictor's features (f_*)
    alloc_history.jsonl.gz optional: the caching allocator's events of one step per run
    progress.jsonl         the writer's journal (finished run ids and file offsets), for resume

Tables are gzipped CSV; each begins with a ``#blink-dataset table=NAME schema=N`` line, then
the header. The writer appends one gzip member per run and journals the file sizes after it,
so a run cut off mid-write is rolled back on resume. Empty fields are missing values.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetError

FORMAT = "blink.dataset"
SCHEMA_VERSION = 1
PROVENANCE = "provenance.json"
PROGRESS = "progress.jsonl"
HISTORY = "alloc_history.jsonl.gz"

RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "str"), ("kind", "str"), ("status", "str"), ("error", "str"),
    ("model", "str"), ("family", "str"), ("op", "str"), ("params", "str"),
    ("batch_size", "int"), ("seq_len", "int"), ("dtype", "str"), ("mode", "str"),
    ("optimizer", "str"), ("grad_checkpointing", "bool"), ("kv_cache", "int"),
    ("device", "str"), ("seed", "int"),
    ("feature_gpu", "str"),
    ("tf32_matmul", "bool"), ("tf32_cudnn", "bool"),
    ("warmup", "int"), ("samples", "int"), ("calls_per_sample", "int"), ("timer", "str"),
    ("time_median_s", "float"), ("time_min_s", "float"), ("time_max_s", "float"),
    ("time_p25_s", "float"), ("time_p75_s", "float"), ("time_std_s", "float"),
    ("trace_reps", "int"), ("traced_wall_s", "float"), ("device_time_s", "float"),
    ("n_kernels", "int"), ("unattributed_n", "int"), ("unattributed_s", "float"),
    ("unattributed_top", "str"), ("dropped_records", "int"),
    ("n_units_dry", "int"), ("n_units_measured", "int"), ("n_units_exact", "int"),
    ("n_units_name", "int"),
    ("mem_resident_bytes", "int"), ("peak_allocated_bytes", "int"),
    ("peak_reserved_bytes", "int"), ("mem_history", "bool"), ("dry_ops", "int"),
    ("elapsed_s", "float"), ("finished_at", "str"), ("env_id", "str"),
    ("gpu_name", "str"), ("sm_count", "int"), ("compute_capability", "str"),
    ("sm_clock_mhz", "float"), ("max_sm_clock_mhz", "float"), ("driver", "str"),
    ("cuda", "str"), ("cudnn", "str"), ("torch", "str"), ("python", "str"), ("blink", "str"),
    ("cupti", "str"), ("cpu", "str"),
)

UNIT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "str"), ("unit_seq", "int"), ("measured_seq", "int"), ("match", "str"),
    ("op", "str"), ("overload", "str"), ("phase", "str"), ("module", "str"),
    ("shapes", "str"), ("dtypes", "str"),
    ("time_s", "float"), ("host_s", "float"), ("n_kernels", "int"), ("kernel_s", "float"),
    ("memcpy_n", "int"), ("memcpy_s", "float"), ("memcpy_bytes", "int"),
    ("memset_n", "int"), ("memset_s", "float"), ("launch_n", "int"), ("launch_s", "float"),
    ("launch_delay_s", "float"), ("span_s", "float"), ("rep_spread", "float"),
    ("main_kernel", "str"), ("main_grid", "str"), ("main_block", "str"), ("main_regs", "int"),
    ("main_smem_static", "int"), ("main_smem_dynamic", "int"),
    ("kind", "str"), ("math_mode", "str"), ("feature_error", "str"), ("env_id", "str"),
)

STATUSES = ("ok", "oom", "error")
MATCHES = ("exact", "name", "dry_only", "measured_only")
TABLES = {"runs": "runs.csv.gz", "units": "units.csv.gz"}


def table_columns(table: str, feature_columns: Iterable[str] = ()) -> list[tuple[str, str]]:
    if table == "runs":
        return list(RUN_COLUMNS)
    return list(UNIT_COLUMNS) + [(f"f_{name}", "float") for name in feature_columns]


def _header_line(table: str) -> str:
    return f"#blink-dataset table={table} schema={SCHEMA_VERSION}\n"


def _encode(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "bool":
        return "1" if value else "0"
    if kind == "float":
        v = float(value)
        return "" if v != v else repr(v)  # NaN is a missing value
    if kind == "int":
        return str(int(value))
    return str(value)


def _decode(text: str, kind: str) -> Any:
    if text == "":
        return None
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        if text not in ("0", "1"):
            raise ValueError(f"{text!r} is not 0 or 1")
        return text == "1"
    return text


def _csv_text(rows: Iterable[Mapping[str, Any]], columns: list[tuple[str, str]],
              header: bool) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow([c for c, _ in columns])
    for row in rows:
        w.writerow([_encode(row.get(c), k) for c, k in columns])
    return buf.getvalue()


def _append_member(path: str, text: str) -> None:
    """One gzip member appended, flushed and synced (members concatenate into one stream)."""
    with open(path, "ab") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
            gz.write(text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's sha256, hex (read in 1 MiB blocks): the one hash helper for data and
    artifacts (datasets here, blink.train's cards, blink.learned's checks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: str, doc: Mapping[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def read_provenance(path: str) -> dict[str, Any]:
    prov_path = os.path.join(path, PROVENANCE)
    if not os.path.isdir(path):
        raise DatasetError(f"{path}: no such dataset directory")
    if not os.path.exists(prov_path):
        raise DatasetError(f"{path} is not a blink dataset: {PROVENANCE} is missing")
    try:
        with open(prov_path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{prov_path} is not valid JSON ({exc}); the file is damaged") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DatasetError(f"{prov_path} is not a blink dataset provenance file "
                           f"(no \"format\": \"{FORMAT}\")")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        hint = ("it was written by a newer blink; upgrade blink to read it" if newer else
                "re-collect it, or convert it with the blink version that wrote it")
        raise DatasetError(f"{path} has dataset schema_version {version!r}; this blink reads "
                           f"version {SCHEMA_VERSION}: {hint}")
    return doc


class DatasetWriter:
    """Appends finished runs to a dataset directory; resumes a half-done one.

    Opening a directory that already holds a collection continues it: runs listed in the
    journal are skipped by the caller (``done``), and bytes written after the last journaled
    run (a run cut off mid-write) are truncated away.
    """

    def __init__(self, path: str, *, preset: str, device: str, protocol: Mapping[str, Any],
                 env: Mapping[str, Any], env_id: str, feature_columns: list[str],
                 planned: int) -> None:
        self.path = path
        self.feature_columns = list(feature_columns)
        self.done: dict[str, str] = {}  # run_id -> status
        self.rows = {"runs": 0, "units": 0, "history": 0}
        self._offsets: dict[str, int] = {}
        prov_path = os.path.join(path, PROVENANCE)
        if os.path.exists(prov_path):
            self.prov = read_provenance(path)
            self._check_compatible(preset, device)
            self._resume()
        else:
            if os.path.isdir(path) and os.listdir(path):
                raise DatasetError(f"{path} is not empty and holds no {PROVENANCE}: choose an "
                                   "empty or new --out directory")
            os.makedirs(path, exist_ok=True)
            self.prov = {
                "format": FORMAT, "schema_version": SCHEMA_VERSION, "preset": preset,
                "device": device, "created": _now(), "protocol": dict(protocol),
                "feature_columns": self.feature_columns, "environments": {},
                "sessions": [], "tables": {t: f for t, f in TABLES.items()},
                "columns": {t: [c for c, _ in table_columns(t, self.feature_columns)]
                            for t in TABLES},
            }
            for table, name in TABLES.items():
                cols = table_columns(table, self.feature_columns)
                _append_member(os.path.join(path, name),
                               _header_line(table) + _csv_text([], cols, header=True))
            self._journal({"event": "init"})
        self.prov["environments"][env_id] = dict(env)
        self.prov["status"] = "in_progress"
        self.prov["planned_runs"] = planned
        self.prov.pop("files", None)
        self.prov["sessions"].append({"started": _now(), "env_id": env_id, "runs": 0})
        _write_json(prov_path, self.prov)

    # -- resume -----------------------------------------------------------------------------
    def _check_compatible(self, preset: str, device: str) -> None:
        p = self.prov
        if p.get("preset") != preset or p.get("device") != device:
            raise DatasetError(
                f"{self.path} holds preset {p.get('preset')!r} collected on "
                f"{p.get('device')!r}; this run is preset {preset!r} on {device!r}. Resume it "
                "with the same --preset and --device, or choose another --out directory.")
        if p.get("feature_columns") != self.feature_columns:
            raise DatasetError(
                f"{self.path} was collected with another feature set (a different blink "
                "version): its unit rows cannot be extended. Start a new --out directory.")

    def _resume(self) -> None:
        journal = os.path.join(self.path, PROGRESS)
        last: dict[str, Any] | None = None
        try:
            with open(journal, encoding="utf-8") as f:
                lines = f.readlines()
        except OSError as exc:
            raise DatasetError(f"{journal} is missing ({exc}): this directory cannot be "
                               "resumed; start a new --out directory") from exc
        n_good = 0
        for line in lines:
            if not line.endswith("\n"):
                break  # a journal line cut off mid-write: that run did not finish
            try:
                entry = json.loads(line)
            except ValueError:
                break
            last = entry
            n_good += 1
            if "run_id" in entry:
                self.done[entry["run_id"]] = entry.get("status", "ok")
                for k, n in entry.get("rows", {}).items():
                    self.rows[k] = self.rows.get(k, 0) + n
        if last is None:
            raise DatasetError(f"{journal} is empty or damaged: start a new --out directory")
        self._offsets = dict(last["offsets"])
        hist = os.path.join(self.path, HISTORY)
        if HISTORY not in self._offsets and os.path.exists(hist):
            os.remove(hist)  # begun by a run that did not finish
        for name, size in self._offsets.items():
            fpath = os.path.join(self.path, name)
            actual = os.path.getsize(fpath) if os.path.exists(fpath) else -1
            if actual < size:
                raise DatasetError(f"{fpath} is shorter ({actual} bytes) than the journal "
                                   f"records ({size}): the directory was damaged; start anew")
            if actual > size:  # a run cut off mid-write: roll it back
                with open(fpath, "r+b") as f:
                    f.truncate(size)
        if n_good < len(lines):  # drop a damaged tail of the journal too
            with open(journal, "w", encoding="utf-8") as f:
                f.write("".join(lines[:n_good]))

    def _journal(self, entry: dict[str, Any]) -> None:
        names = list(TABLES.values()) + [HISTORY]
        offsets = {n: os.path.getsize(os.path.join(self.path, n)) for n in names
                   if os.path.exists(os.path.join(self.path, n))}
        self._offsets = offsets
        with open(os.path.join(self.path, PROGRESS), "a", encoding="utf-8") as f:
            f.write(json.dumps({**entry, "offsets": offsets}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    # -- writing ----------------------------------------------------------------------------
    def append(self, run: Mapping[str, Any], units: list[Mapping[str, Any]],
               history: Mapping[str, Any] | None = None) -> None:
        """Write one finished run: its unit rows, its run row, its allocator history."""
        if units:
            _append_member(os.path.join(self.path, TABLES["units"]),
                           _csv_text(units, table_columns("units", self.feature_columns),
                                     header=False))
        _append_member(os.path.join(self.path, TABLES["runs"]),
                       _csv_text([run], table_columns("runs"), header=False))
        n_hist = 0
        if history is not None:
            _append_member(os.path.join(self.path, HISTORY),
                           json.dumps(history, separators=(",", ":")) + "\n")
            n_hist = 1
        self.done[str(run["run_id"])] = str(run["status"])
        rows = {"runs": 1, "units": len(units), "history": n_hist}
        for k, n in rows.items():
            self.rows[k] += n
        self.prov["sessions"][-1]["runs"] += 1
        self._journal({"run_id": run["run_id"], "status": run["status"], "rows": rows})

    def largest_file(self) -> tuple[str, int]:
        sizes = [(n, os.path.getsize(os.path.join(self.path, n)))
                 for n in list(TABLES.values()) + [HISTORY]
                 if os.path.exists(os.path.join(self.path, n))]
        return max(sizes, key=lambda kv: kv[1])

    def finish(self, status: str, reason: str = "") -> dict[str, Any]:
        """Record the session's end; with sizes and checksums the loader verifies."""
        files: dict[str, Any] = {}
        for table, name in TABLES.items():
            fpath = os.path.join(self.path, name)
            files[name] = {"rows": self.rows[table], "bytes": os.path.getsize(fpath),
                           "sha256": sha256_file(fpath)}
        hist = os.path.join(self.path, HISTORY)
        if os.path.exists(hist):
            files[HISTORY] = {"rows": self.rows["history"], "bytes": os.path.getsize(hist),
                              "sha256": sha256_file(hist)}
        self.prov["files"] = files
        self.prov["status"] = status
        self.prov["stop_reason"] = reason
        self.prov["updated"] = _now()
        self.prov["sessions"][-1].update({"finished": _now(), "status": status,
                                          "stop_reason": reason})
        _write_json(os.path.join(self.path, PROVENANCE), self.prov)
        return self.prov


# -- loading ----------------------------------------------------------------------------------

@dataclass
class Dataset:
    """A loaded dataset: provenance and the rows of each table (dicts of typed values)."""

    path: str
    provenance: dict[str, Any]
    runs: list[dict[str, Any]]
    units: list[dict[str, Any]]
    feature_columns: list[str] = field(default_factory=list)

    def units_of(self, run_id: str) -> list[dict[str, Any]]:
        return [u for u in self.units if u["run_id"] == run_id]

    def environment(self, env_id: str) -> dict[str, Any]:
        return dict(self.provenance.get("environments", {}).get(env_id, {}))


def _open_text(fpath: str) -> Iterator[str]:
    """Lines of a (multi-member) gzip file; damage becomes a DatasetError naming the file."""
    name = os.path.basename(fpath)
    try:
        with gzip.open(fpath, "rt", encoding="utf-8", newline="") as f:
            yield from f
    except EOFError as exc:
        raise DatasetError(f"{fpath} is truncated: the compressed data ends early ({exc}). "
                           "Copy the file again or re-collect.") from exc
    except (gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as exc:
        raise DatasetError(f"{fpath} is corrupted: {name} cannot be decompressed ({exc}). "
                           "Copy the file again or re-collect.") from exc


def read_table(path: str, table: str, feature_columns: list[str] | None = None) -> list[dict]:
    """Rows of one table, typed and checked against the schema."""
    fpath = os.path.join(path, TABLES[table])
    if not os.path.exists(fpath):
        raise DatasetError(f"{fpath} is missing")
    lines = _open_text(fpath)
    first = next(lines, None)
    if first is None:
        raise DatasetError(f"{fpath} is empty (no header): the file is truncated")
    if first != _header_line(table):
        raise DatasetError(f"{fpath} does not start with {_header_line(table).strip()!r} "
                           f"(found {first.strip()[:80]!r}): wrong file or another schema")
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise DatasetError(f"{fpath} has no column header: the file is truncated") from None
    expected = table_columns(table, feature_columns or [])
    kinds = dict(expected)
    if feature_columns is None and table == "units":
        kinds.update({c: "float" for c in header if c.startswith("f_")})
        expected = [(c, kinds[c]) for c in header if c in kinds]
    missing = [c for c, _ in expected if c not in header]
    if missing:
        raise DatasetError(f"{fpath}: columns missing from the header: {', '.join(missing[:8])}"
                           f"{' ...' if len(missing) > 8 else ''}")
    extra = [c for c in header if c not in kinds]
    if extra:
        raise DatasetError(f"{fpath}: unknown columns {', '.join(extra[:8])} (another schema?)")
    rows = []
    try:
        for row in reader:
            line = reader.line_num + 1  # the #blink-dataset line comes first
            if len(row) != len(header):
                raise DatasetError(f"{fpath} line {line}: {len(row)} fields, the header has "
                                   f"{len(header)}: the file is damaged")
            out = {}
            for col, text in zip(header, row, strict=True):
                try:
                    out[col] = _decode(text, kinds[col])
                except ValueError:
                    raise DatasetError(f"{fpath} line {line}, column {col}: {text[:40]!r} is "
                                       f"not a valid {kinds[col]}") from None
            rows.append(out)
    except csv.Error as exc:
        raise DatasetError(f"{fpath} line {reader.line_num + 1}: malformed CSV ({exc})") from exc
    return rows


def load_dataset(path: str, *, allow_partial: bool = False, verify: bool = True) -> Dataset:
    """Load and validate a dataset directory; every problem is a DatasetError naming the file.

    allow_partial: also read a collection that is still running or was interrupted (no
    checksums yet). verify: check sizes and SHA-256 against provenance.json first.
    """
    prov = read_provenance(path)
    files = prov.get("files")
    if prov.get("status") == "in_progress" or files is None:
        if not allow_partial:
            raise DatasetError(f"{path} is an unfinished collection (status "
                               f"{prov.get('status')!r}): resume it with `blink collect "
                               f"--preset {prov.get('preset')} --out {path}`, or load it with "
                               "allow_partial=True")
        files = None
    if verify and files is not None:
        for name, info in files.items():
            fpath = os.path.join(path, name)
            if not os.path.exists(fpath):
                raise DatasetError(f"{fpath} is missing (listed in {PROVENANCE})")
            size = os.path.getsize(fpath)
            if size < info["bytes"]:
                raise DatasetError(f"{fpath} is truncated: {size} bytes, {PROVENANCE} records "
                                   f"{info['bytes']}. Copy the file again or re-collect.")
            if size != info["bytes"] or sha256_file(fpath) != info["sha256"]:
                raise DatasetError(f"{fpath} is corrupted: its SHA-256 differs from the one in "
                                   f"{PROVENANCE} (modified or damaged in transfer)")
    features = list(prov.get("feature_columns", []))
    runs = read_table(path, "runs")
    units = read_table(path, "units", features)
    if files is not None:
        for table, rows in (("runs", runs), ("units", units)):
            want = files[TABLES[table]]["rows"]
            if len(rows) != want:
                raise DatasetError(f"{os.path.join(path, TABLES[table])} has {len(rows)} rows, "
                                   f"{PROVENANCE} records {want}: the file is damaged")
    ids = set()
    for i, r in enumerate(runs):
        if r["run_id"] is None or r["status"] not in STATUSES:
            raise DatasetError(f"{TABLES['runs']} row {i + 1}: run_id must be set and status "
                               f"one of {', '.join(STATUSES)} (got {r['status']!r})")
        if r["run_id"] in ids:
            raise DatasetError(f"{TABLES['runs']}: run_id {r['run_id']} appears twice")
        ids.add(r["run_id"])
    for i, u in enumerate(units):
        if u["run_id"] not in ids:
            raise DatasetError(f"{TABLES['units']} row {i + 1} points to run {u['run_id']!r}, "
                               f"which is not in {TABLES['runs']}")
        if u["match"] not in MATCHES:
            raise DatasetError(f"{TABLES['units']} row {i + 1}: match {u['match']!r} is not "
                               f"one of {', '.join(MATCHES)}")
    return Dataset(path, prov, runs, units, features)


def read_history(path: str) -> Iterator[dict[str, Any]]:
    """The allocator-history records (one per run that recorded one)."""
    fpath = os.path.join(path, HISTORY)
    if not os.path.exists(fpath):
        return
    for n, line in enumerate(_open_text(fpath), 1):
        try:
            yield json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{fpath} line {n}: not JSON ({exc})") from exc


def summary(ds: Dataset) -> str:
    status: dict[str, int] = {}
    for r in ds.runs:
        status[r["status"]] = status.get(r["status"], 0) + 1
    kinds: dict[str, int] = {}
    for r in ds.runs:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    matched = sum(1 for u in ds.units if u["match"] in ("exact", "name"))
    p = ds.provenance
    return (f"{ds.path}: preset {p.get('preset')} on {p.get('device')}, status "
            f"{p.get('status')}; {len(ds.runs)} runs ("
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + "; "
            + ", ".join(f"{k} {v}" for k, v in sorted(status.items())) + f"), {len(ds.units)} "
            f"unit rows ({matched} matched to the dry run), schema {p.get('schema_version')}")


def validate_dataset(path: str, *, allow_partial: bool = False) -> str:
    """Load with every check; return a one-line summary (raises DatasetError on a problem)."""
    ds = load_dataset(path, allow_partial=allow_partial)
    for _ in read_history(path):
        pass
    return summary(ds)
