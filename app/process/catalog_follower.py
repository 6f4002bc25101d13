"""This process's catalog kept at the change log's head (app.clients.catalog_log).

At start-up the whole log is replayed; then a task reads what was appended every
`every_s`, and a request that finds a withdrawal in the log past its catalog (the features
stage reads the number of the last batch that withdrew with the user) waits for the rest
first. Each read applies its batches to
the catalog's room (app.release.arrivals) and swaps the artifacts for ones that see them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from app.clients.catalog_log import CatalogLog
from app.clients.catalog_reader import LogReader
from app.clients.feature_store import RedisClient
from app.clients.item_memory import ItemMemory
from app.core.cancelling import cancel_requested
from app.core.errors import FeatureStoreError
from app.core.metrics import ServiceMetrics
from app.release.arrivals import ChangeBatch
from app.release.artifacts import ArtifactsRef, ServingArtifacts
from app.release.catalog import in_room
from app.release.keyspace import KeySpace

log = logging.getLogger(__name__)


class CatalogFollower:
    def __init__(
        self,
        reader: LogReader,
        artifacts: ArtifactsRef,
        applied: Callable[[ChangeBatch], None] = lambda batch: None,
    ) -> None:
        self._reader = reader
        self._artifacts = artifacts
        self._applied = applied
        self._lock = asyncio.Lock()

    @property
    def applied(self) -> int:
        return self._reader.room.seq

    async def at_least(self, seq: int, timeout_s: float) -> ServingArtifacts:
        """The artifacts once every batch up to `seq` is applied."""
        if self.applied < seq:
            await self.catch_up(timeout_s, seq)
        return self._artifacts.current

    async def catch_up(self, timeout_s: float, until: int = 0) -> None:
        """Apply every batch the log holds past the last one applied (requests waiting for
        batch `until` stop waiting once another has applied it)."""
        async with self._lock:
            if until and self.applied >= until:
                return
            applied = await self._reader.catch_up(timeout_s)
            for batch in applied:
                self._applied(batch)
            current = self._artifacts.current
            if applied and current.catalog.room is self._reader.room:
                grown = in_room(current.catalog, self._reader.room)
                self._artifacts.grow(dataclasses.replace(current, catalog=grown))

    async def keep_current(self, every_s: float, timeout_s: float) -> None:
        while not cancel_requested():
            await asyncio.sleep(every_s)
            try:
                await self.catch_up(timeout_s)
            except FeatureStoreError as exc:
                log.warning("catalog changes not read (%s); serving the catalog held", exc)
            except Exception:  # a bug must not stop the following: requests wait on it
                log.exception("catalog changes not applied; serving the catalog held")
        raise asyncio.CancelledError


async def replayed(
    client: RedisClient,
    keys: KeySpace,
    world_id: str,
    artifacts: ArtifactsRef,
    item_memory: ItemMemory | None,
    metrics: ServiceMetrics,
    timeout_s: float,
) -> tuple[CatalogLog, CatalogFollower] | None:
    """The world's change log, replayed into the served catalog's room; None without one."""
    room = artifacts.current.catalog.room
    if room is None:
        return None
    changes = CatalogLog(client, keys, world_id)
    metrics.catalog_added.labels("room").set(room.capacity)

    def applied(batch: ChangeBatch) -> None:
        for change in batch.puts:
            if item_memory is not None and change.position < room.base:
                item_memory.put(change.position, change.blob())
        metrics.catalog_change_count["put"].inc(len(batch.puts))
        metrics.catalog_change_count["withdraw"].inc(len(batch.withdrawals))
        metrics.catalog_added.labels("held").set(room.added)

    await changes.agree_on_room(room.capacity, timeout_s)
    follower = CatalogFollower(
        LogReader(changes, room, metrics.catalog_skipped.inc), artifacts, applied
    )
    await follower.catch_up(timeout_s)
    if room.seq:
        log.info(
            "catalog change log replayed: %d items added, %d withdrawals, up to batch %d",
            room.added,
            room.withdrawals,
            room.seq,
        )
    return changes, follower
