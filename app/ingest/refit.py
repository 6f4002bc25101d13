"""The consumer's item step: an added item's vector refitted from the users who choose it,
and published as a change in the catalog's log, which every process applies.

Per added item, Redis keeps the vectors of its latest choosers (a list beside the change
log, under its hash tag) and the vector it was put with (its attributes' guess, or the
caller's). At the counts `refit_due` names, the consumer refits the vector
(app.ingest.item_step) and appends the item again with it: the same attributes, a new
vector, its position kept. A change the log refuses (the item withdrawn meanwhile, say) is
logged and left: the next refit tries again. The item's Redis blob keeps the vector it was
put with (the consumer may not write item keys): processes that hold item features in
memory, the default, rank with the refitted one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from app.clients.catalog_reader import LogReader
from app.clients.feature_store import RedisClient, redis_call
from app.core.errors import CatalogChangeRefusedError, FeatureStoreError
from app.ingest.apply import UserChange
from app.ingest.item_step import KEPT_CHOOSERS, FloatArray, ItemStep, refit_due
from app.ingest.world import IngestWorld
from app.release.arrivals import CatalogRoom, ItemChange
from app.release.keyspace import KeySpace

log = logging.getLogger("recsys.ingest")
TIMEOUT_S = 2.0


class ItemRefits:
    def __init__(self, client: RedisClient, keys: KeySpace) -> None:
        self._client = client
        self._keys = keys

    async def chosen(self, world: IngestWorld, changes: Mapping[str, UserChange]) -> int:
        """Note each positive on an added item with its user's new vector; refit the items
        now due. How many were refitted."""
        arrivals, step = world.arrivals, world.step
        if arrivals is None or step is None:
            return 0
        k = world.schema.embedding_dim
        noted: list[tuple[int, bytes]] = []
        for change in changes.values():
            if change.blob is None:
                continue
            vector = change.blob[:k].astype("<f4").tobytes()
            noted += [(p, vector) for p in change.positives if p >= world.size]
        if not noted:
            return 0
        try:
            return await self._noted(world, arrivals, step, noted)
        except FeatureStoreError as exc:  # a seasoning: the events are applied already
            log.warning("item choosers not noted: %s", exc)
            return 0

    async def _noted(
        self,
        world: IngestWorld,
        arrivals: LogReader,
        step: ItemStep,
        noted: list[tuple[int, bytes]],
    ) -> int:
        # The list keeps the latest KEPT_CHOOSERS; the count is of every chooser ever noted
        # (the list's length stops at the cap, and with it the refits it would time).
        counts_key = self._keys.catalog(world.world_id, "choosers")
        async with redis_call("item choosers", TIMEOUT_S):
            pipe: Any = self._client.pipeline(transaction=False)
            for position, vector in noted:
                key = self._keys.catalog(world.world_id, f"by:{position}")
                pipe.rpush(key, vector)
                pipe.ltrim(key, -KEPT_CHOOSERS, -1)
                pipe.hincrby(counts_key, str(position), 1)
            counts = cast(list[int], (await pipe.execute())[2::3])
        room = arrivals.room
        due = sorted(
            {
                p
                for (p, _), n in zip(noted, counts, strict=True)
                if refit_due(n) and not room.withdrawn[p]
            }
        )
        refitted = 0
        for position in due:
            refitted += await self._refit(world, arrivals, step, position)
        return refitted

    async def _refit(
        self, world: IngestWorld, arrivals: LogReader, step: ItemStep, position: int
    ) -> int:
        room = arrivals.room
        k = world.schema.embedding_dim
        first = self._keys.catalog(world.world_id, "first")
        by = self._keys.catalog(world.world_id, f"by:{position}")
        current = room.vectors[position].astype("<f4").tobytes()
        async with redis_call("item refit", TIMEOUT_S):
            pipe: Any = self._client.pipeline(transaction=False)
            pipe.hsetnx(first, str(position), current)
            pipe.hget(first, str(position))
            pipe.lrange(by, 0, -1)
            _, guess_bytes, rows = await pipe.execute()
        guess = np.frombuffer(cast(bytes, guess_bytes), dtype="<f4")
        choosers = np.frombuffer(b"".join(cast(list[bytes], rows)), dtype="<f4").reshape(-1, k)
        change = _again(room, position, k, step.vector(guess, choosers))
        problem = room.change_problem(change)
        if problem is not None:  # every process would skip it: never logged
            log.warning("item %s not refitted: its %s %s", change.item_id, *problem)
            return 0
        try:
            await arrivals.changes.append([change], [], world.size, room.capacity, TIMEOUT_S)
        except (CatalogChangeRefusedError, FeatureStoreError) as exc:
            log.warning("item %s not refitted: %s", change.item_id, exc)
            return 0
        return 1


def _again(room: CatalogRoom, position: int, k: int, vector: FloatArray) -> ItemChange:
    """The item as last put, with `vector` for its embedding: a vector-only change, which
    never brings back an item withdrawn since."""
    words = room.attributes.get(position, {})
    blob = room.blobs[position - room.base]
    return ItemChange(
        item_id=room.id_at(position),
        position=position,
        title=words.get("title", ""),
        categories=tuple(name for name in words.get("categories", "").split("|") if name),
        category=int(room.categories[position]),
        published_at=int(room.published_at[position]),
        dense=tuple(float(v) for v in blob[k:]),
        embedding=tuple(float(v) for v in vector),
        vector_only=True,
    )
