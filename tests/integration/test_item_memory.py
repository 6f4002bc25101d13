"""Item features held in memory: the same answers as Redis per request, kept current."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis

from app.clients.feature_store import ITEMS_VERSION_FIELD
from app.core.metrics import ServiceMetrics
from app.process.services import start_services
from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = pytest.mark.integration
USERS = ("u1", "u7", "u42", "u123", "nobody")


async def _answers(stack: Stack, item_features: str) -> list[Any]:
    settings = stack.settings(item_features=item_features, rules_file=stack.plain_rules)
    async with serving(settings) as api:
        answers = []
        for user in USERS:
            body = {"user_id": user, "num_items": 10, "context": CONTEXT}
            answer = (await api.post("/recommend", json=body)).json()
            answers.append((answer["items"], answer["degraded"]))
    return answers


async def test_held_features_give_the_same_answers_as_redis(stack: Stack) -> None:
    held, per_request = await _answers(stack, "full"), await _answers(stack, "off")
    assert held == per_request
    assert all(degraded == [] for _, degraded in held)


def _text(value: object) -> str:
    assert isinstance(value, bytes)
    return value.decode()


async def test_a_new_load_is_read_beside_and_swapped_whole(stack: Stack, loaded_redis: str) -> None:
    services = await start_services(stack.settings(redis_url=loaded_redis), ServiceMetrics())
    client = redis.Redis.from_url(loaded_redis)
    try:
        memory = services.served.item_memory
        assert memory is not None
        before = memory.current
        assert before.version == _text(client.hget("recsys:meta", ITEMS_VERSION_FIELD))
        keys = services.served.artifacts.current.item_keys
        position = 17
        raw = client.get(keys[position])
        assert isinstance(raw, bytes)
        stored = np.frombuffer(raw, dtype="<f4")
        np.testing.assert_array_equal(before.blobs[position], stored)
        assert before.usable.all()

        assert await memory.refresh() is False  # same version: nothing read
        changed = stored + 1.0
        client.set(keys[position], changed.astype("<f4").tobytes())
        client.delete(keys[position + 1])
        client.hset("recsys:meta", ITEMS_VERSION_FIELD, "v2")
        assert await memory.refresh() is True
        after = memory.current
        assert after.version == "v2"
        np.testing.assert_array_equal(after.blobs[position], changed)
        assert not after.usable[position + 1]
        # What a request read before the swap is untouched.
        np.testing.assert_array_equal(before.blobs[position], stored)

        client.delete("recsys:meta")  # a load in progress: nothing to read yet
        assert await memory.refresh() is False
        assert memory.current is after
    finally:
        client.close()
        await services.aclose()


async def test_the_matrix_is_read_through_a_pause_longer_than_a_requests_redis_timeout(
    stack: Stack, loaded_redis: str
) -> None:
    """The whole matrix is megabytes: read with the request path's client, one read of a
    reply kept waiting past its 25 ms socket timeout failed it (and the start-up) on a busy
    host. A pause of Redis stands in for the busy moment."""
    settings = stack.settings(redis_url=loaded_redis, redis_timeout_ms=25.0)
    services = await start_services(settings, ServiceMetrics())
    client = redis.Redis.from_url(loaded_redis)
    try:
        memory = services.served.item_memory
        assert memory is not None
        client.hset("recsys:meta", ITEMS_VERSION_FIELD, "after-a-pause")
        client.client_pause(300, all=True)
        assert await memory.refresh() is True
        assert memory.current.version == "after-a-pause"
    finally:
        client.close()
        await services.aclose()
