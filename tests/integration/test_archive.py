"""The archive against real processes: a real Redis, the API's real event log and answer
log, and a real recsys-archive process killed, blocked and started again. What it keeps is
read back from its Parquet files."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from recsys_tools.localstack import (
    ManagedProcess,
    start_archive,
    start_ingest,
    start_redis,
    unarchived,
)
from recsys_tools.localstack.ingest_consumer import group_behind
from redis.typing import EncodableT, FieldT

from app.archive.rows import Kind, day_of
from app.archive.store import COMPACTED, ArchiveStore
from app.clients.archive_stream import ARCHIVE_GROUP
from app.clients.event_log import EventLog
from app.core.events import Event, EventType
from app.release.keyspace import KeySpace
from tests.integration.conftest import CONTEXT, Stack, load_redis, metric_samples, serving

KEYS = KeySpace("recsys")
PARTITIONS = 2
# Generous: a write every fraction of a second; a slow, busy machine may take far longer.
ARCHIVED_WITHIN_S = 60.0


def _settings(url: str, root: Path, **extra: str) -> dict[str, str]:
    return {
        "RECSYS_REDIS_URL": url,
        "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
        "RECSYS_ARCHIVE_URI": str(root),
        "RECSYS_ARCHIVE_FLUSH_S": "0.3",
        **extra,
    }


def _left(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return unarchived(client, KEYS, PARTITIONS)
    finally:
        client.close()


def _archived(url: str, archive: ManagedProcess) -> None:
    give_up = time.monotonic() + ARCHIVED_WITHIN_S
    while _left(url) > 0:
        assert time.monotonic() < give_up, archive.log_tail()
        time.sleep(0.1)


def _batch(start: int, n: int) -> list[Event]:
    now = int(time.time() * 1000)
    return [
        Event(f"e{i}", f"u{i % 97}", f"i{i % 31}", EventType.CLICK, now)
        for i in range(start, start + n)
    ]


async def _append(url: str, batches: list[list[Event]]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        log = EventLog(client, KEYS, PARTITIONS, 200_000)
        for batch in batches:
            await log.append(batch, 5.0)
    finally:
        await client.aclose()


def test_every_event_is_archived_once_across_a_kill_and_compacted_into_one_file(
    bare_redis: tuple[ManagedProcess, str], tmp_path: Path
) -> None:
    url = bare_redis[1]
    root = tmp_path / "archive"
    archive = start_archive(_settings(url, root), tmp_path / "archive-1")
    posted = [_batch(n * 200, 200) for n in range(100)]
    try:
        asyncio.run(_append(url, posted[:50]))
        time.sleep(0.5)  # some written, some in hand, some unread
        archive.kill()
        asyncio.run(_append(url, posted[50:]))
        archive = start_archive(_settings(url, root), tmp_path / "archive-2")
        _archived(url, archive)
    finally:
        archive.stop()
    store = ArchiveStore(str(root))
    table = store.read(Kind.EVENTS)
    users, ids = table.column("user_id").to_pylist(), table.column("event_id").to_pylist()
    keys = list(zip(users, ids, strict=True))
    expected = {(e.user_id, e.event_id) for batch in posted for e in batch}
    assert len(keys) == len(expected) == 20_000
    assert set(keys) == expected
    days = store.days(Kind.EVENTS)
    env = {**os.environ, **_settings(url, root)}
    subprocess.run(
        [sys.executable, "-m", "app.archive.cli", "compact", *days],
        env=env,
        check=True,
        timeout=120,
    )
    assert all([Path(f).name for f in store.files(Kind.EVENTS, day)] == [COMPACTED] for day in days)
    assert store.read(Kind.EVENTS).num_rows == 20_000


def test_a_store_that_refuses_writes_loses_nothing_and_catches_up(
    bare_redis: tuple[ManagedProcess, str], tmp_path: Path
) -> None:
    url = bare_redis[1]
    root = tmp_path / "archive"
    root.mkdir()
    blocker = root / "events"
    blocker.write_text("a file where the events' folder goes: every write of events fails")
    archive = start_archive(_settings(url, root), tmp_path / "archive")
    try:
        asyncio.run(_append(url, [_batch(n * 100, 100) for n in range(20)]))
        time.sleep(2.0)  # several writes tried and refused
        client = redis.Redis.from_url(url)
        held = sum(group_behind(client, KEYS.events(p), ARCHIVE_GROUP) for p in range(PARTITIONS))
        client.close()
        assert held > 0  # read, not acknowledged: still Redis's to keep
        assert "not written" in archive.log_tail(200)
        assert archive.running()
        blocker.unlink()
        _archived(url, archive)
    finally:
        archive.stop()
    assert ArchiveStore(str(root)).read(Kind.EVENTS).num_rows == 2000


async def test_answers_are_archived_as_shown_and_clicks_name_them(
    stack: Stack, tmp_path: Path
) -> None:
    redis_process, url = start_redis(tmp_path / "redis")
    root = tmp_path / "archive"
    started = [redis_process]
    try:
        load_redis(url, stack.world, stack.schema)
        started.append(start_ingest(_ingest(stack, url), tmp_path / "ingest"))
        archive = start_archive(_settings(url, root), tmp_path / "archive")
        started.append(archive)
        settings = stack.settings(
            redis_url=url, event_partitions=PARTITIONS, answer_log_flush_ms=50.0
        )
        answers = {}
        async with serving(settings) as api:
            for n in range(6):
                body = {"user_id": f"u{n}", "num_items": 8, "context": {**CONTEXT, "page": "home"}}
                answer = (await api.post("/recommend", json=body)).json()
                answers[answer["answer_id"]] = answer
            first = next(iter(answers.values()))
            click = {
                "event_id": "c1",
                "user_id": first["user_id"],
                "item_id": first["items"][2]["item_id"],
                "type": "click",
                "answer_id": first["answer_id"],
            }
            assert (await api.post("/events", json={"events": [click]})).status_code == 202
            exposed = metric_samples((await api.get("/metrics")).text)
        # The stack's world was built minutes ago: the age its id gives.
        assert 0.0 <= exposed["recsys_world_age_seconds{}"] < 6 * 3600
        await asyncio.to_thread(_archived, url, archive)
    finally:
        for process in reversed(started):
            process.stop()
    store = ArchiveStore(str(root))
    kept = {row["answer_id"]: row for row in store.read(Kind.ANSWERS).to_pylist()}
    assert set(kept) == set(answers)
    for answer_id, answer in answers.items():
        row = kept[answer_id]
        assert row["items"] == [item["item_id"] for item in answer["items"]]
        assert row["scores"] == pytest.approx([item["score"] for item in answer["items"]], abs=1e-3)
        assert (row["user_id"], row["page"]) == (answer["user_id"], "home")
        assert row["variant"] == answer["model"]["variant"]
        assert row["world_id"]  # the stack's world is stamped
    events = store.read(Kind.EVENTS).to_pylist()
    assert [(e["event_id"], e["answer_id"]) for e in events] == [("c1", first["answer_id"])]


def _ingest(stack: Stack, url: str) -> dict[str, str]:
    return {
        "RECSYS_REDIS_URL": url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
        "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
    }


def test_the_archive_rejoins_a_restarted_redis_and_keeps_archiving(
    bare_redis: tuple[ManagedProcess, str], tmp_path: Path
) -> None:
    redis_process, url = bare_redis
    root = tmp_path / "archive"
    archive = start_archive(_settings(url, root), tmp_path / "archive")
    store = ArchiveStore(str(root))
    try:
        asyncio.run(_append(url, [_batch(n * 100, 100) for n in range(10)]))
        _archived(url, archive)
        # Restarted empty (no persistence here): the streams and the archive's group are gone.
        redis_process.restart()
        asyncio.run(_append(url, [_batch(1000 + n * 100, 100) for n in range(10)]))
        give_up = time.monotonic() + ARCHIVED_WITHIN_S
        while store.read(Kind.EVENTS).num_rows < 2000:
            assert time.monotonic() < give_up, archive.log_tail()
            assert archive.running(), archive.log_tail()
            time.sleep(0.2)
    finally:
        archive.stop()
    assert store.read(Kind.EVENTS).num_rows == 2000


def _raw_events(*events: dict[str, object]) -> dict[FieldT, EncodableT]:
    # As a hostile or broken writer would leave them: json.dumps keeps \ud800 an escape.
    return {"events": json.dumps(list(events))}


def _entry_id(added: object) -> str:
    assert isinstance(added, bytes)
    return added.decode()


def test_poison_rows_are_kept_apart_and_the_rows_after_them_archived(
    bare_redis: tuple[ManagedProcess, str], tmp_path: Path
) -> None:
    url = bare_redis[1]
    root = tmp_path / "archive"
    now = int(time.time() * 1000)
    event = {"u": "u1", "i": "i1", "t": "click", "ts": now}
    client = redis.Redis.from_url(url)
    try:
        answer = {"a": "a1", "ts": now, "u": "u1", "p": "home", "v": "stable", "m": "3"}
        answer |= {"w": "w1", "d": False, "i": ["i1"], "s": [1e39]}
        written: list[tuple[str, dict[FieldT, EncodableT]]] = [
            (KEYS.events(0), _raw_events({**event, "e": "p1", "ts": 2**63})),
            (KEYS.events(0), _raw_events({**event, "e": "p2", "u": "u\ud800"})),
            (KEYS.events(1), _raw_events({**event, "e": "p3", "ts": now + 86_400_000})),
            (KEYS.shown, {"answers": json.dumps([answer])}),
        ]
        poison = [(stream, _entry_id(client.xadd(stream, fields))) for stream, fields in written]
    finally:
        client.close()
    asyncio.run(_append(url, [_batch(n * 100, 100) for n in range(10)]))
    archive = start_archive(_settings(url, root), tmp_path / "archive-run", metrics=True)
    try:
        _archived(url, archive)  # every entry acknowledged: nothing retried for ever
        exposed = metric_samples(
            httpx.get(f"http://127.0.0.1:{archive.ports['metrics']}/metrics", timeout=5.0).text
        )
        assert "kept apart" in archive.log_tail(200)
        assert archive.running()
    finally:
        archive.stop()
    store = ArchiveStore(str(root))
    assert store.read(Kind.EVENTS).num_rows == 1000
    assert store.days(Kind.EVENTS) == sorted({day_of(now), day_of(int(time.time() * 1000))})
    apart = {
        (row["stream"], row["entry"]): row
        for kind in Kind
        for row in store.quarantined(kind).to_pylist()
    }
    assert set(apart) == set(poison)
    reasons = [apart[entry]["reason"] for entry in poison]
    assert reasons == ["out_of_range", "not_unicode", "future", "out_of_range"]
    assert json.loads(apart[poison[1]]["raw"])["u"] == "u\ud800"
    for kind, reason, count in (
        ("events", "out_of_range", 1),
        ("events", "not_unicode", 1),
        ("events", "future", 1),
        ("answers", "out_of_range", 1),
        ("answers", "future", 0),
    ):
        assert exposed[f"recsys_archive_quarantined_total{{kind={kind},reason={reason}}}"] == count
    assert exposed["recsys_archive_writes_total{outcome=failed}"] == 0
    assert exposed["recsys_archive_rows_total{kind=events}"] == 1000
    # Readable by the archive's user alone.
    for path in root.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
