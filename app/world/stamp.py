"""A world's stamp: the id and the digests its manifest records, read and checked.

A world builder stamps one id on everything it writes: the manifest records the id and the
digest of every file, the model's Triton config carries it as the `world_id` parameter, and
the Redis layout record carries it too. Whether each part a running service reads belongs
to the world it serves is app.release.world_match's. A world built before stamping existed
has no id: it is served with a warning, unchecked.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.core.errors import ConfigError
from app.world.layout import SERVED_FILES
from app.world.manifest import read_manifest

log = logging.getLogger(__name__)

WORLD_ID_PARAMETER = "world_id"


@dataclass(frozen=True, slots=True)
class WorldStamp:
    world_id: str
    digests: dict[str, str]


def built_at(world_id: str) -> float | None:
    """When a world was built, read from its id (the builder's "YYYYMMDD-HHMMSS-tail", UTC);
    None for an id of another shape."""
    stamp = world_id[:15]
    try:
        moment = datetime.strptime(stamp, "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return moment.timestamp()


def file_digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def read_stamp(world: Path) -> WorldStamp | None:
    """The world's id and file digests; None for a world built before stamping."""
    manifest = read_manifest(world)
    if manifest.world_id is None:
        return None
    return WorldStamp(manifest.world_id, dict(manifest.files))


def verify_files(world: Path, stamp: WorldStamp, names: tuple[str, ...] = SERVED_FILES) -> None:
    """Refuse a file that is not the one the world was built with: changed after the build,
    copied in from elsewhere, missing though the build wrote it, or there though it did not
    (the stamp digests every file the build wrote, so an unlisted one came later)."""
    for name in names:
        expected = stamp.digests.get(name)
        path = world / name
        if expected is None:
            if path.exists():
                raise ConfigError(
                    f"{path} was not part of world {stamp.world_id} when it was built (its "
                    "manifest has no digest for it): remove the file, or rebuild (or, for a "
                    "world written by hand, stamp) the world"
                )
            continue
        if not path.is_file():
            raise ConfigError(
                f"{path} is missing or not a regular file: world {stamp.world_id} was built "
                "with it; restore the file, or rebuild the world"
            )
        try:
            digest = file_digest(path)
        except OSError as exc:
            raise ConfigError(f"{path} cannot be read ({exc}): restore the file") from exc
        if digest != expected:
            raise ConfigError(
                f"{path} does not belong to world {stamp.world_id} (it changed after the "
                "world was built): rebuild the world, or restore the file"
            )
