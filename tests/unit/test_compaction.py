"""The catalog's change log folded to each item's latest state (app.release.compaction), and
read by processes that stood anywhere in the log before (app.clients.catalog_reader): every
room ends as the one that applied each batch in turn."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.clients.catalog_log import Logged
from app.clients.catalog_reader import LogReader
from app.core.errors import UnappliableBatchError
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
        np.arange(WORLD, dtype=np.int64), np.zeros(WORLD, np.int64), vectors, None, 8, DIM + 1
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
    """What a reader sees of the log in Redis: entries by id, the log replaced meanwhile."""

    def __init__(self, entries: list[Logged]) -> None:
        self.entries = entries

    async def read(self, after: str, count: int, timeout_s: float) -> list[Logged]:
        def key(entry_id: str) -> tuple[int, int]:
            ms, _, n = entry_id.partition("-")
            return int(ms), int(n)

        later = [e for e in self.entries if after == "-" or key(e.entry_id) > key(after)]
        return later[:count]


@given(ops, st.integers(0, 30))
@settings(max_examples=150, deadline=None)
def test_a_process_anywhere_in_the_log_reads_the_fold_into_the_same_room(
    script: list[Op], stood: int
) -> None:
    batches = _batches(script)
    stood = min(stood, len(batches))
    log = _Log(_logged(batches, parts=False))
    reader = LogReader(log, _room())  # type: ignore[arg-type]
    log.entries = log.entries[:stood]
    asyncio.run(reader.catch_up(1.0))  # it stands at batch `stood`
    # The log folded, its parts numbered after the last batch; two more batches after them.
    more = _batches([("put", 6, 1), ("withdraw", 2, 0)])
    more = [ChangeBatch(len(batches) + n + 1, b.puts, b.withdrawals) for n, b in enumerate(more)]
    parts = fold(batches, _room().check).batches()
    tail = len(batches) + 1
    log.entries = [
        Logged(f"{tail}-{n}", entry.fields) for n, entry in enumerate(_logged(parts, parts=True))
    ] + [Logged(f"{tail + 1}-{n}", e.fields) for n, e in enumerate(_logged(more, parts=False))]
    asyncio.run(reader.catch_up(1.0))
    fresh = LogReader(log, _room())  # type: ignore[arg-type]
    asyncio.run(fresh.catch_up(1.0))
    expected = _state(_applied_each(batches + more))
    assert _state(reader.room) == expected
    assert _state(fresh.room) == expected


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
