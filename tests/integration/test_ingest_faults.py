"""No batch stalls a partition, state stays bounded, and the consumer follows the world:
a real recsys-ingest process against a real Redis, fed straight into its streams."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
from recsys_tools.localstack import ManagedProcess, start_ingest
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world

from app.clients.event_log import partition_of
from app.clients.feature_store import decode_seen
from app.core.events import Event, EventType, encode_entry
from app.world.tables import load_items
from tests.integration.conftest import SMALL_WORLD, Stack, load_redis, metric_samples
from tests.integration.test_realtime import (
    APPLIED_WITHIN_S,
    KEYS,
    PARTITIONS,
    _drained,
    _ingest_settings,
)

pytestmark = [pytest.mark.integration]
GROUP = "ingest"


def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def _append(url: str, events: list[Event], per_entry: int = 500) -> None:
    """Straight into the streams, `per_entry` events an entry, as the API writes batches."""
    client = _redis(url)
    try:
        by_stream: dict[str, list[Event]] = {}
        for event in events:
            by_stream.setdefault(KEYS.events(partition_of(event.user_id, PARTITIONS)), []).append(
                event
            )
        pipe = client.pipeline(transaction=False)
        for stream, part in by_stream.items():
            for at in range(0, len(part), per_entry):
                pipe.xadd(stream, encode_entry(part[at : at + per_entry]))  # type: ignore[arg-type]
        pipe.execute()
    finally:
        client.close()


def _click(n: int, user: str, item: str, kind: EventType = EventType.CLICK) -> Event:
    return Event(f"e{n}", user, item, kind, int(time.time() * 1000))


class _Consumer:
    """A recsys-ingest process with its metrics on a port of its own."""

    def __init__(self, stack: Stack, url: str, folder: Path, **extra: str) -> None:
        settings = _ingest_settings(stack, url, **extra)
        self.process: ManagedProcess = start_ingest(settings, folder, metrics=True)
        self.port = self.process.ports["metrics"]

    def metrics(self) -> dict[str, float]:
        return metric_samples(httpx.get(f"http://127.0.0.1:{self.port}/metrics").text)

    def wait_for(self, name: str, at_least: float) -> dict[str, float]:
        return self.wait_until(name, lambda value: value >= at_least)

    def pending_settles(self) -> None:
        self.wait_until("recsys_ingest_pending{}", lambda value: value == 0)

    def wait_until(self, name: str, holds: Any) -> dict[str, float]:
        give_up = time.monotonic() + APPLIED_WITHIN_S
        while True:
            said = self.metrics()
            if holds(said.get(name, 0.0)):
                return said
            assert self.process.running(), self.process.log_tail()
            assert time.monotonic() < give_up, (name, self.process.log_tail())
            time.sleep(0.05)


@pytest.fixture
def consumer_of(
    stack: Stack, own_redis: tuple[ManagedProcess, str], tmp_path: Path
) -> Iterator[Any]:
    started: list[_Consumer] = []

    def start(**extra: str) -> _Consumer:
        one = _Consumer(stack, own_redis[1], tmp_path / f"ingest-{len(started)}", **extra)
        started.append(one)
        return one

    try:
        yield start
    finally:
        for one in started:
            one.process.stop()


def _dead(url: str) -> list[dict[bytes, bytes]]:
    client = _redis(url)
    try:
        return [
            fields
            for partition in range(PARTITIONS)
            for _, fields in cast(Any, client.xrange(KEYS.dead_letters(partition)))
        ]
    finally:
        client.close()


def test_ten_thousand_events_of_one_user_in_one_read_apply_and_the_partition_moves(
    stack: Stack, own_redis: tuple[ManagedProcess, str], consumer_of: Any
) -> None:
    url = own_redis[1]
    items = SMALL_WORLD.items
    # Every item shown once, then 7,000 clicks: 10,000 ids to look up in one script, past
    # what Lua's unpack() takes in one call.
    flood = [_click(n, "u1", f"i{n}", EventType.IMPRESSION) for n in range(items)]
    flood += [_click(items + n, "u1", f"i{n % 50}") for n in range(10_000 - items)]
    _append(url, [*flood, _click(99_999, "u2", "i7")])
    consumer = consumer_of(RECSYS_INGEST_BATCH="100")
    _drained(url)
    said = consumer.metrics()
    assert said["recsys_ingest_events_total{outcome=applied}"] == 10_001
    assert said["recsys_ingest_batch_failures_total{kind=error}"] == 0
    assert consumer.process.running()
    client = _redis(url)
    try:
        assert client.hlen(KEYS.impressions("u1")) == items
        assert 7 in decode_seen(cast(bytes, client.get(KEYS.seen("u2"))))[0].tolist()
    finally:
        client.close()


def _break_blob(url: str, user: str) -> bytes:
    """The user's blob key made a hash: reading it fails the script, as any error inside
    Redis would. Returns the blob that was there."""
    client = _redis(url)
    try:
        blob = cast(bytes, client.get(KEYS.user(user)))
        client.delete(KEYS.user(user))
        client.hset(KEYS.user(user), "not", "a blob")
        return blob
    finally:
        client.close()


def test_a_batch_that_fails_twice_then_succeeds_is_applied_once(
    stack: Stack, own_redis: tuple[ManagedProcess, str], consumer_of: Any
) -> None:
    url = own_redis[1]
    blob = _break_blob(url, "u5")
    client = _redis(url)
    try:
        consumer = consumer_of()
        # u6 shares u5's partition and batch: it must apply while u5 waits.
        partner = next(
            f"u{n}"
            for n in range(6, 400)
            if partition_of(f"u{n}", PARTITIONS) == partition_of("u5", PARTITIONS)
        )
        _append(url, [_click(1, "u5", "i11"), _click(2, partner, "i12")])
        said = consumer.wait_for("recsys_ingest_batch_failures_total{kind=error}", 2)
        assert said["recsys_ingest_events_total{outcome=applied}"] == 1  # the partner's
        assert said["recsys_ingest_pending{}"] >= 1
        client.delete(KEYS.user("u5"))
        client.set(KEYS.user("u5"), blob)
        _drained(url)
        said = consumer.wait_for("recsys_ingest_events_total{outcome=applied}", 2)
        assert said["recsys_ingest_events_total{outcome=applied}"] == 2
        positives = decode_seen(cast(bytes, client.get(KEYS.positives("u5"))))[0].tolist()
        assert positives.count(11) == 1
        assert client.hlen(KEYS.applied("u5")) == 1
        assert _dead(url) == []
        consumer.pending_settles()
    finally:
        client.close()


def test_a_batch_that_always_fails_is_dead_lettered_and_the_partition_drains(
    stack: Stack, own_redis: tuple[ManagedProcess, str], consumer_of: Any
) -> None:
    url = own_redis[1]
    _break_blob(url, "u5")
    consumer = consumer_of(RECSYS_INGEST_MAX_DELIVERIES="3")
    _append(url, [_click(1, "u5", "i11")])
    consumer.wait_for("recsys_ingest_dead_letters_total{reason=failed}", 1)
    _drained(url)
    dead = _dead(url)
    assert len(dead) == 1
    assert dead[0][b"dead.reason"] == b"failed"
    assert b"failed 3 times" in dead[0][b"dead.why"]
    assert json.loads(dead[0][b"event"])["u"] == "u5"
    # After the dead letter, the partition goes on.
    _append(url, [_click(2, "u6", "i12")])
    _drained(url)
    said = consumer.metrics()
    assert said["recsys_ingest_events_total{outcome=applied}"] == 1
    assert said["recsys_ingest_batch_failures_total{kind=error}"] == 3


def test_pending_entries_trimmed_or_too_old_never_hold_the_partition(
    stack: Stack, own_redis: tuple[ManagedProcess, str], consumer_of: Any
) -> None:
    url = own_redis[1]
    client = _redis(url)
    stream = KEYS.events(0)
    client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    user = next(f"u{n}" for n in range(400) if partition_of(f"u{n}", PARTITIONS) == 0)
    # A page of entries read by this consumer before it died, then trimmed away; and one
    # read two days ago, older than the dedupe window (a day).
    old = encode_entry([_click(1, user, "i3")])
    client.xadd(stream, old, id="1000-0")  # type: ignore[arg-type]
    trimmed = [
        client.xadd(stream, encode_entry([_click(10 + n, user, "i4")]))  # type: ignore[arg-type]
        for n in range(30)
    ]
    client.xreadgroup(GROUP, "consumer-0", {stream: ">"}, count=100)
    client.xdel(stream, *trimmed[:-1])  # all but the newest gone, still pending
    client.close()
    consumer = consumer_of(RECSYS_INGEST_BATCH="10")
    _drained(url)
    said = consumer.wait_for("recsys_ingest_dead_letters_total{reason=stale}", 1)
    assert said["recsys_ingest_events_total{outcome=applied}"] == 1  # the newest only
    consumer.pending_settles()


def test_users_made_by_events_expire_and_world_users_stay(
    stack: Stack, own_redis: tuple[ManagedProcess, str], consumer_of: Any
) -> None:
    url = own_redis[1]
    client = _redis(url)
    consumer = consumer_of(RECSYS_ONLINE_USER_TTL_S="3", RECSYS_EVENT_DEDUPE_S="60")
    # A click from one in ten (their vector folded in: a blob and positives), a dislike from
    # the rest (a seen list): every kind of key a stranger can make.
    invented = [
        _click(n, f"stranger-{n}", f"i{n % 500}", EventType.DISLIKE if n % 10 else EventType.CLICK)
        for n in range(100_000)
    ]
    _append(url, [*invented, _click(0, "u3", "i9")])
    _drained(url, within_s=300.0)
    assert consumer.metrics()["recsys_ingest_events_total{outcome=applied}"] == 100_001
    # Every key a stranger made expires: none is kept for good (a TTL of -1).
    ttls: list[int] = []
    for keys in _batched(client.scan_iter(match="recsys:*stranger-*", count=10_000), 10_000):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.ttl(key)
        ttls += pipe.execute()
    assert len(ttls) >= 100_000
    assert -1 not in ttls
    assert max(ttls) <= 60
    assert client.ttl(KEYS.user("u3")) == -1  # the world's user keeps their state
    assert client.ttl(KEYS.seen("u3")) == -1
    time.sleep(4.0)
    for n in range(0, 100_000, 997):
        for key in (KEYS.user, KEYS.seen, KEYS.positives):
            assert not client.exists(key(f"stranger-{n}"))
    assert client.exists(KEYS.user("u3"))
    client.close()


def _batched(keys: Iterator[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for key in keys:
        batch.append(key)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def test_the_consumer_follows_the_world_redis_holds(
    stack: Stack, own_redis: tuple[ManagedProcess, str], consumer_of: Any, tmp_path: Path
) -> None:
    url = own_redis[1]
    # The world served through a symlink, flipped to a new build as an operator does.
    current = tmp_path / "current"
    current.symlink_to(stack.world)
    consumer = consumer_of(RECSYS_ARTIFACTS_DIR=str(current))
    _append(url, [_click(1, "u3", "i5")])
    _drained(url)
    bigger = DemoSize(items=SMALL_WORLD.items + 200, users=300, impressions=20_000)
    new_world = tmp_path / "world-b"
    build_demo_world(new_world, stack.schema, bigger, seed=12)
    flipped = tmp_path / "current.new"
    flipped.symlink_to(new_world)
    flipped.replace(current)
    load_redis(url, new_world, stack.schema)
    # An item only the new world has; its position there.
    newcomer = f"i{SMALL_WORLD.items + 100}"
    position = load_items(new_world).ids.tolist().index(newcomer)
    _append(url, [_click(2, "u3", newcomer)])
    _drained(url)
    said = consumer.wait_for("recsys_ingest_world_changes_total{outcome=followed}", 1)
    assert said["recsys_ingest_dead_letters_total{reason=unknown_item}"] == 0
    client = _redis(url)
    try:
        seen = decode_seen(cast(bytes, client.get(KEYS.seen("u3"))))[0].tolist()
    finally:
        client.close()
    assert position in seen
