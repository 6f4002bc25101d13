"""CachedCall: one call per interval, however many ask at once."""

from __future__ import annotations

import asyncio

import pytest

from app.core.cached import CachedCall


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_callers_share_one_call_and_reuse_it_until_it_is_stale() -> None:
    clock = Clock()
    cached: CachedCall[int] = CachedCall(1.0, clock)
    calls = 0

    async def call() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return calls

    assert await asyncio.gather(*(cached.get(call) for _ in range(50))) == [1] * 50
    clock.now = 0.9
    assert await cached.get(call) == 1
    clock.now = 1.1
    assert await cached.get(call) == 2
    assert calls == 2


async def test_a_failed_call_is_not_kept_and_a_caller_leaving_does_not_cancel_it() -> None:
    cached: CachedCall[str] = CachedCall(1.0)

    async def failing() -> str:
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        await cached.get(failing)
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(0.02)
        return "up"

    leaving = asyncio.create_task(cached.get(slow))
    await started.wait()
    leaving.cancel()
    assert await cached.get(slow) == "up"
