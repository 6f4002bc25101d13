"""Exploration against a real Redis, Triton and ingest consumer: a newcomer takes the
answer's last slot, its showings are written by the API and its positives by the consumer,
and the counts come back to every process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from recsys_tools.localstack import ManagedProcess, start_ingest

from app.clients.exposure import exposure_keys
from app.release.keyspace import KeySpace
from app.world.stamp import read_stamp
from tests.integration.conftest import CONTEXT, SMALL_WORLD, Stack, metric_samples, serving

KEYS = KeySpace("recsys")
WITHIN_S = 20.0


async def _answer(api: httpx.AsyncClient, user: str, attributes: bool = False) -> list[Any]:
    body: dict[str, Any] = {"user_id": user, "num_items": 10, "context": CONTEXT}
    if attributes:
        body["attributes"] = ["categories"]
    answered = await api.post("/recommend", json=body)
    assert answered.status_code == 200, answered.text
    items: list[Any] = answered.json()["items"]
    return items


async def _counts(url: str, world_id: str, position: int, at_least: tuple[int, int]) -> None:
    """Wait until the newcomer's showings and positives in Redis reach `at_least`."""
    shown_key, chosen_key = exposure_keys(KEYS, world_id)
    client = redis.Redis.from_url(url)
    give_up = time.monotonic() + WITHIN_S
    try:
        while True:
            shown = int(client.hget(shown_key, str(position)) or 0)
            chosen = int(client.hget(chosen_key, str(position)) or 0)
            if shown >= at_least[0] and chosen >= at_least[1]:
                return
            assert time.monotonic() < give_up, (shown, chosen)
            await asyncio.sleep(0.05)
    finally:
        client.close()


async def test_a_newcomer_is_explored_and_its_counts_come_back(
    stack: Stack, loaded_redis: str, tmp_path: Path
) -> None:
    settings = {"RECSYS_REDIS_URL": loaded_redis, "RECSYS_ARTIFACTS_DIR": str(stack.world)}
    consumer: ManagedProcess = start_ingest(settings, tmp_path / "ingest")
    try:
        async with serving(stack.settings(redis_url=loaded_redis, exposure_refresh_ms=50.0)) as api:
            top = (await _answer(api, "u1", attributes=True))[0]
            categories = str(top["attributes"]["categories"]).split("|")
            # No embedding: its vector is the world's guess, so the ranking alone would
            # rarely serve it in a top 10.
            item = {"item_id": "newcomer-1", "title": "Newcomer", "categories": categories}
            put = await api.post("/catalog/items", json={"items": [item]})
            assert put.status_code == 200, put.text
            users = [f"u{n}" for n in range(30)]
            answers = [[i["item_id"] for i in await _answer(api, user)] for user in users]
            holding = [answer for answer in answers if "newcomer-1" in answer]
            # With one newcomer and one slot, it is in (nearly) every answer, last.
            assert len(holding) >= 25
            assert all(answer.index("newcomer-1") == 9 for answer in holding)
            event = {"event_id": "e1", "user_id": "u3", "item_id": "newcomer-1", "type": "click"}
            posted = await api.post("/events", json={"events": [event]})
            assert posted.status_code == 202, posted.text
            stamp = read_stamp(stack.world)
            assert stamp is not None
            await _counts(loaded_redis, stamp.world_id, SMALL_WORLD.items, (len(holding), 1))
            samples = metric_samples((await api.get("/metrics")).text)
        assert samples["recsys_answer_slots_total{page=home,slot=explored}"] == len(holding)
        assert samples["recsys_answer_slots_total{page=home,slot=ranked}"] == 10 * 31 - len(holding)
    finally:
        consumer.stop()
