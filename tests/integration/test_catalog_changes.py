"""Items put into the catalog and withdrawn while serving, against a real Redis and Triton:
an added item is answered at once, a withdrawn one never again from its acknowledgement, a
process started later replays the log into the same catalog, and bad changes apply nothing."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import time
import zlib
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import redis
from recsys_tools.cli import main as recsys_main
from recsys_tools.localstack import ManagedProcess, start_ingest
from recsys_tools.world.read.items import ItemColumns, read_items

from app.clients.feature_store import decode_seen
from app.ingest.world import item_step_of
from app.release.keyspace import KeySpace
from app.world.layout import ITEM_PRIOR_FILE, ITEMS_FILE
from app.world.stamp import read_stamp
from tests.integration.conftest import CONTEXT, SMALL_WORLD, Stack, serving

KEYS = KeySpace("recsys")
USER = "u5"
APPLIED_WITHIN_S = 20.0


def _bytes(client: redis.Redis, key: str) -> bytes:
    return cast(bytes | None, client.get(key)) or b""


async def _answer(api: httpx.AsyncClient, user: str = USER, n: int = 20) -> list[str]:
    body = {"user_id": user, "num_items": n, "context": CONTEXT}
    answered = await api.post("/recommend", json=body)
    assert answered.status_code == 200, answered.text
    return [item["item_id"] for item in answered.json()["items"]]


def _like_the_top(url: str, top: str, dim: int) -> dict[str, Any]:
    """An item the user should like: the top answer's features, the user's own direction."""
    client = redis.Redis.from_url(url)
    try:
        user = np.frombuffer(_bytes(client, KEYS.user(USER)), dtype="<f4")
        item = np.frombuffer(_bytes(client, KEYS.item(top)), dtype="<f4")
    finally:
        client.close()
    direction = user[:dim] / np.linalg.norm(user[:dim])
    embedding = direction * float(np.linalg.norm(item[:dim])) * 1.5
    return {
        "embedding": [float(v) for v in embedding],
        "dense": {
            "log_popularity": float(item[dim]),
            "freshness": 1.0,
            "price": float(item[dim + 2]),
            "quality": 1.0,
        },
    }


async def _categories(api: httpx.AsyncClient, item: str) -> list[str]:
    body = {"user_id": USER, "num_items": 20, "context": CONTEXT, "attributes": ["categories"]}
    answer = (await api.post("/recommend", json=body)).json()
    named = {i["item_id"]: i["attributes"]["categories"] for i in answer["items"]}
    return str(named[item]).split("|")


async def test_an_added_item_is_answered_at_once_and_a_withdrawn_one_never_again(
    stack: Stack, loaded_redis: str
) -> None:
    async with serving(stack.settings(redis_url=loaded_redis)) as api:
        first = await _answer(api)
        top = first[0]
        new = {
            "item_id": "fresh-1",
            "title": "Fresh Arrival",
            "categories": await _categories(api, top),
            **_like_the_top(loaded_redis, top, stack.schema.embedding_dim),
        }
        put = await api.post("/catalog/items", json={"items": [new]})
        assert put.status_code == 200, put.text
        assert put.json()["items"] == [
            {"item_id": "fresh-1", "position": SMALL_WORLD.items, "guessed": False}
        ]
        # No wait: the answer after the acknowledgement holds it (the ranker places it).
        assert "fresh-1" in await _answer(api, n=200)
        # Its attributes are the ones put.
        body = {"user_id": USER, "num_items": 200, "context": CONTEXT, "attributes": ["title"]}
        items = (await api.post("/recommend", json=body)).json()["items"]
        assert {i["item_id"]: i["attributes"]["title"] for i in items}["fresh-1"] == "Fresh Arrival"
        gone = await api.post("/catalog/withdrawals", json={"item_ids": ["fresh-1", top]})
        assert gone.status_code == 200, gone.text
        for _ in range(5):
            answer = await _answer(api, n=200)
            assert "fresh-1" not in answer
            assert top not in answer
        state = (await api.get("/catalog")).json()
        assert state["added"] == 1
        assert state["withdrawn"] == 2
        assert state["batch"] == 2


async def test_an_item_without_an_embedding_gets_the_worlds_guess(
    stack: Stack, loaded_redis: str
) -> None:
    async with serving(stack.settings(redis_url=loaded_redis)) as api:
        top = (await _answer(api))[0]
        categories = await _categories(api, top)
        put = await api.post(
            "/catalog/items",
            json={
                "items": [
                    {"item_id": "guessed-1", "title": "A Quiet Island", "categories": categories}
                ]
            },
        )
        assert put.status_code == 200, put.text
        assert put.json()["items"][0]["guessed"] is True
    client = redis.Redis.from_url(loaded_redis)
    try:
        blob = np.frombuffer(_bytes(client, KEYS.item("guessed-1")), dtype="<f4")
    finally:
        client.close()
    # The blob the processes that read Redis use: the world's guess from those attributes
    # (the dense features left out are 0), not zeros. Worked out here from the file itself,
    # as its format describes the ridge regression, not by the service's own function.
    dim = stack.schema.embedding_dim
    with np.load(stack.world / ITEM_PRIOR_FILE) as stored:
        names = stored["category_names"].tolist()
        buckets = int(stored["buckets"])
        weights, mean = stored["weights"], stored["mean"]
        dense_mean, dense_scale = stored["dense_mean"], stored["dense_scale"]
    known = sorted({names.index(name) for name in categories if name in names})
    assert known  # the top item's categories are the world's own
    words = {len(names) + zlib.crc32(word.encode()) % buckets for word in ("a", "quiet", "island")}
    dense = (np.zeros(4) - dense_mean) / dense_scale
    expected = (
        mean
        + weights[known].sum(axis=0)
        + weights[sorted(words)].sum(axis=0)
        + dense @ weights[len(names) + buckets :]
    )
    assert blob.shape == (stack.schema.item_blob_width,)
    np.testing.assert_allclose(blob[:dim], expected, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(expected) > 0
    assert not blob[dim:].any()


async def test_a_process_started_later_replays_the_log_into_the_same_catalog(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    # Exploration draws at random: off, so two processes' answers can be compared whole.
    rules = tmp_path / "rules.toml"
    rules.write_text(stack.plain_rules.read_text() + "[explore]\nslots = 0\n")
    settings = stack.settings(redis_url=loaded_redis, rules_file=rules)
    async with serving(settings) as first:
        categories = await _categories(first, (await _answer(first))[0])
        for n in range(100):
            item = {"item_id": f"new-{n}", "title": f"Item {n}", "categories": categories}
            answered = await first.post("/catalog/items", json={"items": [item]})
            assert answered.status_code == 200, answered.text
        withdrawn = await first.post("/catalog/withdrawals", json={"item_ids": ["new-7", "i3"]})
        assert withdrawn.status_code == 200
        # The later process reads the log in the background only once a minute: what it
        # knows of later changes, it learns when a request finds the log ahead of it.
        async with serving(settings.model_copy(update={"catalog_follow_ms": 60_000.0})) as later:
            here, there = (await first.get("/catalog")).json(), (await later.get("/catalog")).json()
            assert here == there
            assert here["added"] == 100
            assert await _answer(first, "u9", 50) == await _answer(later, "u9", 50)
            shown = (await _answer(later, "u9"))[0]
            gone = await first.post("/catalog/withdrawals", json={"item_ids": [shown]})
            assert gone.status_code == 200
            assert shown not in await _answer(later, "u9", 200)


async def test_bad_changes_are_refused_naming_the_field_and_apply_nothing(
    stack: Stack, loaded_redis: str
) -> None:
    good = {"item_id": "ok-1", "title": "Fine", "categories": []}
    async with serving(stack.settings(redis_url=loaded_redis, catalog_headroom=2)) as api:
        good["categories"] = await _categories(api, (await _answer(api))[0])
        dim = stack.schema.embedding_dim
        cases: list[tuple[dict[str, Any], str]] = [
            ({**good, "embedding": [0.1] * (dim - 1)}, "items.0.embedding"),
            ({**good, "embedding": [math.nan] * dim}, "items.0.embedding"),
            ({**good, "dense": {"price": math.inf}}, "items.0.dense"),
            ({**good, "dense": {"shoe_size": 1.0}}, "items.0.dense.shoe_size"),
            ({**good, "categories": ["no such genre"]}, "items.0.categories.0"),
        ]
        for item, field in cases:
            # NaN and Infinity as many JSON writers send them (not standard JSON).
            raw = json.dumps({"items": [item]})
            headers = {"content-type": "application/json"}
            answered = await api.post("/catalog/items", content=raw, headers=headers)
            assert answered.status_code == 422, (field, answered.text)
            assert field in [f["field"] for f in answered.json()["fields"]], answered.text
        twice = [good, {**good, "title": "Other"}]
        answered = await api.post("/catalog/items", json={"items": twice})
        assert answered.status_code == 422
        assert answered.json()["fields"][0]["field"] == "items.1.item_id"
        unknown = await api.post("/catalog/withdrawals", json={"item_ids": ["nobody"]})
        assert unknown.status_code == 404
        assert (await api.get("/catalog")).json()["batch"] == 0
        three = [{**good, "item_id": f"room-{n}"} for n in range(3)]
        full = await api.post("/catalog/items", json={"items": three})
        assert full.status_code == 409, full.text
        assert (await api.get("/catalog")).json()["added"] == 0
        assert (await api.post("/catalog/items", json={"items": three[:2]})).status_code == 200
    token = "a-catalog-token-of-some-length"
    async with serving(
        stack.settings(redis_url=loaded_redis, admin_token=token, catalog_headroom=2)
    ) as api:
        assert (await api.post("/catalog/items", json={"items": [good]})).status_code == 401


async def test_a_change_redis_cannot_take_is_a_503_that_names_it_and_answers_go_on(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    redis_process, url = own_redis
    async with serving(stack.settings(redis_url=url, catalog_headroom=2)) as api:
        served = await _answer(api)
        categories = await _categories(api, served[0])
        redis_process.stop()
        item = {"item_id": "late-1", "title": "Late", "categories": categories}
        changes = [
            await api.post("/catalog/items", json={"items": [item]}),
            await api.post("/catalog/withdrawals", json={"item_ids": [served[0]]}),
        ]
        for answered in changes:
            assert answered.status_code == 503, answered.text
            body = answered.json()
            assert set(body) == {"error", "message", "fields", "request_id"}
            assert body["error"] == "catalog_unavailable", body
            assert "nothing was applied" in body["message"], body
        # The catalog's store gone is a degraded answer for /recommend, never a refusal.
        body = {"user_id": USER, "num_items": 20, "context": CONTEXT}
        answered = await api.post("/recommend", json=body)
        assert answered.status_code == 200, answered.text
        assert answered.json()["degraded"], answered.text


async def _seen_holds(client: redis.Redis, position: int, consumer: ManagedProcess) -> None:
    give_up = time.monotonic() + APPLIED_WITHIN_S
    while position not in decode_seen(_bytes(client, KEYS.seen(USER)))[0].tolist():
        assert time.monotonic() < give_up, consumer.log_tail()
        await asyncio.sleep(0.05)


async def test_a_click_on_an_added_item_is_applied_by_the_consumer_and_so_are_the_next(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    # The user's stored lists then name a position past the world's: the consumer must still
    # read them as whole, not set the user's later events aside.
    settings = {"RECSYS_REDIS_URL": loaded_redis, "RECSYS_ARTIFACTS_DIR": str(stack.world)}
    consumer: ManagedProcess = start_ingest(settings, tmp_path / "ingest")
    client = redis.Redis.from_url(loaded_redis)
    with np.load(stack.world / ITEMS_FILE) as stored:
        ids = stored["ids"].astype(str).tolist()
    try:
        async with serving(stack.settings(redis_url=loaded_redis)) as api:
            top = (await _answer(api))[0]
            categories = await _categories(api, top)
            item = {"item_id": "clicked-1", "title": "Clicked", "categories": categories}
            assert (await api.post("/catalog/items", json={"items": [item]})).status_code == 200
            for n, chosen in enumerate(("clicked-1", top)):
                event = {"event_id": f"c{n}", "user_id": USER, "item_id": chosen, "type": "click"}
                posted = await api.post("/events", json={"events": [event]})
                assert posted.status_code == 202, posted.text
                assert posted.json()["accepted"] == 1
                position = SMALL_WORLD.items if chosen == "clicked-1" else ids.index(top)
                await _seen_holds(client, position, consumer)
    finally:
        client.close()
        consumer.stop()
    assert "set aside" not in consumer.log_tail()


async def test_an_added_items_vector_follows_the_users_who_choose_it(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    settings = {"RECSYS_REDIS_URL": loaded_redis, "RECSYS_ARTIFACTS_DIR": str(stack.world)}
    consumer: ManagedProcess = start_ingest(settings, tmp_path / "ingest")
    users = [f"u{n}" for n in range(20, 28)]
    dim = stack.schema.embedding_dim
    try:
        async with serving(stack.settings(redis_url=loaded_redis)) as api:
            categories = await _categories(api, (await _answer(api))[0])
            item = {"item_id": "liked-1", "title": "Liked", "categories": categories}
            assert (await api.post("/catalog/items", json={"items": [item]})).status_code == 200
            batch = (await api.get("/catalog")).json()["batch"]
            client = redis.Redis.from_url(loaded_redis)
            try:
                guess = np.frombuffer(_bytes(client, KEYS.item("liked-1")), dtype="<f4")[:dim]
                events = [
                    {"event_id": f"l{n}", "user_id": user, "item_id": "liked-1", "type": "like"}
                    for n, user in enumerate(users)
                ]
                posted = await api.post("/events", json={"events": events})
                assert posted.status_code == 202, posted.text
                # Refits at 1, 2, 4 and 8 choosers (one a batch of events at most): the last
                # comes once the eighth is noted, and the log holds it when it stops growing.
                by = KEYS.catalog(_world_id(stack), f"by:{SMALL_WORLD.items}")
                give_up = time.monotonic() + APPLIED_WITHIN_S
                while client.llen(by) < len(users):
                    assert time.monotonic() < give_up, consumer.log_tail()
                    await asyncio.sleep(0.05)
                last, still = -1, 0
                while still < 10:
                    now = (await api.get("/catalog")).json()["batch"]
                    last, still = now, still + 1 if now == last else 0
                    assert time.monotonic() < give_up, consumer.log_tail()
                    await asyncio.sleep(0.1)
                assert last > batch
                choosers = np.stack(
                    [np.frombuffer(_bytes(client, KEYS.user(u)), dtype="<f4")[:dim] for u in users]
                )
                moved = _last_embedding(client, KEYS.catalog(_world_id(stack), "log"))
            finally:
                client.close()
            state = (await api.get("/catalog")).json()
        assert state["added"] == 1  # the same item, put again: its position kept
        assert state["batch"] == last
        # The users who chose it (their directions, at the world's user norm: what the step
        # reads of them) now score it nearer what the world's users give what they chose.
        with np.load(stack.world / ITEMS_FILE) as stored:
            step = item_step_of(stack.world, stored["ids"], stored["embeddings"])
        readers = choosers / np.linalg.norm(choosers, axis=1, keepdims=True) * step.user_norm
        before, after = float(np.mean(readers @ guess)), float(np.mean(readers @ moved))
        assert abs(after - step.target) < 0.75 * abs(before - step.target), (before, after)
    finally:
        consumer.stop()


def _world_id(stack: Stack) -> str:
    stamp = read_stamp(stack.world)
    assert stamp is not None
    return stamp.world_id


def _last_embedding(client: redis.Redis, log: str) -> np.ndarray:
    """The embedding the change log's last batch puts: what every process applies."""
    [(_, fields)] = cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrevrange(log, count=1))
    body = json.loads(fields[b"body"])
    return np.asarray(body["puts"][0][6], dtype=np.float32)


async def test_the_catalog_as_served_is_exported_for_the_next_build(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    async with serving(stack.settings(redis_url=loaded_redis)) as api:
        categories = await _categories(api, (await _answer(api))[0])
        item = {"item_id": "kept-1", "title": "Kept", "categories": categories}
        assert (await api.post("/catalog/items", json={"items": [item]})).status_code == 200
        gone = await api.post("/catalog/withdrawals", json={"item_ids": ["i0"]})
        assert gone.status_code == 200
    out = tmp_path / "items-now.csv"
    assert (
        recsys_main(
            [
                "export-catalog",
                "--world",
                str(stack.world),
                "--redis-url",
                loaded_redis,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    with out.open() as handle:
        rows = {row["item_id"]: row for row in csv.DictReader(handle)}
    assert len(rows) == SMALL_WORLD.items  # the world's, one withdrawn, one added
    assert "i0" not in rows
    assert rows["kept-1"]["title"] == "Kept"
    assert rows["kept-1"]["categories"] == "|".join(categories)
    # The next build reads it as its item table.
    read = read_items(
        out, ItemColumns(category="categories", title="title", published="published_at")
    )
    assert "kept-1" in read.ids.tolist()
