"""What start-up checks before the service listens: Redis, each Triton, the world.

Each waits for its dependency up to the start-up timeout, then refuses, in one line naming
the fix, a dependency that is not there or that holds another layout, schema or world.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.clients.feature_store import FeatureStore
from app.clients.ranking_model import RankingModelClient
from app.clients.triton_pool import TritonPool
from app.core.errors import ConfigError, DependencyError, SchemaError, UnreachableError
from app.core.settings import Settings
from app.release.catalog import Catalog, load_catalog
from app.release.world_match import part_mismatch
from app.world.schema import FeatureSchema, ModelSignature, signature_mismatches, world_schema
from app.world.stamp import WorldStamp, read_stamp, verify_files

log = logging.getLogger(__name__)
T = TypeVar("T")
# One call's timeout while waiting for a dependency at start-up.
STARTUP_CALL_TIMEOUT_S = 2.0
WAIT_NOTE_EVERY_S = 5.0


async def retry_dependency(what: str, attempt: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """Retry a start-up call while its dependency is unavailable, up to timeout_s."""
    give_up = time.monotonic() + timeout_s
    next_note = 0.0
    while True:
        try:
            return await attempt()
        except DependencyError as exc:
            now = time.monotonic()
            if now > give_up:
                raise
            if now >= next_note:
                log.info("waiting for %s (up to %.0f s more): %s", what, give_up - now, exc)
                next_note = now + WAIT_NOTE_EVERY_S
            await asyncio.sleep(0.5)


INSTALL_MODEL_FIX = (
    "install this world's model (recsys install-model --world DIR --model-repository REPO) "
    "and let Triton load it"
)
LOAD_REDIS_FIX = "load this world into Redis (recsys load-redis --world DIR)"


async def checked_signature(
    model: RankingModelClient,
    schema: FeatureSchema,
    world: WorldStamp | None,
    timeout_s: float,
    version: str | None = None,
) -> ModelSignature:
    """Wait for the model, then refuse to go on if it disagrees with the schema or the world.

    `version`: the one to check; None: the configured one (RECSYS_MODEL_VERSION).
    """

    def ready() -> Awaitable[ModelSignature]:
        return model.ready_signature(STARTUP_CALL_TIMEOUT_S, version)

    try:
        signature = await retry_dependency("the triton model", ready, timeout_s)
    except DependencyError as exc:
        raise UnreachableError(
            f"Triton at {model.url} did not serve a ready model in {timeout_s:.0f} s ({exc}): "
            "start it with the model loaded, or point RECSYS_TRITON_URL at it"
        ) from None
    problems = signature_mismatches(schema, signature)
    if problems:
        raise SchemaError(
            f"Triton model {signature.name!r} at {model.url} does not match the feature "
            "schema: " + "; ".join(problems)
        )
    part = f"Triton model {signature.name!r} at {model.url}"
    mismatch = part_mismatch(part, signature.world_id, world, INSTALL_MODEL_FIX)
    if mismatch:
        raise ConfigError(mismatch)
    if world is not None and not signature.world_id:
        log.warning("%s carries no world id: it cannot be checked against the world", part)
    return signature


async def pool_signature(
    pool: TritonPool,
    schema: FeatureSchema,
    world: WorldStamp | None,
    timeout_s: float,
    version: str | None = None,
) -> ModelSignature:
    """Every endpoint checked; chunks are cut to fit the smallest max_batch_size among them."""
    signatures = await asyncio.gather(
        *(
            checked_signature(endpoint, schema, world, timeout_s, version)
            for endpoint in pool.endpoints
        )
    )
    return min(signatures, key=lambda signature: signature.max_batch_size)


async def checked_redis(store: FeatureStore, world: WorldStamp | None, timeout_s: float) -> None:
    """Wait for Redis, then refuse another layout, or another world's data."""
    try:
        found = await retry_dependency(
            "redis", lambda: store.check_layout(STARTUP_CALL_TIMEOUT_S), timeout_s
        )
    except DependencyError as exc:
        raise UnreachableError(
            f"cannot reach Redis in {timeout_s:.0f} s ({exc}): start it, or point "
            "RECSYS_REDIS_URL at it"
        ) from None
    mismatch = part_mismatch("the data in Redis", found, world, LOAD_REDIS_FIX)
    if mismatch:
        raise ConfigError(mismatch)


def opened_world(settings: Settings) -> tuple[WorldStamp | None, FeatureSchema]:
    """The world's stamp and schema, its served files checked against the stamp."""
    world = settings.artifacts_dir
    stamp = read_stamp(world)
    if stamp is None:
        log.warning("%s carries no world id: its model and Redis data go unchecked", world)
    else:
        verify_files(world, stamp)
    return stamp, world_schema(world, settings.feature_schema)


def opened_catalog(settings: Settings, schema: FeatureSchema) -> Catalog:
    """The world's catalog and index, as configured (blocking: run it in a thread)."""
    return load_catalog(settings.artifacts_dir, schema, settings.index_nprobe, settings.index_mmap)
