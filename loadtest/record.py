"""Benchmarks' figures merged, each under its own key, into one JSON file (docs/benchmarks.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def record(path: Path, key: str, figures: Any) -> None:
    """Put `figures` under `key` in the JSON object at `path`, keeping every other key."""
    recorded = json.loads(path.read_text()) if path.is_file() else {}
    recorded[key] = figures
    path.write_text(json.dumps(recorded, indent=2) + "\n")
