"""Users' real-time state in Redis, as the consumer's scripts read and write it: the keys a
user's state spans, and one script call per group of users each way (the whole batch on one
Redis, each user on a Cluster, since a script's keys must share a slot and only a user's own
keys do). What the replies mean is the consumer's (app.ingest.user_store); which errors are
transient is event_stream.transient's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster

from app.clients.feature_store import RedisClient
from app.clients.user_state_scripts import READ_SCRIPT, WRITE_SCRIPT
from app.release.keyspace import KeySpace

T = TypeVar("T")
# Scripts in flight at once on a Redis Cluster (one per user): within the client's pool.
CLUSTER_CALLS = 16


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script call: the users whose keys it takes, in order, and its arguments."""

    users: list[str]
    args: list[Any]


class UserStateScripts:
    def __init__(self, client: RedisClient, keys: KeySpace) -> None:
        self._keys = keys
        self._cluster = isinstance(client, RedisCluster)
        self._read_script = client.register_script(READ_SCRIPT)
        self._write_script = client.register_script(WRITE_SCRIPT)

    def groups(self, users: list[T]) -> list[list[T]]:
        """Users as the calls must group them: all in one, or one each on a Cluster."""
        return [[one] for one in users] if self._cluster else [users]

    def _user_keys(self, users: list[str]) -> list[str]:
        """The keys both scripts take for each user, five a user, in their order."""
        keys = self._keys
        return [
            key
            for user_id in users
            for key in (
                keys.positives(user_id),
                keys.seen(user_id),
                keys.user(user_id),
                keys.impressions(user_id),
                keys.applied(user_id),
            )
        ]

    async def read(self, calls: Sequence[ScriptCall]) -> list[list[Any]]:
        """Each call's reply, in order."""
        return await _bounded(self._read_one(call) for call in calls)

    async def _read_one(self, call: ScriptCall) -> list[Any]:
        return list(await self._read_script(keys=self._user_keys(call.users), args=call.args))

    async def write(self, calls: Sequence[ScriptCall]) -> None:
        """Each call atomic, as a transaction."""
        await _bounded(
            self._write_script(keys=self._user_keys(call.users), args=call.args) for call in calls
        )


async def _bounded(calls: Iterable[Awaitable[T]]) -> list[T]:
    """The calls' results in order, at most CLUSTER_CALLS running at once."""
    gate = asyncio.Semaphore(CLUSTER_CALLS)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(call) for call in calls)))
