"""How often each item added while serving has been shown, and chosen: what exploration's
bandit learns from.

Two hashes per world, beside its change log (app.clients.catalog_log), field the item's
position: `shown`, which every API process raises for the newcomers its answers held
(counted in process, written once a second, never on a request's path), and `chosen`, which
the ingest consumer raises for each positive on one (within the same per-user budget as
trending, so one user cannot make an item look loved). Each process reads both back every
second or so into arrays by position; a failed read or write keeps the last and tries again:
exploration is a seasoning, and a request never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from redis import exceptions as redis_errors

from app.clients.feature_store import RedisClient
from app.core.cancelling import cancel_requested
from app.core.throttled_log import ThrottledLog
from app.core.vocabulary import Positions
from app.release.keyspace import KeySpace

failures = ThrottledLog(logging.getLogger("recsys.exposure"))
Counts = npt.NDArray[np.float64]
_NONE: Counts = np.zeros(0, dtype=np.float64)


def exposure_keys(keys: KeySpace, world_id: str) -> tuple[str, str]:
    """The world's `shown` and `chosen` hashes."""
    return keys.catalog(world_id, "shown"), keys.catalog(world_id, "chosen")


def _by_position(raw: dict[bytes, bytes], rows: int) -> Counts:
    counts = np.zeros(rows, dtype=np.float64)
    for field, value in raw.items():
        position = int(field)
        if 0 <= position < rows:
            counts[position] = float(value)
    return counts


class Exposure:
    """The newcomers' counts as last read, and the showings not yet written."""

    def __init__(
        self, client: RedisClient, keys: KeySpace, world_id: str, rows: Callable[[], int]
    ) -> None:
        self._client = client
        self._shown_key, self._chosen_key = exposure_keys(keys, world_id)
        self._rows = rows
        self._unwritten: Counter[int] = Counter()
        self.shown: Counts = _NONE
        self.chosen: Counts = _NONE

    def counts(self, positions: Positions) -> tuple[Counts, Counts]:
        """Each position's showings and positives as last read (0 for one never read)."""
        shown, chosen = self.shown, self.chosen
        inside = positions < len(shown)
        at = np.where(inside, positions, 0)
        return np.where(inside, shown[at], 0.0), np.where(inside, chosen[at], 0.0)

    def showed(self, positions: Positions) -> None:
        """Count one showing of each of `positions`, to be written with the next flush, and
        seen by this process's next answers already (the next read holds it, flushed)."""
        self._unwritten.update(positions.tolist())
        np.add.at(self.shown, positions[positions < len(self.shown)], 1.0)

    async def flush(self, timeout_s: float) -> None:
        if not self._unwritten:
            return
        pending, self._unwritten = self._unwritten, Counter()
        pipe: Any = self._client.pipeline(transaction=False)
        for position, times in pending.items():
            pipe.hincrby(self._shown_key, str(position), times)
        try:
            async with asyncio.timeout(timeout_s):
                await pipe.execute()
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:
            failures.warning("write", "showings not written, kept for the next try: %s", exc)
            self._unwritten.update(pending)

    async def refresh(self, timeout_s: float) -> None:
        pipe: Any = self._client.pipeline(transaction=False)
        pipe.hgetall(self._shown_key)
        pipe.hgetall(self._chosen_key)
        try:
            async with asyncio.timeout(timeout_s):
                shown, chosen = cast(list[dict[bytes, bytes]], await pipe.execute())
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:
            failures.warning("read", "exposure counts not read: %s", exc)
            return
        rows = self._rows()
        self.shown, self.chosen = _by_position(shown, rows), _by_position(chosen, rows)

    async def keep_current(self, interval_s: float, timeout_s: float) -> None:
        while not cancel_requested():
            await self.flush(timeout_s)
            await self.refresh(timeout_s)
            await asyncio.sleep(interval_s)
        raise asyncio.CancelledError
