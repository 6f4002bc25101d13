"""manifest.json: how a world was built, its id and each file's digest.

The only place the file is read or written. A build writes it once, when it stamps the world
(tools' store/identity.stamp_world); a world stamped again or re-indexed updates it, so a
write merges into what is there, and replaces the file whole: a crash mid-stamp leaves the
old manifest, not half of a new one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.core.atomic_files import write_atomically
from app.core.errors import ConfigError
from app.world.layout import MANIFEST_FILE


def read_manifest(world: Path) -> dict[str, Any]:
    """Its fields; empty where the world has no manifest (built before stamping)."""
    path = world / MANIFEST_FILE
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than the parser's stack, a hostile file's.
        reason = f"{type(exc).__name__}: {exc}"[:200]
        raise ConfigError(f"{path} is not readable JSON ({reason}): rebuild the world") from exc
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path} is not a JSON object: rebuild the world")
    return manifest


def update_manifest(world: Path, **fields: Any) -> None:
    """Sets `fields`, keeping the rest."""
    merged = {**read_manifest(world), **fields}
    text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    write_atomically(world / MANIFEST_FILE, text.encode())


def manifest_items(world: Path) -> int:
    """The world's item count as its manifest says; 0 where it says none, cannot be read, or
    says something no count is (negative, infinite, not a number)."""
    try:
        return max(0, int(read_manifest(world).get("items", 0)))
    except (ConfigError, ValueError, TypeError, OverflowError):
        return 0
