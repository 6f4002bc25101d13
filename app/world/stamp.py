"""Which world the service serves, and whether each part of it belongs to that world.

A world builder stamps one id on everything it writes: the manifest records the id and the
digest of every file, the model's Triton config carries it as the `world_id` parameter, and
the Redis layout record carries it too. The service refuses to start when a part belongs to
another world, and readiness reports a part that changed worlds while it ran. A world built
before stamping existed has no id: it is served with a warning, unchecked.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.core.errors import ConfigError
from app.core.vocabulary import RedisWorld
from app.world.layout import MANIFEST_FILE, SCHEMA_FILE, SERVED_FILES
from app.world.manifest import read_manifest
from app.world.schema import FeatureSchema, checked_name, load_schema

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
    path = world / MANIFEST_FILE
    manifest = read_manifest(world)
    world_id = manifest.get("world_id")
    if world_id is None or world_id == "":
        return None
    # The id names directories and goes into Triton's config text (recsys release world).
    world_id = checked_name(world_id, f"{path}: world_id")
    digests = manifest.get("files", {})
    if not isinstance(digests, dict):
        raise ConfigError(f"{path}: files must map each file's name to its digest")
    return WorldStamp(world_id, {str(k): str(v) for k, v in digests.items()})


def verify_files(world: Path, stamp: WorldStamp, names: tuple[str, ...] = SERVED_FILES) -> None:
    """Refuse a file that is not the one the world was built with (copied from elsewhere)."""
    for name in names:
        expected = stamp.digests.get(name)
        path = world / name
        if expected is None or not path.is_file():
            continue
        try:
            digest = file_digest(path)
        except OSError as exc:
            raise ConfigError(f"{path} cannot be read ({exc}): restore the file") from exc
        if digest != expected:
            raise ConfigError(
                f"{path} does not belong to world {stamp.world_id} (it changed after the "
                "world was built): rebuild the world, or restore the file"
            )


def same_world(found: str | None, served: str) -> bool:
    """False only when a part is known to hold another world than the served one.

    A part without an id (written before stamping, or unreadable just now) and a served world
    without one are accepted: there is nothing to compare.
    """
    return not served or not found or found == served


def redis_world(answered: bool, found: str | None, served: str) -> RedisWorld:
    """What Redis holds against the served world `served` ("" when it has no id), from
    FeatureStore.world_state: an empty store is told apart from a load made before stamping,
    so that losing every user reads as losing them, not as nothing to compare."""
    if not answered:
        return RedisWorld.UNKNOWN
    if found is None:
        return RedisWorld.NONE
    if not found or not served:
        return RedisWorld.UNSTAMPED
    return RedisWorld.SERVED if found == served else RedisWorld.ANOTHER


def part_mismatch(part: str, found: str, stamp: WorldStamp | None, fix: str) -> str | None:
    """One line when `part` belongs to another world than the served one; None when it fits."""
    if stamp is None or same_world(found, stamp.world_id):
        return None
    return f"{part} belongs to world {found}, this service serves world {stamp.world_id}: {fix}"


def world_schema(world: Path, explicit: Path | None) -> FeatureSchema:
    """The schema a world is served with: its own file, unless one is configured.

    A configured schema that disagrees with the world's own is refused: the world's tables,
    model and Redis blobs were all written in the world's layout.
    """
    own = world / SCHEMA_FILE
    if explicit is None:
        return load_schema(own if own.is_file() else None)
    schema = load_schema(explicit)
    if own.is_file() and load_schema(own) != schema:
        raise ConfigError(
            f"RECSYS_FEATURE_SCHEMA ({explicit}) differs from the world's own {own}: "
            "unset it to serve the world as built"
        )
    return schema


def files_identity(world: Path, stamp: WorldStamp | None) -> str:
    """What tells one version of the served files from another, cheaply.

    A stamped world's manifest holds their digests (already checked against the files); an
    unstamped one is told apart by where its files are, their sizes and times.
    """
    if stamp is not None:
        return stamp.world_id + "".join(stamp.digests.get(name, "") for name in SERVED_FILES)
    parts = [str(world.resolve())]
    for name in SERVED_FILES:
        path = world / name
        if path.is_file():
            status = path.stat()
            parts.append(f"{name}:{status.st_size}:{status.st_mtime_ns}")
    return "|".join(parts)
