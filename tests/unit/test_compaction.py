"""The catalog's change log folded to each item's latest state (app.release.compaction), and
read by processes that stood anywhere in the log before (app.clients.catalog_reader): every
room ends as the one that applied each batch in turn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.clients import catalog_compactor, catalog_log
from app.clients.catalog_log import Logged, LogPage
from app.clients.catalog_reader import LogReader
from app.core.errors import UnappliableBatchError
from app.release import compaction
from app.release.arrivals import (
    CatalogRoom,
    ChangeBatch,
    ItemChange,
    Withdrawal,
    encode_changes,
    make_room,
)
from app.release.compaction import PART_CHANGES, fold

DIM = 2
WORLD = 4
IDS = [f"i{n}" for n in range(WORLD)] + [f"n{n}" for n in range(4)]


def _room() -> CatalogRoom:
    vectors = np.eye(WORLD, DIM, dtype=np.float32)
    return make_room(
        np.arange(WORLD, dtype=np.int64), np.zeros(WORLD, np.int64), vectors, 8, DIM + 1
    )


# One change: (kind, item index, a value that tells puts apart).
Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "refit", "withdraw", "poison"]),
        st.integers(0, 7),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=30,
)


def _batches(script: list[Op]) -> list[ChangeBatch]:
    """The batches a log would hold for `script`: positions as the log gives them."""
    batches: list[ChangeBatch] = []
    for seq, (kind, item, value) in enumerate(script, start=1):
        item_id, position = IDS[item], item  # added items sit right after the world's
        if kind == "withdraw":
            batches.append(ChangeBatch(seq, (), (Withdrawal(item_id, position),)))
            continue
        vector = (0.1 * value, 0.2)
        put = ItemChange(
            item_id, position, f"t{value}", ("a",), value % 3, 100 + value, (0.5,), vector
        )
        if kind == "refit":
            put = ItemChange(item_id, position, "", (), 0, 0, (), vector, vector_only=True)
        if kind == "poison":
            put = ItemChange(item_id, position, "p", ("a",), 0, 2**63, (0.5,), vector)
        batches.append(ChangeBatch(seq, (put,)))
    return batches


def _applied_each(batches: list[ChangeBatch]) -> CatalogRoom:
    room = _room()
    for batch in batches:
        try:
            room.apply(batch)
        except UnappliableBatchError:
            room.skip(batch.seq)
    return room


def _state(room: CatalogRoom) -> tuple[Any, ...]:
    return (
        room.digest(),
        room.seq,
        room.withdrawn.tolist(),
        room.present.tolist(),
        {p: room.attributes[p] for p in sorted(room.attributes)},
        room.blobs.tolist(),
        room.published_at.tolist(),
    )


@given(ops)
@settings(max_examples=200, deadline=None)
def test_the_fold_applied_leaves_the_room_as_every_batch_applied(script: list[Op]) -> None:
    batches = _batches(script)
    folded = fold(batches, _room().check)
    assert _state(_applied_each(folded.batches())) == _state(_applied_each(batches))


def _logged(batches: list[ChangeBatch], parts: bool) -> list[Logged]:
    entries = []
    for n, batch in enumerate(batches):
        changed: list[ItemChange | Withdrawal] = [*batch.puts, *batch.withdrawals]
        fields = {
            b"seq": str(batch.seq).encode(),
            b"body": encode_changes(batch.puts, batch.withdrawals).encode(),
            b"positions": ",".join(str(c.position) for c in changed).encode(),
        }
        if parts:
            fields[b"part"] = f"{n}/{len(batches)}".encode()
        entries.append(Logged(f"{n + 1}-0", fields))
    return entries


class _Log:
    """What a reader sees of the log in Redis: entries by id, the log replaced meanwhile,
    and its counter (the last batch's number)."""

    def __init__(self, entries: list[Logged]) -> None:
        self.entries = entries
        self.head = max((entry.seq for entry in entries), default=0)

    async def read(self, after: str, count: int, timeout_s: float) -> LogPage:
        def key(entry_id: str) -> tuple[int, int]:
            ms, _, n = entry_id.partition("-")
            return int(ms), int(n)

        later = [e for e in self.entries if after == "-" or key(e.entry_id) > key(after)]
        return LogPage(later[:count], self.head)

    def replace(self, batches: list[ChangeBatch], after: int) -> None:
        """The log as the compactor leaves it: the fold, then `batches`, ids after `after`."""
        parts = fold(_applied_batches(self), _room().check).batches()
        logged = _logged(parts, parts=True) + _logged(batches, parts=False)
        self.entries = [Logged(f"{after}-{n}", e.fields) for n, e in enumerate(logged)]
        self.head = max([self.head, *(batch.seq for batch in batches)])


def _applied_batches(log: _Log) -> list[ChangeBatch]:
    return [entry.batch() for entry in log.entries]


@given(ops, st.integers(0, 30), st.integers(0, 12), st.booleans(), st.booleans())
@example([("put", 4, 1), ("put", 5, 2), ("put", 6, 3)], 3, 1, False, True)  # mid-fold, refolded
@settings(max_examples=300, deadline=None)
def test_a_process_anywhere_in_the_log_reads_the_folds_into_the_same_room(
    script: list[Op], stood: int, stood_in_fold: int, appended: bool, refolded: bool
) -> None:
    # Parts of one change and pages of one entry: a fold is many parts, read a page at a
    # time, and a process may stand in the middle of one when the log is folded again.
    with (
        _patched(compaction, "PART_CHANGES", 1),
        _patched(catalog_log, "PAGE_BYTES", 1),
    ):
        batches = _batches(script)
        log = _Log(_logged(batches, parts=False))
        reader = LogReader(log, _room())  # type: ignore[arg-type]
        fresh = LogReader(log, _room())  # type: ignore[arg-type]
        shown = log.entries
        log.entries = shown[: min(stood, len(shown))]
        asyncio.run(reader.catch_up(1.0))  # it stands at batch `stood`
        log.entries = shown
        more = [
            ChangeBatch(len(batches) + n + 1, b.puts, b.withdrawals)
            for n, b in enumerate(_batches([("put", 6, 1), ("withdraw", 2, 0)]))
        ][: 2 if appended else 0]
        log.replace(more, after=len(batches) + 1)  # folded, batches appended meanwhile
        whole = log.entries
        log.entries = whole[: min(stood_in_fold, len(whole))]
        asyncio.run(fresh.catch_up(1.0))  # it stands somewhere in the fold, or past it
        log.entries = whole
        if refolded:
            log.replace([], after=len(batches) + 2)  # folded again, nothing appended
        for each in (reader, fresh):
            asyncio.run(each.catch_up(1.0))
        latest = LogReader(log, _room())  # type: ignore[arg-type]
        asyncio.run(latest.catch_up(1.0))
        expected = _state(_applied_each(batches + more))
        assert _state(reader.room) == expected
        assert _state(fresh.room) == expected
        assert _state(latest.room) == expected


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def test_an_entry_numbered_past_the_logs_counter_takes_no_process_past_it() -> None:
    # Written by hand: a batch number far ahead of every batch the log accepted.
    good = _batches([("put", 4, 1)])
    log = _Log(_logged(good, parts=False))
    hostile = _logged([ChangeBatch(2**62, good[0].puts)], parts=False)[0]
    log.entries.append(Logged("2-0", hostile.fields))
    reader = LogReader(log, _room())  # type: ignore[arg-type]
    asyncio.run(reader.catch_up(1.0))
    assert reader.room.seq == 1
    after = _logged(_batches([("put", 4, 1), ("put", 5, 2)])[1:], parts=False)[0]
    log.entries.append(Logged("3-0", after.fields))
    log.head = 2
    asyncio.run(reader.catch_up(1.0))
    assert reader.room.seq == 2
    assert reader.room.present[5]  # the batch after it applied


def test_a_fold_of_many_items_comes_in_parts_puts_first() -> None:
    puts = tuple(ItemChange(f"x{n}", n, "t", ("a",), 0, 1, (0.5,), (0.1, 0.2)) for n in range(1500))
    gone = tuple(Withdrawal(f"x{n}", n) for n in range(1200))
    parts = fold([ChangeBatch(1, puts), ChangeBatch(2, (), gone)], lambda batch: None).batches()
    assert [(len(p.puts), len(p.withdrawals)) for p in parts] == [
        (PART_CHANGES, 0),
        (500, 0),
        (0, PART_CHANGES),
        (0, 200),
    ]
    assert {p.seq for p in parts} == {2}


class _Lengths:
    """A log whose length goes through `lengths` ((entries, of them the fold's parts))."""

    def __init__(self, lengths: list[tuple[int, int]]) -> None:
        self.lengths = lengths

    async def length(self, timeout_s: float) -> tuple[int, int]:
        if len(self.lengths) > 1:
            return self.lengths.pop(0)
        return self.lengths[0]


async def test_the_log_is_compacted_once_the_batches_past_its_fold_outnumber_the_bound(
    monkeypatch: Any,
) -> None:
    compacted: list[int] = []
    measured: list[int] = []
    four = asyncio.Event()

    async def compact(changes: Any, check: Any, timeout_s: float) -> bool:
        compacted.append(len(measured))
        return True

    def measure(entries: int) -> None:
        measured.append(entries)
        if len(measured) >= 4:
            four.set()

    monkeypatch.setattr(catalog_compactor, "compact", compact)
    # 12 parts alone; 12 parts and 5 batches; 3 parts and 11 batches, twice.
    log: Any = _Lengths([(12, 12), (17, 12), (14, 3), (14, 3)])
    task = asyncio.create_task(
        catalog_compactor.keep_small(log, lambda batch: None, measure, 0.0, 10, 1.0)
    )
    await asyncio.wait_for(four.wait(), 10.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert measured[:3] == [12, 17, 14]
    assert compacted[0] == 3  # the third: 11 batches past a fold of 3 parts
