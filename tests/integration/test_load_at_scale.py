"""load-redis at scale, against a real Redis: chunks written by several threads give the same
keys as one thread, and a load killed part-way goes on where it stopped when run again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from recsys_tools.localstack import start_redis
from recsys_tools.world.store import redis_loader
from recsys_tools.world.store.redis_loader import RedisUnreachableError, load_world_into_redis

from app.release.keyspace import KeySpace
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


@pytest.fixture
def two_redis(tmp_path: Path) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    first, first_url = start_redis(tmp_path / "one")
    second, second_url = start_redis(tmp_path / "two")
    clients = redis.Redis.from_url(first_url), redis.Redis.from_url(second_url)
    try:
        yield clients
    finally:
        for client in clients:
            client.close()
        second.stop()
        first.stop()


def _contents(client: redis.Redis) -> dict[bytes, bytes]:
    """Every blob and list the load wrote (the layout record's version differs per load)."""
    keys = [key for key in client.scan_iter(count=1000) if b":meta" not in key]
    return dict(zip(keys, client.mget(keys), strict=True))


def test_threads_write_what_one_thread_writes(
    stack: Stack, two_redis: tuple[redis.Redis, redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_loader, "CHUNK", 37)  # many chunks on a small world
    one, several = two_redis
    alone = load_world_into_redis(stack.world, one, stack.schema, KeySpace("recsys"), workers=1)
    threaded = load_world_into_redis(stack.world, several, stack.schema, KeySpace("recsys"), 4)
    assert alone == threaded
    assert alone.users > 37 * 3
    assert _contents(one) == _contents(several)
    assert not several.exists("recsys:meta:loading")  # cleared once whole


def test_a_load_stopped_part_way_resumes_where_it_stopped(
    stack: Stack, two_redis: tuple[redis.Redis, redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_loader, "CHUNK", 37)
    whole, resumed = two_redis
    keys = KeySpace("recsys")
    load_world_into_redis(stack.world, whole, stack.schema, keys, workers=1)
    real = redis_loader._write_batches
    written: list[int] = []

    def failing(client: redis_loader.Client, pairs: object) -> int:
        if len(written) == 5:
            raise redis.ConnectionError("the connection dropped")
        count = real(client, pairs)  # type: ignore[arg-type]
        written.append(count)
        return count

    monkeypatch.setattr(redis_loader, "_write_batches", failing)
    with pytest.raises(RedisUnreachableError, match="the connection dropped"):
        load_world_into_redis(stack.world, resumed, stack.schema, keys, workers=1)
    assert not resumed.exists(keys.meta)  # readers do not trust a part-load
    assert len(resumed.hgetall("recsys:meta:loading")) == 1 + 5  # the world, five chunks
    written.clear()

    def counted(client: redis_loader.Client, pairs: object) -> int:
        written.append(0)
        return real(client, pairs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis_loader, "_write_batches", counted)
    load_world_into_redis(stack.world, resumed, stack.schema, keys, workers=2)
    chunks_in_all = sum(-(-rows // 37) for rows in _rows(stack.world))
    assert len(written) == chunks_in_all - 5  # only what was missing
    assert _contents(resumed) == _contents(whole)
    assert resumed.exists(keys.meta)
    assert not resumed.exists("recsys:meta:loading")


def _rows(world: Path) -> list[int]:
    """Rows of each part the loader writes: items, users, seen lists, positives."""
    counts = []
    for name, field in (("items.npz", "ids"), ("users.npz", "ids"), ("seen.npz", "user_ids"),
                        ("positives.npz", "user_ids")):  # fmt: skip
        if (world / name).is_file():
            with np.load(world / name) as table:
                counts.append(len(table[field]))
    return counts
