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


def _grown(counts: Counts, rows: int) -> Counts:
    grown = np.zeros(rows, dtype=np.float64)
    grown[: len(counts)] = counts
    return grown


def _by_position(raw: dict[bytes, bytes], rows: int) -> Counts:
    counts = np.zeros(rows, dtype=np.float64)
    if not raw:
        return counts
    positions = np.fromiter(map(int, raw.keys()), dtype=np.int64, count=len(raw))
    values = np.fromiter(map(float, raw.values()), dtype=np.float64, count=len(raw))
    inside = (positions >= 0) & (positions < rows)
    counts[positions[inside]] = values[inside]
    return counts


# Every (position, showings) pair of a flush raised in one call: a pipeline of thousands of
# HINCRBYs costs the event loop far more than the script's loop costs Redis.
_RAISE = """
for i = 1, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 0
"""


class Exposure:
    """The newcomers' counts as last read, and the showings not yet written."""

    def __init__(
        self, client: RedisClient, keys: KeySpace, world_id: str, rows: Callable[[], int]
    ) -> None:
        self._client = client
        self._shown_key, self._chosen_key = exposure_keys(keys, world_id)
        self._rows = rows
        self._raise = client.register_script(_RAISE)
        self._unwritten: Counts = _NONE  # showings by position, not yet written
        self.shown: Counts = _NONE
        self.chosen: Counts = _NONE

    def counts(self, positions: Positions) -> tuple[Counts, Counts]:
        """Each position's showings and positives as last read (0 for one never read)."""
        shown, chosen = self.shown, self.chosen
        inside = positions < len(shown)
        at = np.where(inside, positions, 0)
        return np.where(inside, shown[at], 0.0), np.where(inside, chosen[at], 0.0)

    def showed(self, positions: Positions) -> None:
        """Count one showing of each of `positions` (distinct: one answer's), to be written
        with the next flush, and seen by this process's next answers already (the next
        read holds it, flushed)."""
        if len(self._unwritten) < self._rows():
            self._unwritten = _grown(self._unwritten, self._rows())
        self._unwritten[positions] += 1.0
        known = positions[positions < len(self.shown)]
        self.shown[known] += 1.0

    async def flush(self, timeout_s: float) -> None:
        written = np.flatnonzero(self._unwritten)
        if not len(written):
            return
        times = self._unwritten[written]
        self._unwritten[written] = 0.0
        pairs = np.column_stack([written, times.astype(np.int64)]).ravel().tolist()
        try:
            async with asyncio.timeout(timeout_s):
                await self._raise(keys=[self._shown_key], args=pairs)
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:
            failures.warning("write", "showings not written, kept for the next try: %s", exc)
            self._unwritten[written] += times

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
