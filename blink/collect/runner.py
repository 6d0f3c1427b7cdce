"""The collection loop: a preset's configurations into a dataset directory, as it goes, with a
progress line, a time budget and resume."""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import torch

from ..errors import BlinkError, ConfigError
from . import env as env_mod
from .cupti import unavailable_reason
from .dataset import DatasetWriter
from .presets import SEED, get_preset, iter_available, run_id
from .protocol import feature_columns, run_config

MAX_FILE_BYTES = 15 * 2**20  # stop before a table outgrows what one transfer may carry (16 MiB)


@dataclass
class CollectResult:
    path: str
    status: str  # complete | partial
    reason: str
    ran: int = 0
    resumed: int = 0  # configurations found finished in the directory and skipped
    failed: dict[str, int] = field(default_factory=dict)  # status -> count (oom, error)
    unavailable: dict[str, int] = field(default_factory=dict)  # reason -> count


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60:02d}:{seconds % 60:02d}"


class Progress:
    """One updating line on a terminal; one line per configuration otherwise (logs)."""

    def __init__(self, total: int, stream: TextIO | None, start: float) -> None:
        self.total = total
        self.stream = stream
        self.start = start
        self.tty = bool(stream is not None and stream.isatty())
        self.width = 0

    def show(self, done: int, text: str) -> None:
        if self.stream is None or not self.tty:
            return
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done) if done else 0.0
        filled = int(24 * done / max(self.total, 1))
        line = (f"[{'#' * filled}{'.' * (24 - filled)}] {done}/{self.total} "
                f"{_fmt(elapsed)}<{_fmt(eta)} {text}")[:160]
        self.stream.write("\r" + line.ljust(self.width))
        self.width = len(line)
        self.stream.flush()

    def finished(self, done: int, text: str, status: str, seconds: float) -> None:
        if self.stream is None:
            return
        if self.tty:
            if status != "ok":
                self.stream.write("\r" + " " * self.width + "\r")
                self.stream.write(f"{status}: {text}\n")
                self.width = 0
            return
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"[{done}/{self.total} {_fmt(elapsed)}] {status:<5} {seconds:6.1f}s "
                          f"{text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


def resolve_device(device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if device != "cuda":
        raise ConfigError(f"--device must be cuda or cpu, not {device!r}")
    if not torch.cuda.is_available():
        raise BlinkError("--device cuda: no CUDA device is visible here; use --device cpu to "
                         "run the pipeline on the CPU")
    why = unavailable_reason()
    if why is not None:
        raise BlinkError(f"--device cuda needs the CUPTI tracer: {why}")
    return torch.device("cuda", torch.cuda.current_device())


def default_feature_gpu(device: torch.device, progress: TextIO | None = None) -> str:
    """The hardware-table entry features are computed for: the GPU itself, or H200 on a CPU
    (and on a GPU the table does not know, with a warning; every row records which)."""
    from ..hardware import get_gpu

    if device.type != "cuda":
        return "H200"
    name = torch.cuda.get_device_name(device)
    try:
        return get_gpu(name).name
    except BlinkError:
        if progress is not None:
            progress.write(f"blink collect: warning: {name} is not in blink's hardware table; "
                           "unit features are computed for H200 (pass --gpu to choose)\n")
        return "H200"


def collect(preset_name: str, out: str, *, device: str = "cuda",
            time_budget: float | None = None, gpu: str | None = None, limit: int | None = None,
            progress: TextIO | None = sys.stderr, max_file_bytes: int = MAX_FILE_BYTES,
            seed: int = SEED) -> CollectResult:
    """Run a preset into `out`, skipping what `out` already holds; stop cleanly at the time
    budget (no configuration is started that would likely overrun it) or the file-size cap."""
    start = time.perf_counter()
    if time_budget is not None and time_budget <= 0:
        raise ConfigError(f"--time-budget must be positive, got {time_budget}")
    preset = get_preset(preset_name)
    if device not in preset.devices:
        raise ConfigError(f"preset {preset.name!r} is for --device {' or '.join(preset.devices)}"
                          f", not {device!r}")
    dev = resolve_device(device)
    feature_gpu = gpu or default_feature_gpu(dev, progress)
    from ..hardware import get_gpu

    feature_gpu = get_gpu(feature_gpu).name
    environment = env_mod.capture(dev.type)
    eid = env_mod.env_id(environment)
    env_row = {"env_id": eid, **{k: environment.get(k) for k in env_mod.ROW_FIELDS}}
    planned = list(iter_available(preset))
    result = CollectResult(out, "partial", "")
    for _, why in planned:
        if why:
            result.unavailable[why] = result.unavailable.get(why, 0) + 1
    writer = DatasetWriter(out, preset=preset.name, device=dev.type,
                           protocol={**preset.protocol.to_dict(), "feature_gpu": feature_gpu,
                                     "seed": seed},
                           env=environment, env_id=eid, feature_columns=feature_columns(),
                           planned=len(planned))
    todo = []
    for cfg, why in planned:
        if why:
            continue
        rid = run_id(cfg, seed)
        if rid in writer.done:
            result.resumed += 1
        else:
            todo.append((cfg, rid))
    limited = limit is not None and limit < len(todo)
    if limited:
        todo = todo[:limit]
    bar = Progress(len(todo), progress, start)
    if progress is not None and result.resumed:
        progress.write(f"blink collect: resuming {out}: {result.resumed} configurations already "
                       f"done, {len(todo)} to go\n")
    durations: dict[str, list[float]] = {}
    reason = ""
    try:
        for i, (cfg, rid) in enumerate(todo):
            if time_budget is not None:
                seen = durations.get(cfg.kind) or [d for v in durations.values() for d in v]
                estimate = statistics.median(seen) if seen else 0.0
                if time.perf_counter() - start + estimate > time_budget:
                    reason = (f"time budget of {time_budget:g} s reached after {i} of "
                              f"{len(todo)} configurations")
                    break
            name, size = writer.largest_file()
            if size > max_file_bytes:
                reason = f"{name} reached {size / 2**20:.1f} MiB (the cap is " \
                         f"{max_file_bytes / 2**20:.1f} MiB); continue in a new --out directory"
                break
            bar.show(i, cfg.describe())
            res = run_config(cfg, run_id=rid, device=dev, feature_gpu=feature_gpu,
                             protocol=preset.protocol, seed=seed, env_row=env_row)
            writer.append(res.run, res.units, res.history)
            result.ran += 1
            status = res.run["status"]
            if status != "ok":
                result.failed[status] = result.failed.get(status, 0) + 1
            durations.setdefault(cfg.kind, []).append(res.run["elapsed_s"])
            detail = cfg.describe() if status == "ok" else \
                f"{cfg.describe()}: {res.run.get('error')}"
            bar.finished(i + 1, detail, status, res.run["elapsed_s"])
        else:
            if limited:
                reason = f"--limit {limit} reached"
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        bar.close()
        result.status = "partial" if reason else "complete"
        if not reason and result.unavailable:
            reason = "; ".join(f"{n} configurations skipped: {why}"
                               for why, n in result.unavailable.items())
        result.reason = reason
        writer.finish(result.status, reason)
    return result
