"""The bounds on the work one request may ask for, with their defaults (`blink serve --help`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


def _limit(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class Limits:
    """Every request is checked against these before any work starts; the OpenAPI schema
    carries them as bounds."""

    max_batch_size: int = _limit(4096, "batch_size, each of batch_sizes, a search's max_batch")
    max_seq_len: int = _limit(32768, "seq_len")
    max_params: int = _limit(20_000_000_000, "parameters of the model (counted on meta first)")
    max_input_elements: int = _limit(1 << 24, "elements of one sample of input_shape")
    max_compare_cells: int = _limit(16, "models x GPUs x dtypes of one /compare")
    max_sweep_points: int = _limit(16, "explicit batch_sizes of one /optimize-batch")
    max_wall_s: float = _limit(120.0, "seconds to an answer, then 504 (searches also stop)")
    max_queue: int = _limit(4, "requests admitted to the worker (running + waiting); more: 429")
    max_body_bytes: int = _limit(64 * 1024, "bytes of a request body; more: 413")
    max_config_keys: int = _limit(256, "keys of a transformers config sent as JSON")
    cache_entries: int = _limit(256, "answers kept by the LRU cache of identical requests "
                                     "(0: no cache)")
    cache_bytes: int = _limit(256 << 20, "bytes of answers the cache keeps")
    history_entries: int = _limit(500, "predictions kept in the history")

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            low = 0 if f.name in ("cache_entries", "cache_bytes") else 1e-9
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low:
                raise ValueError(f"limit {f.name} must be a positive number, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
