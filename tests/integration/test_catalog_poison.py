"""Catalog changes that once wedged every process, against a real Redis and Triton.

A reload onto a new index keeps the added items found, the index they were filed under
freed. A batch no process can apply (written past the API's checks, as a hostile writer or another
version of the service would) is skipped, counted, by the process serving, by one started
after it and by the consumer, while the changes after it apply and answers keep coming.
Values past the types they are stored in are refused naming the field, with nothing
applied; a batch refused for room writes no item blob; a process whose headroom differs
from the one the world's log began with is refused at start in one line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
import redis.asyncio
from recsys_tools.localstack import ManagedProcess, start_ingest
from recsys_tools.world.store.reindex import reindex_beside

from app.clients.catalog_log import CatalogLog
from app.clients.feature_store import decode_seen
from app.core.errors import ConfigError
from app.core.metrics import ServiceMetrics
from app.process.services import start_services
from app.release.arrivals import ItemChange, encode_changes
from app.release.keyspace import KeySpace
from app.world.stamp import read_stamp
from tests.integration.conftest import CONTEXT, SMALL_WORLD, Stack, metric_samples, serving
from tests.integration.test_catalog_changes import _like_the_top

KEYS = KeySpace("recsys")
USER = "u5"
SKIPPED = "recsys_catalog_batches_skipped_total{}"
APPLIED_WITHIN_S = 20.0


async def _answer(api: httpx.AsyncClient, n: int = 20) -> list[str]:
    body = {"user_id": USER, "num_items": n, "context": CONTEXT}
    answered = await api.post("/recommend", json=body)
    assert answered.status_code == 200, answered.text
    return [item["item_id"] for item in answered.json()["items"]]


async def _categories(api: httpx.AsyncClient) -> list[str]:
    body = {"user_id": USER, "num_items": 1, "context": CONTEXT, "attributes": ["categories"]}
    answer = (await api.post("/recommend", json=body)).json()
    return str(answer["items"][0]["attributes"]["categories"]).split("|")


async def _skipped(api: httpx.AsyncClient) -> float:
    return metric_samples((await api.get("/metrics")).text)[SKIPPED]


async def _poison(stack: Stack, url: str, headroom: int, **bad_values: Any) -> int:
    """A batch whose time no int64 holds (or `bad_values`), appended to the log as the API
    never would."""
    stamp = read_stamp(stack.world)
    assert stamp is not None
    schema = stack.schema
    fine = ItemChange(
        item_id="poison",
        position=-1,
        title="Poison",
        categories=("x",),
        category=0,
        published_at=1_700_000_000,
        dense=(0.0,) * len(schema.item_dense),
        embedding=(0.1,) * schema.embedding_dim,
    )
    bad = dataclasses.replace(fine, **(bad_values or {"published_at": 2**63}))
    client = redis.asyncio.Redis.from_url(url)
    try:
        if "item_id" not in bad_values:
            log = CatalogLog(client, KEYS, stamp.world_id)
            return (await log.append([bad], [], SMALL_WORLD.items, headroom, 5.0)).seq
        # An id no key can hold cannot even be sent to the script: the entry by hand.
        seq = int(await client.incr(KEYS.catalog(stamp.world_id, "seq")))
        fields = {"seq": seq, "body": encode_changes([bad], []), "positions": "3999"}
        await client.xadd(KEYS.catalog(stamp.world_id, "log"), fields)  # type: ignore[arg-type]
        return seq
    finally:
        await client.aclose()


async def _seen_holds(url: str, position: int, consumer: ManagedProcess) -> None:
    client = redis.Redis.from_url(url)
    give_up = time.monotonic() + APPLIED_WITHIN_S
    try:
        while True:
            seen = decode_seen(cast(bytes | None, client.get(KEYS.seen(USER))) or b"")[0]
            if position in seen.tolist():
                return
            assert time.monotonic() < give_up, consumer.log_tail()
            await asyncio.sleep(0.05)
    finally:
        client.close()


async def test_a_batch_no_process_can_apply_is_skipped_and_what_follows_is_served(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    settings = stack.settings(redis_url=loaded_redis)
    consumer_settings = {"RECSYS_REDIS_URL": loaded_redis, "RECSYS_ARTIFACTS_DIR": str(stack.world)}
    async with serving(settings) as first:
        shown = (await _answer(first))[0]
        categories = await _categories(first)
        poison = await _poison(stack, loaded_redis, settings.catalog_headroom)
        # A withdrawal after it: acknowledged, and from then on in no answer.
        gone = await first.post("/catalog/withdrawals", json={"item_ids": [shown]})
        assert gone.status_code == 200, gone.text
        assert gone.json()["batch"] == poison + 1
        assert shown not in await _answer(first, 200)
        after = {"item_id": "after", "title": "After", "categories": categories}
        added = await first.post("/catalog/items", json={"items": [after]})
        assert added.status_code == 200, added.text
        position = added.json()["items"][0]["position"]  # past the poison's, never filled
        state = (await first.get("/catalog")).json()
        assert state["batch"] == poison + 2
        assert state["added"] == 1  # "after"; the poison holds no row
        assert await _skipped(first) == 1
        # A process started past the poison replays the log, skips it, and serves.
        async with serving(settings) as later:
            assert (await later.get("/catalog")).json() == state
            assert shown not in await _answer(later, 200)
            assert await _skipped(later) == 1
        # The consumer skips it too, and applies the events after it.
        consumer = start_ingest(consumer_settings, tmp_path / "ingest", metrics=True)
        try:
            event = {"event_id": "e1", "user_id": USER, "item_id": "after", "type": "click"}
            posted = await first.post("/events", json={"events": [event]})
            assert posted.status_code == 202, posted.text
            await _seen_holds(loaded_redis, position, consumer)
            metrics = f"http://127.0.0.1:{consumer.ports['metrics']}/metrics"
            async with httpx.AsyncClient() as scraper:
                scraped = (await scraper.get(metrics)).text
            assert metric_samples(scraped)[SKIPPED] == 1
        finally:
            consumer.stop()
    assert f"batch {poison} skipped" in consumer.log_tail(200)


@pytest.mark.parametrize(
    "bad", [{"item_id": "poison\ud800"}, {"title": "\ud800"}, {"categories": ("x\x00",)}]
)
async def test_a_batch_of_text_no_key_or_answer_can_hold_is_skipped(
    stack: Stack, loaded_redis: str, bad: dict[str, Any]
) -> None:
    settings = stack.settings(redis_url=loaded_redis)
    async with serving(settings) as api:
        await _poison(stack, loaded_redis, settings.catalog_headroom, **bad)
        state = await api.get("/catalog")  # the digest hashes every id and word put
        assert state.status_code == 200, state.text
        body = {"user_id": USER, "num_items": 200, "context": CONTEXT, "attributes": ["title"]}
        answered = await api.post("/recommend", json=body)
        assert answered.status_code == 200, answered.text
        assert await _skipped(api) == 1


async def test_values_past_the_types_they_are_stored_in_are_refused_naming_the_field(
    stack: Stack, loaded_redis: str
) -> None:
    dim = stack.schema.embedding_dim
    async with serving(stack.settings(redis_url=loaded_redis)) as api:
        good: dict[str, Any] = {"item_id": "ok", "title": "Fine", "categories": []}
        good["categories"] = await _categories(api)
        cases: list[tuple[dict[str, Any], str]] = [
            ({**good, "published_at": 2**63}, "items.0.published_at"),
            ({**good, "embedding": [1e39] * dim}, "items.0.embedding"),  # inf as float32
            ({**good, "embedding": [1e4] * dim}, "items.0.embedding"),  # far past the world's
            ({**good, "dense": {"price": 1e39}}, "items.0.dense"),
            ({**good, "dense": {"price": 3e38, "quality": 3e38}}, "items.0.dense"),  # the guess
            ({**good, "item_id": "ok\x00"}, "items.0.item_id"),
        ]
        for item, field in cases:
            answered = await api.post("/catalog/items", json={"items": [item]})
            assert answered.status_code == 422, (field, answered.text)
            assert field in [f["field"] for f in answered.json()["fields"]], answered.text
        surrogate = '{"items": [{"item_id": "ok", "title": "\\ud800", "categories": ["x"]}]}'
        answered = await api.post(
            "/catalog/items", content=surrogate, headers={"content-type": "application/json"}
        )
        assert answered.status_code == 422, answered.text
        assert answered.json()["fields"][0]["field"] == "items.0.title"
        state = (await api.get("/catalog")).json()
        assert (state["batch"], state["added"]) == (0, 0)


async def test_a_batch_refused_for_room_writes_no_item_blob(
    stack: Stack, loaded_redis: str
) -> None:
    client = redis.Redis.from_url(loaded_redis)
    try:
        async with serving(stack.settings(redis_url=loaded_redis, catalog_headroom=1)) as api:
            world_item = (await _answer(api))[0]
            categories = await _categories(api)
            before = cast(bytes, client.get(KEYS.item(world_item)))
            again = {"item_id": world_item, "title": "Changed", "categories": categories}
            new = [{"item_id": f"n{n}", "title": "New", "categories": categories} for n in (1, 2)]
            refused = await api.post("/catalog/items", json={"items": [again, *new]})
            assert refused.status_code == 409, refused.text
            assert client.get(KEYS.item(world_item)) == before
            assert client.get(KEYS.item("n1")) is None
            # Accepted, the blobs are written.
            accepted = await api.post("/catalog/items", json={"items": [again, new[0]]})
            assert accepted.status_code == 200, accepted.text
            assert client.get(KEYS.item("n1")) is not None
    finally:
        client.close()


async def test_a_process_with_another_headroom_is_refused_at_start(
    stack: Stack, loaded_redis: str
) -> None:
    # Before any change, a deployment gone left nothing that depends on its room.
    async with serving(stack.settings(redis_url=loaded_redis, catalog_headroom=40)):
        pass
    async with serving(stack.settings(redis_url=loaded_redis, catalog_headroom=50)) as api:
        item = {"item_id": "n1", "title": "t", "categories": await _categories(api)}
        assert (await api.post("/catalog/items", json={"items": [item]})).status_code == 200
        other = stack.settings(redis_url=loaded_redis, catalog_headroom=60)
        with pytest.raises(ConfigError, match="RECSYS_CATALOG_HEADROOM is 60 here, 50 in"):
            await start_services(other, ServiceMetrics())


async def test_a_reload_onto_a_new_index_keeps_the_added_items_found_under_load(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    # Worlds of a few thousand items get a flat index; this one is given cells, as every
    # production-size catalog has, so added items are filed under them.
    first, second = tmp_path / "ivf-a", tmp_path / "ivf-b"
    reindex_beside(stack.world, first, "IVF16,Flat")
    served = tmp_path / "served"
    served.symlink_to(first)
    token = "a-reloading-token-of-some-length"
    settings = stack.settings(redis_url=loaded_redis, artifacts_dir=served, admin_token=token)
    async with serving(settings) as api:
        top = (await _answer(api))[0]
        new = {
            "item_id": "filed-1",
            "title": "Filed",
            "categories": await _categories(api),
            **_like_the_top(loaded_redis, top, stack.schema.embedding_dim),
        }
        bearer = {"authorization": f"Bearer {token}"}
        put = await api.post("/catalog/items", json={"items": [new]}, headers=bearer)
        assert put.status_code == 200, put.text
        assert "filed-1" in await _answer(api, 200)
        reindex_beside(first, second, "IVF8,Flat")
        served.unlink()
        served.symlink_to(second)
        load = [asyncio.create_task(_answer(api, 200)) for _ in range(30)]
        reloaded = await api.post("/admin/reload", headers=bearer)
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["generation"] == 2
        answers = await asyncio.gather(*load)  # every one a 200 (asserted in _answer)
        gc.collect()  # the first index is gone; the added items' filing is not
        answers += [await _answer(api, 200) for _ in range(10)]
        assert all("filed-1" in answer for answer in answers[-10:])
