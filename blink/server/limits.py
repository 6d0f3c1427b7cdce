"""The bounds on the work one request may ask for, with their defaults (`blink serve --help`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Limits:
    """Every request is checked against these before any work starts; the OpenAPI schema
    carries them as bounds."""

    max_batch_size: int = 4096          # batch_size, batch_sizes[], max_batch of a search
    max_seq_len: int = 32768            # seq_len
    max_params: int = 20_000_000_000    # parameters of the model (counted on meta first)
    max_input_elements: int = 1 << 24   # elements of one sample of input_shape
    max_compare_cells: int = 16         # models x gpus x dtypes of one /compare
    max_sweep_points: int = 16          # explicit batch_sizes of one /optimize-batch
    max_wall_s: float = 120.0           # a request's answer time; then 504 (searches stop too)
    max_queue: int = 4                  # requests admitted to the worker (running + waiting);
                                        # more get 429 with Retry-After
    max_body_bytes: int = 64 * 1024     # request body; larger is 413
    max_config_keys: int = 256          # keys of a transformers config sent as JSON
    cache_entries: int = 256            # LRU cache of identical requests ...
    cache_bytes: int = 256 << 20        # ... and the bytes of answers it keeps
    history_entries: int = 500          # predictions kept in the history

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
