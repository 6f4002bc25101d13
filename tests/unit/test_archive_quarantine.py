"""Rows the archive cannot store as they are, or stamped ahead of its clock: kept apart (raw,
with their stream ids), counted, acknowledged, and never in the way of the rows after them;
and the archive's files readable by its own user only. The same against a real Redis and a
real recsys-archive process: tests/integration/test_archive.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.archive.consumer import Archiver, Cadence, Source
from app.archive.quarantine import table_of
from app.archive.rows import Kind, Rows
from app.archive.store import ArchiveStore
from app.core.archive_metrics import ArchiveMetrics, Unfit
from app.core.settings import Settings
from app.core.storable import FLOAT32_MAX
from tests.unit.test_archive import MemoryStream

NOW_MS = 1_764_547_200_000 + 12 * 3_600_000  # 2025-12-01T12:00:00Z
LATEST_MS = NOW_MS + 300_000
DAY_MS = 86_400_000


def _event(event_id: str, ts: object = NOW_MS, **more: object) -> dict[str, object]:
    return {"e": event_id, "u": "u1", "i": "i1", "t": "click", "ts": ts, **more}


def _events_entry(*events: dict[str, object]) -> dict[bytes, bytes]:
    # json.dumps writes a lone surrogate as the escape \ud800, as the API's log does.
    return {b"events": json.dumps(list(events)).encode()}


def _answer(answer_id: str, ts: object = NOW_MS, **more: object) -> dict[str, object]:
    answer = {"a": answer_id, "ts": ts, "u": "u1", "p": "home", "v": "stable", "m": "3"}
    return {**answer, "w": "w1", "d": False, "i": ["i1", "i2"], "s": [0.5, None], **more}


def test_each_row_that_does_not_fit_is_kept_apart_and_the_rest_of_its_entry_is_kept() -> None:
    rows = Rows(Kind.EVENTS)
    entry = _events_entry(
        _event("good-1"),
        _event("past-int64", ts=2**63),
        _event("surrogate", u="u\ud800"),
        _event("huge-value", t="rating", v=10**400),  # no float holds it
        _event("ahead", ts=LATEST_MS + 1),
        _event("at-the-limit", ts=LATEST_MS),
        _event("good-2"),
    )
    rows.add_entry("recsys:events:{0}", b"7-1", entry, LATEST_MS)
    table = rows.table()  # what failed every write before: it builds
    assert table.column("event_id").to_pylist() == ["good-1", "at-the-limit", "good-2"]
    assert rows.malformed == 0
    kept = [(q.stream, q.entry, q.reason) for q in rows.quarantined]
    assert kept == [
        ("recsys:events:{0}", "7-1", Unfit.OUT_OF_RANGE),
        ("recsys:events:{0}", "7-1", Unfit.NOT_UNICODE),
        ("recsys:events:{0}", "7-1", Unfit.OUT_OF_RANGE),
        ("recsys:events:{0}", "7-1", Unfit.FUTURE),
    ]
    # Raw: the row as the stream carried it, the surrogate still its escape.
    raws = [json.loads(q.raw) for q in rows.quarantined]
    assert raws[0]["ts"] == 2**63
    assert b'"u\\ud800"' in rows.quarantined[1].raw
    assert raws[1]["u"] == "u\ud800"
    assert raws[2]["v"] == 10**400
    assert raws[3]["e"] == "ahead"


def test_answers_are_checked_against_their_columns_scores_as_float32() -> None:
    rows = Rows(Kind.ANSWERS)
    answers = [
        _answer("good", s=[float("nan"), -FLOAT32_MAX]),  # both fit a float32 as they are
        _answer("big-score", s=[1e39, 0.1]),  # would be stored as infinity
        _answer("endless-ts", ts=float("inf")),
        _answer("surrogate-item", i=["i1", "\udfff"]),
        _answer("ahead", ts=NOW_MS + DAY_MS),
        _answer("not-an-answer", i="i1"),
    ]
    fields = {b"answers": json.dumps(answers).encode()}
    rows.add_entry("recsys:shown", b"9-0", fields, LATEST_MS)
    assert rows.table().column("answer_id").to_pylist() == ["good"]
    assert [q.reason for q in rows.quarantined] == [
        Unfit.OUT_OF_RANGE,
        Unfit.OUT_OF_RANGE,
        Unfit.NOT_UNICODE,
        Unfit.FUTURE,
    ]
    assert rows.malformed == 1


def test_an_entry_nested_past_the_parsers_depth_is_malformed_not_a_crash() -> None:
    rows = Rows(Kind.EVENTS)
    rows.add_entry("events:0", b"1-0", {b"events": b"[" * 100_000}, LATEST_MS)
    rows.add_entry("events:0", b"2-0", _events_entry(_event("after")), LATEST_MS)
    assert rows.malformed == 1
    assert rows.table().column("event_id").to_pylist() == ["after"]


async def test_a_poison_entry_is_kept_apart_and_the_entries_after_it_are_archived(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = "recsys:events:{0}"
    stream = MemoryStream(
        [
            (b"1-0", _events_entry(_event("poison-ts", ts=2**63))),
            (b"2-0", _events_entry(_event("poison-text", i="\ud800"))),
            (b"3-0", _events_entry(_event("tomorrow", ts=NOW_MS + DAY_MS))),
            (b"4-0", _events_entry(_event("good-1"), _event("good-2"))),
        ],
        name,
    )
    store = ArchiveStore(str(tmp_path))
    metrics = ArchiveMetrics()
    archiver = Archiver(
        stream,  # type: ignore[arg-type]
        store,
        metrics,
        [Source(name, Kind.EVENTS)],
        Cadence(flush_s=3600.0, flush_rows=10_000, compact_every_s=3600.0),
        max_future_s=300.0,
        clock=lambda: NOW_MS / 1000,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(archiver.run(stop))
    await asyncio.sleep(0.1)
    with caplog.at_level(logging.WARNING, "recsys.archive"):
        await archiver.flush()
    assert metrics.write_count["written"]._value.get() == 1
    assert metrics.write_count["failed"]._value.get() == 0
    assert stream.acked == [b"1-0", b"2-0", b"3-0", b"4-0"]
    assert store.read(Kind.EVENTS).column("event_id").to_pylist() == ["good-1", "good-2"]
    # No folder for tomorrow: the day folders follow the archive's clock.
    assert store.days(Kind.EVENTS) == ["2025-12-01"]
    apart = store.quarantined(Kind.EVENTS).to_pylist()
    assert [(q["stream"], q["entry"], q["reason"]) for q in apart] == [
        ("recsys:events:{0}", "1-0", "out_of_range"),
        ("recsys:events:{0}", "2-0", "not_unicode"),
        ("recsys:events:{0}", "3-0", "future"),
    ]
    assert {q["kept_ms"] for q in apart} == {NOW_MS}
    assert json.loads(apart[2]["raw"])["e"] == "tomorrow"
    counted = metrics.quarantine_count
    assert counted["events", "out_of_range"]._value.get() == 1
    assert counted["events", "not_unicode"]._value.get() == 1
    assert counted["events", "future"]._value.get() == 1
    assert counted["answers", "future"]._value.get() == 0
    assert metrics.row_count["events"]._value.get() == 2
    said = caplog.text
    assert "recsys:events:{0} 1-0" in said
    assert "recsys:events:{0} 3-0" in said
    stop.set()
    await running


@pytest.fixture
def open_umask() -> Iterator[None]:
    """No bits taken away by the umask: the modes are the archive's own."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {
        str(path.relative_to(root)): stat.S_IMODE(path.stat().st_mode) for path in root.rglob("*")
    }


@pytest.mark.usefixtures("open_umask")
def test_the_archives_folders_and_files_are_its_users_alone(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    store = ArchiveStore(str(root))
    rows = Rows(Kind.EVENTS)
    entry = _events_entry(_event("a"), _event("b", ts=NOW_MS + DAY_MS), _event("c", ts=2**64))
    rows.add_entry("events:0", b"1-0", entry, NOW_MS + 2 * DAY_MS)
    store.write(Kind.EVENTS, rows.table())
    store.write(Kind.EVENTS, rows.table())
    store.compact(Kind.EVENTS, "2025-12-01")
    store.write_quarantined(Kind.EVENTS, table_of(rows.quarantined, NOW_MS), "2025-12-01")
    modes = _modes(root)
    assert "events/date=2025-12-01/day.parquet" in modes
    assert "quarantine/events/date=2025-12-01" in modes
    folders = {name: mode for name, mode in modes.items() if (root / name).is_dir()}
    files = {name: mode for name, mode in modes.items() if (root / name).is_file()}
    # events, its two days; quarantine, its kind, its day. A compacted day, two parts, one apart.
    assert len(folders) == 6
    assert len(files) == 4
    assert set(folders.values()) == {0o700}, folders
    assert set(files.values()) == {0o600}, files
    assert stat.S_IMODE(root.stat().st_mode) == 0o700  # made by the archive: its own too


def test_a_folder_made_before_is_left_as_it_was(tmp_path: Path) -> None:
    # The host's volume (install -d ... /srv/recsys/archive) is the operator's to set.
    tmp_path.chmod(0o750)
    store = ArchiveStore(str(tmp_path))
    rows = Rows(Kind.EVENTS)
    rows.add_entry("events:0", b"1-0", _events_entry(_event("a")), LATEST_MS)
    store.write(Kind.EVENTS, rows.table())
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "events").stat().st_mode) == 0o700


def test_the_archive_allows_what_the_api_accepts_ahead_and_a_minute_of_skew() -> None:
    settings = Settings(event_max_future_ms=3_600_000.0)
    assert settings.archive_max_future_s == 3_660.0
