"""What Redis holds against the served world: an empty store is not an unstamped load."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import cast

import pytest

from app.core.metrics import ServiceMetrics
from app.core.vocabulary import RedisWorld
from app.process.health import watch_redis_world
from app.process.services import Services
from app.release.world_match import redis_world
from app.world.stamp import built_at


@pytest.mark.parametrize(
    ("answered", "found", "served", "held"),
    [
        (True, "w1", "w1", RedisWorld.SERVED),
        (True, "w2", "w1", RedisWorld.ANOTHER),
        (True, "", "w1", RedisWorld.UNSTAMPED),  # loaded before stamping
        (True, "w2", "", RedisWorld.UNSTAMPED),  # a served world without an id
        (True, None, "w1", RedisWorld.NONE),  # no layout record at all: flushed
        (True, None, "", RedisWorld.NONE),
        (False, None, "w1", RedisWorld.UNKNOWN),
    ],
)
def test_what_redis_holds(answered: bool, found: str | None, served: str, held: RedisWorld) -> None:
    assert redis_world(answered, found, served) is held


def test_the_gauge_says_one_state_at_a_time() -> None:
    metrics = ServiceMetrics()
    metrics.note_redis_world(RedisWorld.SERVED)
    metrics.note_redis_world(RedisWorld.NONE)
    values = {
        state.value: metrics.registry.get_sample_value("recsys_redis_world", {"state": state})
        for state in RedisWorld
    }
    assert values == {state.value: float(state is RedisWorld.NONE) for state in RedisWorld}


async def test_the_watch_stops_even_when_the_client_swallows_its_cancellation() -> None:
    entered = asyncio.Event()

    class SwallowingStore:
        """A Redis client that eats a cancellation landing inside a read, as some do."""

        async def world_state(self, timeout_s: float) -> tuple[bool, str | None]:
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
            return True, None

    metrics = ServiceMetrics()
    served = SimpleNamespace(stamp=None, world_id="")
    services = SimpleNamespace(store=SwallowingStore(), served=served, metrics=metrics)
    watch = asyncio.create_task(watch_redis_world(cast(Services, services), interval_s=10))
    await entered.wait()
    watch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(watch, timeout=2)
    assert metrics.registry.get_sample_value("recsys_redis_world", {"state": "none"}) == 1


def test_a_worlds_build_time_is_read_from_its_id() -> None:
    assert built_at("20261203-193822-1f46a9") == 1_796_326_702.0
    assert built_at("my-own-world") is None
    assert built_at("") is None
