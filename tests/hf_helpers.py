"""A transformers config dict written where blink reads it: `hf:path/to/config.json`."""
from __future__ import annotations

import json
from pathlib import Path


def hf_config(folder: Path, raw: dict, name: str = "config.json") -> str:
    """Write `raw` as `folder/name` and return the blink model name for it."""
    path = folder / name
    path.write_text(json.dumps(raw))
    return f"hf:{path}"
