"""The trending items, read from Redis every second or so and held for requests.

The ingest consumer keeps a decayed count of positives per item (a sorted set, in log2
space, app.ingest.consumer); the popular candidate source puts the top of it first. A
failed read keeps the last list: trending is a seasoning, and a request never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import numpy as np
from redis import exceptions as redis_errors

from app.clients.feature_store import RedisClient
from app.core.cancelling import cancel_requested
from app.core.throttled_log import ThrottledLog
from app.core.vocabulary import Positions
from app.release.keyspace import KeySpace

failures = ThrottledLog(logging.getLogger("recsys.trending"))


class TrendingItems:
    def __init__(
        self,
        client: RedisClient,
        keys: KeySpace,
        count: int,
        catalog_size: Callable[[], int],
        counted: Callable[[bool], None] = lambda read: None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._count = count
        self._catalog_size = catalog_size
        self._counted = counted
        self.current: Positions = np.empty(0, dtype=np.int64)

    async def refresh(self, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                members = cast(
                    list[bytes],
                    await self._client.zrevrange(self._keys.trending, 0, self._count - 1),
                )
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:
            failures.warning("read", "trending items not read: %s", exc)
            self._counted(False)
            return
        positions = np.array([int(m) for m in members if m.isdigit()], dtype=np.int64)
        self.current = positions[positions < self._catalog_size()]
        self._counted(True)

    async def keep_current(self, interval_s: float, timeout_s: float) -> None:
        while not cancel_requested():
            await self.refresh(timeout_s)
            await asyncio.sleep(interval_s)
        raise asyncio.CancelledError
