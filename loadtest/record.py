"""Benchmarks' figures merged, each under its own key, into one JSON file (docs/benchmarks.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def record_top(path: Path, figures: dict[str, Any]) -> None:
    """Put each of `figures`' keys at the top of the JSON object at `path` (make bench's
    record is the file's top level), keeping the other benchmarks' keys."""
    recorded = json.loads(path.read_text()) if path.is_file() else {}
    recorded.update(figures)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recorded, indent=2) + "\n")


def record(path: Path, key: str, figures: Any) -> None:
    """Put `figures` under `key` in the JSON object at `path`, keeping every other key."""
    recorded = json.loads(path.read_text()) if path.is_file() else {}
    recorded[key] = figures
    path.write_text(json.dumps(recorded, indent=2) + "\n")
