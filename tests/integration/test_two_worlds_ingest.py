"""Two worlds in one Redis, each under its own key prefix, sharing one event log: an event
posted to either world's API reaches both, each applied by that world's own consumer (its
own consumer group, its fold-in in its own factor space). Real Redis, Triton, consumers."""

from __future__ import annotations

import time
from pathlib import Path

import redis
from recsys_tools.localstack import ManagedProcess, start_ingest, start_redis, unapplied
from recsys_tools.world.store.redis_loader import load_world_into_redis

from app.clients.feature_store import decode_seen
from app.release.keyspace import KeySpace
from app.release.worlds import WorldRef, WorldsPlan, write_worlds
from app.world.tables import load_items
from tests.integration.conftest import CONTEXT, Stack, serving

PARTITIONS = 2
STABLE = KeySpace("recsys")
CANDIDATE = KeySpace("recsys-b", streams="recsys")
# Generous: applying takes milliseconds; a slow, busy machine may take far longer.
APPLIED_WITHIN_S = 30.0


def _consumer(stack: Stack, url: str, keys: KeySpace, folder: Path) -> ManagedProcess:
    settings = {
        "RECSYS_REDIS_URL": url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
        "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
        "RECSYS_REDIS_KEY_PREFIX": keys.prefix,
        "RECSYS_EVENT_KEY_PREFIX": keys.streams or keys.prefix,
    }
    return start_ingest(settings, folder)


def _drained(
    client: redis.Redis, consumers: list[ManagedProcess], worlds: tuple[KeySpace, ...] = ()
) -> None:
    give_up = time.monotonic() + APPLIED_WITHIN_S
    while any(unapplied(client, keys, PARTITIONS) for keys in worlds or (STABLE, CANDIDATE)):
        assert time.monotonic() < give_up, [c.log_tail() for c in consumers]
        time.sleep(0.05)


def _seen(client: redis.Redis, keys: KeySpace, user: str) -> set[int]:
    raw = client.get(keys.seen(user))
    return set(decode_seen(raw)[0].tolist())  # type: ignore[arg-type]


async def test_an_event_posted_to_either_world_reaches_both(stack: Stack, tmp_path: Path) -> None:
    process, url = start_redis(tmp_path / "redis")
    started = [process]
    client = redis.Redis.from_url(url)
    try:
        for keys in (STABLE, CANDIDATE):
            load_world_into_redis(stack.world, client, stack.schema, keys)
        consumers = [
            _consumer(stack, url, STABLE, tmp_path / "ingest-a"),
            _consumer(stack, url, CANDIDATE, tmp_path / "ingest-b"),
        ]
        started += consumers
        blobs = {keys.prefix: client.get(keys.user("u5")) for keys in (STABLE, CANDIDATE)}
        settings = stack.settings(
            redis_url=url,
            event_partitions=PARTITIONS,
            redis_key_prefix=CANDIDATE.prefix,
            event_key_prefix=CANDIDATE.streams,
        )
        async with serving(settings) as api:  # the candidate world's API
            body = {"user_id": "u5", "num_items": 5, "context": CONTEXT}
            item = (await api.post("/recommend", json=body)).json()["items"][0]["item_id"]
            event = {"event_id": "e1", "user_id": "u5", "item_id": item, "type": "purchase"}
            posted = await api.post("/events", json={"events": [event]})
            assert posted.status_code == 202, posted.text
        _drained(client, consumers)
        position = load_items(stack.world).ids.tolist().index(item)
        # One stream, two groups: each world's consumer applied it in its own keys.
        assert not client.exists("recsys-b:events:{0}")
        groups = {
            g["name"].decode()
            for p in range(PARTITIONS)
            for g in client.xinfo_groups(STABLE.events(p))
        }
        assert groups == {"ingest", "ingest:recsys-b"}
        for keys in (STABLE, CANDIDATE):
            assert position in _seen(client, keys, "u5"), keys.prefix
            assert client.get(keys.user("u5")) != blobs[keys.prefix], keys.prefix
            assert client.hlen(keys.applied("u5")) == 1
    finally:
        client.close()
        for each in reversed(started):
            each.stop()


def _wait_for(consumer: ManagedProcess, line: str) -> None:
    give_up = time.monotonic() + APPLIED_WITHIN_S
    while line not in consumer.log_tail(200):
        assert time.monotonic() < give_up, consumer.log_tail()
        time.sleep(0.1)


async def test_one_consumer_follows_the_worlds_file(stack: Stack, tmp_path: Path) -> None:
    """With RECSYS_WORLDS_FILE one ingest process applies each event to every world the file
    names, and stops applying to a candidate the file no longer names."""
    process, url = start_redis(tmp_path / "redis")
    started = [process]
    client = redis.Redis.from_url(url)
    worlds_file = tmp_path / "worlds.toml"
    candidate = WorldRef(stack.world, CANDIDATE.prefix)
    write_worlds(worlds_file, WorldsPlan(candidate=candidate, percent=10.0))
    try:
        for keys in (STABLE, CANDIDATE):
            load_world_into_redis(stack.world, client, stack.schema, keys)
        settings = {
            "RECSYS_REDIS_URL": url,
            "RECSYS_ARTIFACTS_DIR": str(stack.world),
            "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
            "RECSYS_WORLDS_FILE": str(worlds_file),
        }
        consumer = start_ingest(settings, tmp_path / "ingest")
        started.append(consumer)
        _wait_for(consumer, "into recsys-b:*")
        api_settings = stack.settings(redis_url=url, event_partitions=PARTITIONS)
        async with serving(api_settings) as api:  # the stable world's API
            body = {"user_id": "u7", "num_items": 5, "context": CONTEXT}
            item = (await api.post("/recommend", json=body)).json()["items"][0]["item_id"]
            first = {"event_id": "e1", "user_id": "u7", "item_id": item, "type": "click"}
            assert (await api.post("/events", json={"events": [first]})).status_code == 202
            _drained(client, [consumer])
            for keys in (STABLE, CANDIDATE):
                assert client.hlen(keys.applied("u7")) == 1, keys.prefix

            write_worlds(worlds_file, WorldsPlan())  # the candidate rolled back
            _wait_for(consumer, "stopped ingesting into recsys-b:*")
            second = {"event_id": "e2", "user_id": "u7", "item_id": item, "type": "like"}
            assert (await api.post("/events", json={"events": [second]})).status_code == 202
        _drained(client, [consumer], (STABLE,))
        assert client.hlen(STABLE.applied("u7")) == 2
        assert client.hlen(CANDIDATE.applied("u7")) == 1
    finally:
        client.close()
        for each in reversed(started):
            each.stop()
