"""The event log: what users did, appended to Redis Streams for the ingest consumer.

Events are partitioned by user (a stable hash of the id), one stream per partition, so
one consumer applies a user's events in the order they came; a batch's share of a
partition is one stream entry. An append is durable once
Redis has it: on one Redis every partition's XADD goes in one MULTI/EXEC, all or nothing;
on a Redis Cluster the partitions live in different slots, so each partition's part is its
own transaction, and a batch that failed half-way is retried by its sender (each event's
id makes the second copy of an event a no-op when the consumer applies it). Streams are
capped (`MAXLEN ~`): the consumer keeps far behind the cap, and a stalled one loses the
oldest entries rather than Redis its memory.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from app.clients.feature_store import RedisClient, failure_kind
from app.core.errors import FeatureStoreError
from app.core.events import Event, encode_entry
from app.release.keyspace import KeySpace

MAX_NOTES_IN_FLIGHT = 64
NOTE_TIMEOUT_S = 0.5


def partition_of(user_id: str, partitions: int) -> int:
    """The user's partition: the same in every process and every run (crc32, not hash())."""
    return zlib.crc32(user_id.encode()) % partitions


def by_partition(events: Sequence[Event], partitions: int) -> dict[int, list[Event]]:
    """The events of each partition, in the order they came."""
    split: dict[int, list[Event]] = {}
    for event in events:
        split.setdefault(partition_of(event.user_id, partitions), []).append(event)
    return split


class EventLog:
    """Appends batches of events; FeatureStoreError when Redis did not take them."""

    def __init__(
        self, client: RedisClient, keys: KeySpace, partitions: int, max_length: int
    ) -> None:
        self._client = client
        self._keys = keys
        self._partitions = partitions
        self._max_length = max_length
        self._notes: set[asyncio.Future[None]] = set()

    @property
    def partitions(self) -> int:
        return self._partitions

    async def append(self, events: Sequence[Event], timeout_s: float) -> None:
        split = by_partition(events, self._partitions)
        try:
            async with asyncio.timeout(timeout_s):
                if isinstance(self._client, RedisCluster):
                    await asyncio.gather(*(self._append(part) for part in split.values()))
                else:
                    await self._append([e for part in split.values() for e in part])
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:
            kind = failure_kind(exc)
            raise FeatureStoreError(kind, f"append events: {type(exc).__name__} {exc}") from exc

    def remember_answer(self, request_id: str, variant: str, ttl_s: int) -> None:
        """Note which variant made an answer, off the request path: a click that names the
        request id credits it. Skipped while too many notes are still being written."""
        if ttl_s <= 0 or len(self._notes) >= MAX_NOTES_IN_FLIGHT:
            return
        task = asyncio.ensure_future(self._note(request_id, variant, ttl_s))
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def aclose(self) -> None:
        """Let the notes still being written finish (each is bounded by its timeout)."""
        if self._notes:
            await asyncio.gather(*self._notes, return_exceptions=True)

    async def _note(self, request_id: str, variant: str, ttl_s: int) -> None:
        try:
            async with asyncio.timeout(NOTE_TIMEOUT_S):
                await self._client.set(self._keys.answer(request_id), variant, ex=ttl_s)
        except (redis_errors.RedisError, OSError, TimeoutError):
            pass  # an uncredited answer: outcomes per variant are a sample, not a ledger

    async def _append(self, events: Sequence[Event]) -> None:
        """One entry per partition (its share of the batch), in one MULTI/EXEC."""
        pipe: Any = self._client.pipeline(transaction=True)
        for partition, part in by_partition(events, self._partitions).items():
            stream = self._keys.events(partition)
            pipe.xadd(stream, encode_entry(part), maxlen=self._max_length, approximate=True)
        await pipe.execute()
