"""The catalog's change log in a real Redis, as every process reads it.

Whatever sequence of changes the API is sent, what it accepts is applied to the same catalog
(one digest) by the process that took it, by a process that replays the log from its start,
and by the ingest consumer's room, and what it refuses changes no key of Redis. The log
compacted to each item's latest state is read into that same catalog by a process that had
read part of it, by one started after, and by the consumer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import httpx
import numpy as np
import pytest
import pytest_asyncio
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.clients.catalog_compactor import compact
from app.clients.catalog_log import CatalogLog
from app.ingest.refit import ItemRefits
from app.ingest.world import IngestWorld, load_ingest_world
from app.release.keyspace import KeySpace
from app.world.schema import load_schema
from app.world.stamp import read_stamp
from tests.integration.conftest import CONTEXT, Stack, load_redis, serving
from tests.integration.test_catalog_poison import _poison

KEYS = KeySpace("recsys")
HEADROOM = 500
DIM = load_schema().embedding_dim
LOG_PARTS = ("log", "seq", "positions", "withdrawn_seq", "room")


@pytest.fixture(scope="module")
def catalog_redis(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of this module's own, loaded with the stack's world."""
    from recsys_tools.localstack import start_redis

    process, url = start_redis(tmp_path_factory.mktemp("catalog-redis"))
    try:
        load_redis(url, stack.world, stack.schema)
        yield url
    finally:
        process.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def api(stack: Stack, catalog_redis: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = stack.settings(redis_url=catalog_redis, catalog_headroom=HEADROOM)
    async with serving(settings) as client:
        yield client


def _world_id(stack: Stack) -> str:
    stamp = read_stamp(stack.world)
    assert stamp is not None
    return stamp.world_id


async def _consumer_room(stack: Stack, url: str) -> IngestWorld:
    """The ingest consumer's view of the catalog, made as it makes it, read to the log's end
    (its client closed after: `_consumer` keeps one)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        return await _consumer(stack, client)
    finally:
        await client.aclose()


async def _consumer(stack: Stack, client: redis.asyncio.Redis) -> IngestWorld:
    world = load_ingest_world(
        stack.world,
        stack.schema,
        _world_id(stack),
        lambda world_id: CatalogLog(client, KEYS, world_id),
        HEADROOM,
    )
    await world.follow_catalog()
    return world


def _keys(url: str, world_id: str) -> dict[str, Any]:
    """Every key a catalog change of this script may write: the log's own, and the features
    of the items it names (not the answer log and exposure counters that requests and tasks
    write meanwhile)."""
    client = redis.Redis.from_url(url)
    try:
        own = [KEYS.catalog(world_id, part) for part in LOG_PARTS]
        return {key: client.dump(key) for key in [*own, *map(KEYS.item, IDS)]}
    finally:
        client.close()


async def _categories(client: httpx.AsyncClient) -> list[str]:
    body = {"user_id": "u5", "num_items": 1, "context": CONTEXT, "attributes": ["categories"]}
    answer = (await client.post("/recommend", json=body)).json()
    return str(answer["items"][0]["attributes"]["categories"]).split("|")


IDS = ["i1", "i2", "i3"] + [f"new-{n}" for n in range(6)] + ["nobody"]
BAD = [
    {},
    {"published_at": 2**63},
    {"embedding": [1e39] * DIM},
    {"dense": {"price": 1e39}},
    {"categories": ["no such genre"]},
    {"title": "nul\x00"},
]
change: st.SearchStrategy[tuple[Any, ...]] = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(IDS[:-1]), st.integers(0, 3), st.sampled_from(BAD)),
    st.tuples(st.just("withdraw"), st.sampled_from(IDS), st.just(0), st.just({})),
)


@given(st.lists(change, min_size=1, max_size=8))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_what_is_accepted_every_reader_applies_alike_and_a_refusal_changes_nothing(
    api: httpx.AsyncClient, stack: Stack, catalog_redis: str, script: list[tuple[Any, ...]]
) -> None:
    categories = await _categories(api)
    world_id = _world_id(stack)
    for kind, item_id, title, bad in script:
        before = _keys(catalog_redis, world_id)
        if kind == "put":
            item = {"item_id": item_id, "title": f"t{title}", "categories": categories, **bad}
            answered = await api.post("/catalog/items", json={"items": [item]})
        else:
            answered = await api.post("/catalog/withdrawals", json={"item_ids": [item_id]})
        assert answered.status_code in (200, 404, 422), answered.text
        if answered.status_code != 200:
            assert _keys(catalog_redis, world_id) == before, answered.text
    held = (await api.get("/catalog")).json()
    consumer = await _consumer_room(stack, catalog_redis)
    assert consumer.arrivals is not None
    assert consumer.arrivals.room.digest() == held["digest"]
    async with serving(stack.settings(redis_url=catalog_redis, catalog_headroom=HEADROOM)) as later:
        assert (await later.get("/catalog")).json() == held


async def test_the_compacted_log_is_read_into_the_same_catalog_by_every_process(
    api: httpx.AsyncClient, stack: Stack, catalog_redis: str
) -> None:
    categories = await _categories(api)

    async def changes(first: int, count: int) -> None:
        for n in range(first, first + count):
            item = {"item_id": f"c-{n % 7}", "title": f"round {n}", "categories": categories}
            assert (await api.post("/catalog/items", json={"items": [item]})).status_code == 200
            if n % 5 == 0:
                gone = await api.post("/catalog/withdrawals", json={"item_ids": [f"c-{n % 3}"]})
                assert gone.status_code == 200

    settings_ = stack.settings(
        redis_url=catalog_redis, catalog_headroom=HEADROOM, catalog_follow_ms=600_000.0
    )
    await changes(0, 20)
    async with serving(settings_) as behind:  # has read the log up to here, and no further
        await _poison(stack, catalog_redis, HEADROOM)
        await changes(20, 30)
        gone = await api.post("/catalog/withdrawals", json={"item_ids": ["i3", "c-6"]})
        assert gone.status_code == 200, gone.text
        client = redis.asyncio.Redis.from_url(catalog_redis)
        log = CatalogLog(client, KEYS, _world_id(stack))
        consumer = await _consumer_room(stack, catalog_redis)
        assert consumer.arrivals is not None
        length, _ = await log.length(5.0)
        assert await compact(log, consumer.arrivals.room.check, 30.0)
        assert await log.length(5.0) == (2, 2)  # the fold: a part of puts, one of withdrawals
        assert length > 50
        await changes(50, 5)
        held = (await api.get("/catalog")).json()
        assert (await behind.get("/catalog")).json() == held
        async with serving(settings_) as started_after:
            assert (await started_after.get("/catalog")).json() == held
        consumer = await _consumer_room(stack, catalog_redis)
        assert consumer.arrivals is not None
        assert consumer.arrivals.room.digest() == held["digest"]
        await client.aclose()


async def test_a_batch_appended_while_the_log_is_folded_follows_the_fold(
    api: httpx.AsyncClient, stack: Stack, catalog_redis: str
) -> None:
    client = redis.asyncio.Redis.from_url(catalog_redis)
    try:
        log = CatalogLog(client, KEYS, _world_id(stack))
        categories = await _categories(api)
        item = {"item_id": "before-fold", "title": "t", "categories": categories}
        assert (await api.post("/catalog/items", json={"items": [item]})).status_code == 200
        replace = log.replace

        async def late(last_id: str, parts: Any, timeout_s: float) -> bool:
            # Between the log's last read and its replacement: a batch through the API.
            late = {"item_id": "late", "title": "late", "categories": categories}
            assert (await api.post("/catalog/items", json={"items": [late]})).status_code == 200
            return await replace(last_id, parts, timeout_s)

        log.replace = late  # type: ignore[method-assign]
        assert await compact(log, lambda batch: None, 30.0)
        entries, folded = await log.length(5.0)
        assert entries == folded + 1  # the fold, then the entry appended while it folded
        tail = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            await client.xrevrange(KEYS.catalog(_world_id(stack), "log"), count=1),
        )
        assert b'"late"' in tail[0][1][b"body"]
        held = (await api.get("/catalog")).json()
        consumer = await _consumer_room(stack, catalog_redis)
        assert consumer.arrivals is not None
        assert consumer.arrivals.room.digest() == held["digest"]
    finally:
        await client.aclose()


async def test_an_added_item_is_refitted_past_its_first_256_choosers(
    api: httpx.AsyncClient, stack: Stack, catalog_redis: str
) -> None:
    # Redis keeps an item's latest 256 choosers: the refits past them (every 64th) are timed
    # by every chooser noted, not by the list's length, which stops at the cap.
    categories = await _categories(api)
    item = {"item_id": "chosen-often", "title": "t", "categories": categories}
    put = await api.post("/catalog/items", json={"items": [item]})
    assert put.status_code == 200, put.text
    position = put.json()["items"][0]["position"]
    client = redis.asyncio.Redis.from_url(catalog_redis)
    try:
        world = await _consumer(stack, client)
        arrivals, step = world.arrivals, world.step
        assert arrivals is not None
        assert step is not None
        refits = ItemRefits(client, KEYS)
        vector = np.full(DIM, 0.1, dtype="<f4").tobytes()
        chooser = [(position, vector)]
        assert await refits._noted(world, arrivals, step, chooser * 300) == 1
        assert await refits._noted(world, arrivals, step, chooser * 19) == 0
        assert await refits._noted(world, arrivals, step, chooser) == 1  # the 320th
    finally:
        await client.aclose()
