"""An async call's result, reused for a while, with concurrent callers sharing one call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class CachedCall(Generic[T]):
    """A flood of callers costs at most one call per `ttl_s`, however many ask at once."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._value: T | None = None
        self._taken_at = float("-inf")
        self._running: asyncio.Future[T] | None = None

    async def get(self, call: Callable[[], Awaitable[T]]) -> T:
        if self._value is not None and self._clock() - self._taken_at < self._ttl_s:
            return self._value
        if self._running is None:
            self._running = asyncio.ensure_future(self._refresh(call))
        # Shielded: a caller that goes away does not cancel the call the others wait for.
        return await asyncio.shield(self._running)

    async def _refresh(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await call()
        finally:
            self._running = None
        self._value, self._taken_at = value, self._clock()
        return value
