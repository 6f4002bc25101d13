"""The archive's pure parts: stream entries into rows, parts by day, each row read once,
compaction, and the loop's rule that nothing is acknowledged before it is written. The real
process against a real Redis is tests/integration/test_archive.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from app.archive.consumer import Archiver, Cadence, Source
from app.archive.rows import Kind, Rows, by_day, day_of
from app.archive.store import COMPACTED, ArchiveStore
from app.clients.answer_log import Shown, encode_answers
from app.core.archive_metrics import ArchiveMetrics
from app.core.events import Event, EventType, encode_entry
from app.pipeline.types import RankedItem

DAY_MS = 86_400_000
MONDAY_MS = 1_764_547_200_000  # 2025-12-01T00:00:00Z
ANY_TIME_MS = 2**63 - 1  # rows of any time fit: these tests are not about the clock


def _events(n: int, start_ms: int = MONDAY_MS, step_ms: int = 1000) -> list[Event]:
    return [
        Event(f"e{i}", f"u{i % 7}", f"i{i % 13}", EventType.CLICK, start_ms + i * step_ms)
        for i in range(n)
    ]


def _rows(events: Sequence[Event], entry: bytes = b"1-0") -> Rows:
    rows = Rows(Kind.EVENTS)
    fields = {k.encode(): v.encode() for k, v in encode_entry(events).items()}
    rows.add_entry("events:0", entry, fields, ANY_TIME_MS)
    return rows


def test_an_events_entry_becomes_one_row_an_event_and_bad_ones_are_counted() -> None:
    events = [*_events(3), Event("r1", "u1", "i1", EventType.RATING, MONDAY_MS, 4.5, "a" * 32)]
    rows = _rows(events)
    rows.add_entry("events:0", b"2-0", {b"events": b"not json"}, ANY_TIME_MS)
    rows.add_entry("events:0", b"3-0", {b"events": b'[{"t": "teleport"}]'}, ANY_TIME_MS)
    table = rows.table()
    assert table.num_rows == 4
    assert rows.malformed == 2
    assert table.column("event_id").to_pylist() == ["e0", "e1", "e2", "r1"]
    assert table.column("value").to_pylist()[-1] == 4.5
    assert table.column("answer_id").to_pylist()[-1] == "a" * 32
    assert set(table.column("entry").to_pylist()) == {"1-0"}


def test_an_answer_entry_keeps_the_items_in_the_order_shown_with_their_scores() -> None:
    items = [RankedItem("i3", 0.91234567), RankedItem("i1", None), RankedItem("i2", 0.5)]
    shown = Shown("a" * 32, MONDAY_MS, "u1", "home", "stable", "3", "w1", False, items)
    fields = {k.encode(): v.encode() for k, v in encode_answers([shown]).items()}
    rows = Rows(Kind.ANSWERS)
    rows.add_entry("answers", b"5-0", fields, ANY_TIME_MS)
    rows.add_entry("answers", b"6-0", {b"answers": b'[{"a": "x"}]'}, ANY_TIME_MS)
    row = rows.table().to_pylist()
    assert rows.malformed == 1
    assert len(row) == 1
    assert row[0]["items"] == ["i3", "i1", "i2"]
    assert row[0]["scores"][1] is None
    assert row[0]["scores"][0] == pytest.approx(0.9123, abs=1e-4)
    assert (row[0]["page"], row[0]["variant"], row[0]["world_id"]) == ("home", "stable", "w1")


def test_rows_fall_on_the_utc_day_of_their_time() -> None:
    table = _rows(_events(3, MONDAY_MS - 1000, step_ms=1000)).table()
    split = by_day(table)
    assert sorted(split) == ["2025-11-30", "2025-12-01"]
    assert split["2025-11-30"].num_rows == 1
    assert day_of(MONDAY_MS) == "2025-12-01"


def test_a_row_written_twice_is_read_once_in_time_order(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    table = _rows(_events(50, step_ms=DAY_MS // 20)).table()
    store.write(Kind.EVENTS, table)
    store.write(Kind.EVENTS, table.slice(10, 20))  # a retried write
    # Another user's event of the same id is another event.
    store.write(
        Kind.EVENTS, _rows([Event("e0", "someone", "i1", EventType.LIKE, MONDAY_MS)]).table()
    )
    read = store.read(Kind.EVENTS)
    assert read.num_rows == 51
    times = read.column("ts_ms").to_pylist()
    assert times == sorted(times)
    assert store.days(Kind.EVENTS) == ["2025-12-01", "2025-12-02", "2025-12-03"]
    assert store.read(Kind.EVENTS, "2025-12-02", "2025-12-02").num_rows == 20


def test_a_write_killed_half_way_leaves_nothing_a_read_sees(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    store.write(Kind.EVENTS, _rows(_events(5)).table())
    folder = tmp_path / "events" / "date=2025-12-01"
    (folder / ".part-9-dead.parquet.tmp").write_bytes(b"PAR1 half a file")
    assert store.read(Kind.EVENTS).num_rows == 5


def test_compaction_merges_a_day_into_one_file_each_row_once(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    table = _rows(_events(30)).table()
    for start in (0, 10, 5, 20):  # overlapping writes: rows 5-14 twice
        store.write(Kind.EVENTS, table.slice(start, 10))
    assert len(store.files(Kind.EVENTS, "2025-12-01")) == 4
    assert store.compact(Kind.EVENTS, "2025-12-01") == (4, 30)
    files = store.files(Kind.EVENTS, "2025-12-01")
    assert [Path(f).name for f in files] == [COMPACTED]
    assert store.read(Kind.EVENTS).column("event_id").to_pylist() == [f"e{i}" for i in range(30)]
    assert store.compact(Kind.EVENTS, "2025-12-01") == (0, 0)  # nothing left to merge
    # A late part for a compacted day joins it at the next compaction.
    store.write(Kind.EVENTS, _rows([Event("late", "u1", "i1", EventType.CLICK, MONDAY_MS)]).table())
    assert store.compact(Kind.EVENTS, "2025-12-01") == (2, 31)


class MemoryStream:
    """The archive's reads and acks, in memory: what the loop's rule is checked against.
    Entries come from `stream` (every stream, when None)."""

    def __init__(
        self, entries: list[tuple[bytes, dict[bytes, bytes]]], stream: str | None = None
    ) -> None:
        self.entries = entries
        self.stream = stream
        self.acked: list[bytes] = []

    async def join(self, stream: str) -> None:
        return None

    async def read(self, stream: str, after: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        if after != ">" or self.stream not in (None, stream):
            return []
        taken, self.entries = self.entries, []
        if not taken:
            await asyncio.sleep(0.01)
        return taken

    async def ack(self, stream: str, entry_ids: Sequence[bytes]) -> None:
        self.acked.extend(entry_ids)


class _RefusingStore(ArchiveStore):
    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.refusing = True

    def write(self, kind: Kind, table: pa.Table) -> int:
        if self.refusing:
            raise OSError(28, "No space left on device")
        return super().write(kind, table)


async def test_nothing_is_acknowledged_until_its_file_is_written(tmp_path: Path) -> None:
    fields = {k.encode(): v.encode() for k, v in encode_entry(_events(20)).items()}
    stream = MemoryStream([(b"1-0", fields), (b"2-0", fields)])
    store = _RefusingStore(str(tmp_path))
    metrics = ArchiveMetrics()
    archiver = Archiver(
        stream,  # type: ignore[arg-type]
        store,
        metrics,
        [Source("events:0", Kind.EVENTS)],
        Cadence(flush_s=3600.0, flush_rows=10_000, compact_every_s=3600.0),
        max_future_s=300.0,
        clock=lambda: MONDAY_MS / 1000,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(archiver.run(stop))
    await asyncio.sleep(0.1)
    await archiver.flush()
    await archiver.flush()
    assert stream.acked == []
    assert metrics.write_count["failed"]._value.get() == 2
    store.refusing = False
    await archiver.flush()
    assert stream.acked == [b"1-0", b"2-0"]
    stop.set()
    await running
    assert store.read(Kind.EVENTS).num_rows == 20  # the second entry repeats the first's ids
