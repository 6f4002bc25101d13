"""Whether each part a running service reads belongs to the world it serves.

The service refuses to start when a part (Redis, Triton's model, the files) belongs to another
world, and readiness reports a part that changed worlds while it ran (app.world.stamp reads
the stamp these compare against).
"""

from __future__ import annotations

from pathlib import Path

from app.core.vocabulary import RedisWorld
from app.world.layout import SERVED_FILES
from app.world.stamp import WorldStamp


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
