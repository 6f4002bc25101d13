"""The catalog's room: changes written in place, refused whole, read back by position."""

from __future__ import annotations

import dataclasses
import gc

import faiss
import numpy as np
import pytest

from app.core.errors import UnappliableBatchError
from app.release.added_cells import added_cells
from app.release.arrivals import (
    LATEST_TIME_S,
    CatalogRoom,
    ChangeBatch,
    ItemChange,
    Withdrawal,
    decode_changes,
    encode_changes,
    make_room,
)

DIM = 2


def _room(capacity: int = 3) -> CatalogRoom:
    vectors = np.eye(4, DIM, dtype=np.float32)
    return make_room(
        np.arange(4, dtype=np.int64), np.zeros(4, np.int64), vectors, capacity, DIM + 1
    )


def _put(item_id: str, position: int) -> ItemChange:
    return ItemChange(item_id, position, "t", ("a",), 1, 9, (0.5,), (1.0, 2.0))


def test_a_batch_survives_the_log_and_lands_at_its_positions() -> None:
    puts, gone = [_put("n1", 4), _put("i2", 2)], [Withdrawal("i0", 0)]
    batch = decode_changes(7, encode_changes(puts, gone), [4, 2, 0])
    assert batch == ChangeBatch(7, tuple(puts), tuple(gone))
    room = _room()
    room.apply(batch)
    assert room.size == 5
    assert room.seq == 7
    assert room.ids == ["n1"]
    np.testing.assert_array_equal(room.blobs[0], [1.0, 2.0, 0.5])
    np.testing.assert_array_equal(room.vectors[2], [1.0, 2.0])  # a world item put again
    assert room.withdrawn[0]
    assert room.present[4]
    assert not room.withdrawn[4]
    found = room.known(np.array([-1, 3, -1]), ["n1", "i3", "nobody"], below=5)
    np.testing.assert_array_equal(found, [4, 3, -1])
    # A catalog taken before the item was applied does not know it.
    np.testing.assert_array_equal(room.known(np.array([-1]), ["n1"], below=4), [-1])


def test_a_batch_past_the_room_changes_nothing() -> None:
    room = _room(capacity=1)
    with pytest.raises(UnappliableBatchError, match="past this process's room"):
        room.apply(ChangeBatch(1, (_put("n1", 4), _put("n2", 5))))
    assert room.size == 4
    assert room.seq == 0
    assert not room.present[4]


def test_a_refit_changes_the_vector_only_and_never_brings_back_a_withdrawn_item() -> None:
    room = _room()
    room.apply(ChangeBatch(1, (_put("n1", 4),), ()))
    room.apply(ChangeBatch(2, (), (Withdrawal("n1", 4),)))
    refit = ItemChange("n1", 4, "", (), 0, 0, (), (1.5, 2.5), vector_only=True)
    batch = decode_changes(3, encode_changes([refit], []), [4])
    assert batch.puts[0].vector_only
    room.apply(batch)
    assert room.withdrawn[4]
    np.testing.assert_array_equal(room.vectors[4], [1.5, 2.5])
    np.testing.assert_array_equal(room.blobs[0], [1.5, 2.5, 0.5])  # its dense kept
    assert room.attributes[4]["title"] == "t"
    assert not room.all_live


def test_added_items_are_filed_under_the_world_index_cells_and_searched_there() -> None:
    rng = np.random.default_rng(0)
    world = np.concatenate(
        [rng.normal(size=(50, 2)) + centre for centre in ((10, 0), (-10, 0), (0, 10), (0, -10))]
    ).astype(np.float32)
    quantizer = faiss.IndexFlatIP(2)
    index = faiss.IndexIVFFlat(quantizer, 2, 4, faiss.METRIC_INNER_PRODUCT)
    index.train(world)
    index.add(world)
    index.nprobe = 1
    cells = added_cells(index, rows=210)
    assert cells is not None
    added = np.array([[9.0, 1.0], [-9.0, 1.0], [11.0, -1.0]], dtype=np.float32)
    cells.file(np.array([200, 201, 202]), added)
    assert cells.cell[200] == cells.cell[202] != cells.cell[201]
    # A query towards +x probes the +x cell only: the two added items filed there.
    assert sorted(cells.probed(np.array([1.0, 0.0], np.float32), 200, 203).tolist()) == [200, 202]
    assert added_cells(faiss.IndexFlatIP(2), rows=10) is None  # no cells: scanned whole


def _ivf(world: np.ndarray) -> faiss.Index:
    quantizer = faiss.IndexFlatIP(2)
    index = faiss.IndexIVFFlat(quantizer, 2, 4, faiss.METRIC_INNER_PRODUCT)
    index.train(world)
    index.add(world)
    index.nprobe = 1
    return index


def test_the_filing_outlives_the_index_it_was_made_from() -> None:
    # A reload reads the index again and frees the old one while the room, and its filing,
    # live on: the filing's quantizer is its own.
    rng = np.random.default_rng(1)
    world = np.concatenate(
        [rng.normal(size=(50, 2)) + centre for centre in ((10, 0), (-10, 0), (0, 10), (0, -10))]
    ).astype(np.float32)
    index = _ivf(world)
    cells = added_cells(index, rows=210)
    assert cells is not None
    del index
    gc.collect()
    _churn = [np.random.default_rng(n).normal(size=100_000) for n in range(20)]  # reuse freed
    added = np.array([[9.0, 1.0], [-9.0, 1.0], [11.0, -1.0]], dtype=np.float32)
    cells.file(np.array([200, 201, 202]), added)
    assert sorted(cells.probed(np.array([1.0, 0.0], np.float32), 200, 203).tolist()) == [200, 202]
    del _churn


def test_a_room_refiled_under_a_new_index_finds_its_added_items_there() -> None:
    rng = np.random.default_rng(2)
    world = np.concatenate(
        [rng.normal(size=(50, 2)) + centre for centre in ((10, 0), (-10, 0), (0, 10), (0, -10))]
    ).astype(np.float32)
    room = make_room(np.zeros(200, np.int64), np.zeros(200, np.int64), world, 10, 3)
    room.cells = added_cells(_ivf(world), room.rows)
    room.apply(ChangeBatch(1, (ItemChange("n1", 200, "t", ("a",), 1, 9, (0.5,), (9.0, 1.0)),)))
    room.refile(added_cells(_ivf(world[::-1].copy()), room.rows))
    assert room.cells is not None
    assert room.cells.probed(np.array([1.0, 0.0], np.float32), 200, 201).tolist() == [200]


BAD_PUTS = [
    ("item_id", {"item_id": "n\ud800"}),
    ("item_id", {"item_id": "n\x00"}),
    ("title", {"title": "t\ud800"}),
    ("categories", {"categories": ("a", "b\ud800")}),
    ("published_at", {"published_at": LATEST_TIME_S + 1}),
    ("published_at", {"published_at": -1}),
    ("category", {"category": -1}),
    ("embedding", {"embedding": (1.0,)}),
    ("embedding", {"embedding": (1e39, 0.0)}),
    ("embedding", {"embedding": (float("nan"), 0.0)}),
    ("embedding", {"embedding": (50.0, 0.0)}),  # 4 times the world's longest is 4.0
    ("dense", {"dense": (1e39,)}),
    ("dense", {"dense": (0.5, 0.5)}),
]


@pytest.mark.parametrize(("field", "change"), BAD_PUTS)
def test_a_batch_with_a_value_the_room_cannot_hold_changes_nothing(
    field: str, change: dict[str, object]
) -> None:
    room = _room()
    before = room.digest()
    bad = dataclasses.replace(_put("n2", 5), **change)  # type: ignore[arg-type]
    assert room.change_problem(bad) is not None
    assert room.change_problem(bad)[0] == field  # type: ignore[index]
    with pytest.raises(UnappliableBatchError, match=f"batch 3 puts .*: {field}"):
        room.apply(ChangeBatch(3, (_put("n1", 4), bad)))  # the good one first: not written
    assert room.digest() == before
    assert room.seq == 0
    assert not room.present[4]


def test_a_withdrawal_of_an_id_no_key_can_hold_is_unappliable() -> None:
    room = _room()
    with pytest.raises(UnappliableBatchError, match="withdraws an id that must be valid"):
        room.apply(ChangeBatch(2, (), (Withdrawal("i\ud800", 1),)))
    assert not room.withdrawn.any()


def test_the_withdrawn_count_is_of_items_withdrawn_now() -> None:
    room = _room()
    for seq, batch in enumerate(
        [
            ChangeBatch(0, (), (Withdrawal("i1", 1), Withdrawal("i2", 2))),
            ChangeBatch(0, (), (Withdrawal("i1", 1),)),  # again: still one item
            ChangeBatch(0, (_put("i2", 2),)),  # put again: back
        ],
        start=1,
    ):
        room.apply(dataclasses.replace(batch, seq=seq))
    assert room.withdrawals == int(room.withdrawn.sum()) == 1


def test_a_batch_that_does_not_decode_is_unappliable() -> None:
    good = encode_changes([_put("n1", 4)], [])
    for body, positions in [("{", [4]), ('{"puts": [[1]]}', [4]), (good, []), (good, [4, 5])]:
        with pytest.raises(UnappliableBatchError, match="batch 2 does not decode"):
            decode_changes(2, body, positions)


def test_the_digest_tells_catalogs_apart_by_what_was_put() -> None:
    one, other = _room(), _room()
    one.apply(ChangeBatch(1, (_put("n1", 4),)))
    other.apply(ChangeBatch(1, (_put("n1", 4),)))
    assert one.digest() == other.digest()
    other.apply(ChangeBatch(2, (dataclasses.replace(_put("i1", 1), embedding=(0.0, 1.0)),)))
    assert one.digest() != other.digest()
    one.apply(ChangeBatch(2, (dataclasses.replace(_put("i1", 1), embedding=(0.0, 1.0)),)))
    assert one.digest() == other.digest()
    one.skip(3)
    assert one.seq == 3
    assert one.digest() == other.digest()
    other.apply(ChangeBatch(3, (dataclasses.replace(_put("n1", 4), title="other"),)))
    assert one.digest() != other.digest()  # the words put count too
