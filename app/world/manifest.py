"""manifest.json: how a world was built, its id and each file's digest.

The only place the file is read or written. A build writes it once, when it stamps the world
(tools' store/identity.stamp_world); a world stamped again or re-indexed updates it, so a
write merges into what is there, and replaces the file whole: a crash mid-stamp leaves the
old manifest, not half of a new one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.atomic_files import write_atomically
from app.core.errors import ConfigError
from app.world.layout import MANIFEST_FILE
from app.world.schema import checked_name

# Past this an item count is no count: the memory estimate's float arithmetic stays exact.
MAX_COUNT = 2**53


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a world's manifest says that the service and the tools act on, checked when
    read. The file holds more (how the world was built: the training report, counts, the
    evaluation), for people and reports; nothing here reads it."""

    world_id: str | None = None  # None: built before stamping, served unchecked
    files: Mapping[str, str] = field(default_factory=dict)  # stamped file -> sha256
    items: int = 0  # 0 where it says no count: the memory estimate reads none
    source: str | None = None  # what the world was built from ("synthetic", "interactions")


def read_manifest(world: Path) -> Manifest:
    """The world's manifest; an empty one where the world has none (built before stamping).
    A file that is no JSON object, an id that is no name or digests that are no mapping are
    one ConfigError naming the file."""
    path = world / MANIFEST_FILE
    fields = _read_fields(path)
    world_id = fields.get("world_id")
    if world_id == "":
        world_id = None
    if world_id is not None:
        # The id names directories and goes into Triton's config text (recsys release world).
        try:
            world_id = checked_name(world_id, f"{path}: world_id")
        except ConfigError as exc:
            raise ConfigError(f"{exc}: rebuild the world") from None
    files = fields.get("files", {})
    if not isinstance(files, dict):
        raise ConfigError(
            f"{path}: files must map each file's name to its digest: rebuild the world"
        )
    source = fields.get("source")
    return Manifest(
        world_id=world_id,
        files={str(name): str(digest) for name, digest in files.items()},
        items=_count(fields.get("items", 0)),
        source=None if source is None else str(source),
    )


def update_manifest(world: Path, **fields: Any) -> None:
    """Sets `fields`, keeping the rest."""
    path = world / MANIFEST_FILE
    merged = {**_read_fields(path), **fields}
    text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    write_atomically(path, text.encode())


def manifest_items(world: Path) -> int:
    """The world's item count as its manifest says; 0 where it says none or cannot be read."""
    try:
        return read_manifest(world).items
    except ConfigError:
        return 0


def _read_fields(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than the parser's stack, a hostile file's.
        reason = f"{type(exc).__name__}: {exc}"[:200]
        raise ConfigError(f"{path} is not readable JSON ({reason}): rebuild the world") from exc
    if not isinstance(fields, dict):
        raise ConfigError(f"{path} is not a JSON object: rebuild the world")
    return fields


def _count(value: object) -> int:
    """A count, or 0 for what no count is (negative, infinite, past MAX_COUNT, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0
    try:
        count = int(value)
    except (ValueError, OverflowError):
        return 0
    return count if 0 <= count <= MAX_COUNT else 0
