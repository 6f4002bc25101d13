"""The user's latest positives, read from a real Redis with their features."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from app.clients.breaker import CircuitBreaker
from app.clients.feature_store import FeatureStore, encode_seen
from app.release.keyspace import KeySpace
from tests.integration.conftest import Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_a_users_read_carries_the_tail_of_their_positives(stack: Stack) -> None:
    client = aioredis.from_url(stack.redis_url)
    keys = KeySpace(stack.settings().redis_key_prefix)
    store = FeatureStore(
        client, stack.schema, keys, CircuitBreaker("redis", failures=5, open_s=1.0), 20
    )
    try:
        await client.set(keys.positives("recent-test"), encode_seen(range(30)))
        record = await store.user("recent-test", 1.0)
        assert record.recent.tolist() == list(range(10, 30))  # the latest 20, oldest first
        await client.set(keys.positives("recent-test"), encode_seen([7, 8]))
        assert (await store.user("recent-test", 1.0)).recent.tolist() == [7, 8]
        assert (await store.user("nobody-at-all", 1.0)).recent.tolist() == []
    finally:
        await client.delete(keys.positives("recent-test"))
        await client.aclose()
