"""The held item matrix: read by catalog position, swapped only on a complete new load."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from app.clients.feature_store import ItemBlobs, decode_item_blobs
from app.clients.item_memory import ItemMatrix, ItemMemory, read_item_matrix
from app.pipeline.stages.fetch import HeldItemHydrator
from app.pipeline.types import Pool
from tests.unit.fakes import asked, context

WIDTH = 3


class FakeSource:
    """Blobs by key; the version can change while the matrix is being read."""

    def __init__(self, blobs: dict[bytes, bytes], version: str | None, world: str = "w1") -> None:
        self.blobs = blobs
        self.versions = [version]
        self.world = world
        self.reads = 0

    async def items(self, keys: list[bytes], timeout_s: float) -> ItemBlobs:
        self.reads += 1
        return decode_item_blobs([self.blobs.get(key) for key in keys], WIDTH)

    async def items_version(self, timeout_s: float) -> str | None:
        return self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]

    async def world_id(self, timeout_s: float) -> str | None:
        return self.world


def _blob(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


KEYS = np.array([b"i:a", b"i:b", b"i:c", b"i:d"])


async def test_rows_by_position_with_bad_ones_left_unusable() -> None:
    source = FakeSource(
        {b"i:a": _blob(1, 2, 3), b"i:c": _blob(7, 8, float("nan")), b"i:d": b"\x00"}, "v1"
    )
    matrix = await read_item_matrix(source, KEYS, WIDTH, "v1")
    assert matrix.usable.tolist() == [True, False, False, False]
    assert matrix.blobs[0].tolist() == [1, 2, 3]
    assert matrix.missing == 3


def _memory(source: FakeSource) -> ItemMemory:
    blobs = np.zeros((len(KEYS), WIDTH), np.float32)
    held = ItemMatrix("v1", blobs, np.ones(len(KEYS), bool))
    return ItemMemory(source, KEYS, WIDTH, held, world_id="w1")


async def test_a_new_version_is_read_and_swapped() -> None:
    source = FakeSource({b"i:b": _blob(4, 5, 6)}, "v2")
    memory = _memory(source)
    assert await memory.refresh() is True
    assert memory.current.version == "v2"
    assert memory.current.usable.tolist() == [False, True, False, False]


@pytest.mark.parametrize("version", ["v1", None, ""])
async def test_the_same_version_or_a_load_in_progress_reads_nothing(version: str | None) -> None:
    source = FakeSource({}, version)
    memory = _memory(source)
    held = memory.current
    assert await memory.refresh() is False
    assert memory.current is held
    assert source.reads == 0


async def test_a_load_that_began_during_the_read_is_not_swapped_in() -> None:
    source = FakeSource({b"i:a": _blob(1, 2, 3)}, "v2")
    source.versions = ["v2", None]  # gone when read again: a load began meanwhile
    memory = _memory(source)
    held = memory.current
    assert await memory.refresh() is False
    assert memory.current is held


async def test_a_load_of_another_world_is_not_read() -> None:
    source = FakeSource({b"i:a": _blob(1, 2, 3)}, "v2", world="w2")
    memory = _memory(source)
    held = memory.current
    assert await memory.refresh() is False
    assert memory.current is held
    assert source.reads == 0


class Held:
    def __init__(self, matrix: ItemMatrix) -> None:
        self.current = matrix


async def test_candidates_gather_their_rows_and_the_missing_are_flagged() -> None:
    blobs = np.arange(12, dtype=np.float32).reshape(4, 3)
    matrix = ItemMatrix("v1", blobs, np.array([True, False, True, True]))
    ctx = context()
    pool = Pool(asked(), np.array([3, 1, 0]))
    hydrated = (await HeldItemHydrator(Held(matrix)).run(pool, ctx)).items
    assert hydrated.positions.tolist() == [3, 1, 0]
    assert hydrated.found.tolist() == [0, 2]
    assert hydrated.blobs.tolist() == [[9, 10, 11], [0, 1, 2]]
    assert ctx.degraded == ["fetch:missing"]  # one of three is over the 10% share


class SwallowingSource(FakeSource):
    """A client that, like some do when their own timeout is also due, eats a cancel."""

    def __init__(self) -> None:
        super().__init__({}, "v1")
        self.entered = asyncio.Event()

    async def items_version(self, timeout_s: float) -> str | None:
        self.entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return "v1"


async def test_refreshing_stops_on_cancel_even_when_a_client_swallows_it() -> None:
    source = SwallowingSource()
    refreshing = asyncio.ensure_future(_memory(source).keep_current(0.001))
    await asyncio.wait_for(source.entered.wait(), 1.0)
    refreshing.cancel()
    done, _ = await asyncio.wait({refreshing}, timeout=1.0)
    assert refreshing in done, "the refresh kept running after its cancel"
    assert refreshing.cancelled()
