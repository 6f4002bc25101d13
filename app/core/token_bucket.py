"""A token bucket per key: a sustained rate with room for a burst (pure logic, clock injected)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """`rate` tokens a second per key, at most `burst` saved up. Keys are a fixed set (the
    configured callers), so the buckets never grow past it."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a bucket needs a positive rate and burst")
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str, count: float) -> float:
        """Take `count` tokens: 0.0 when they were there, else the seconds until they will
        be (nothing is taken then; a take larger than the burst can never succeed: inf)."""
        if count > self._burst:
            return float("inf")
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self._burst, now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        if bucket.tokens >= count:
            bucket.tokens -= count
            return 0.0
        return (count - bucket.tokens) / self._rate
