"""Item features held in the API's memory, kept current from Redis.

Redis stays the source of truth. At start-up every catalog item's blob is read into one
contiguous FP32 matrix by catalog position; a request then gathers its candidates' rows with
one numpy take instead of an MGET of a thousand keys and their decoding. The loader writes a
new `items_version` into the layout record after every load; a background task polls it and,
when it changes, reads the whole matrix again beside the current one and swaps one reference.
A request reads the matrix once, so it is never served half old, half new.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.clients.feature_store import ItemBlobs
from app.core.cancelling import cancel_requested
from app.core.errors import FeatureStoreError
from app.release.world_match import same_world

log = logging.getLogger(__name__)

# Keys per read while loading: a pipeline of MGETs each, bounded by its own timeout.
LOAD_CHUNK = 10_000
LOAD_CALL_TIMEOUT_S = 5.0


class ItemSource(Protocol):
    async def items(self, keys: list[bytes], timeout_s: float) -> ItemBlobs: ...

    async def items_version(self, timeout_s: float) -> str | None: ...

    async def world_id(self, timeout_s: float) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ItemMatrix:
    """Row i holds catalog item i's blob where `usable[i]`; other rows are zeros."""

    version: str
    blobs: npt.NDArray[np.float32]
    usable: npt.NDArray[np.bool_]

    @property
    def missing(self) -> int:
        return int(len(self.usable) - np.count_nonzero(self.usable))


async def read_item_matrix(
    source: ItemSource, item_keys: npt.NDArray[np.bytes_], width: int, version: str
) -> ItemMatrix:
    """Every item's blob; missing, malformed or non-finite ones are left unusable."""
    blobs = np.zeros((len(item_keys), width), dtype=np.float32)
    usable = np.zeros(len(item_keys), dtype=bool)
    for start in range(0, len(item_keys), LOAD_CHUNK):
        keys: list[bytes] = item_keys[start : start + LOAD_CHUNK].tolist()
        got = await source.items(keys, LOAD_CALL_TIMEOUT_S)
        finite = np.isfinite(got.matrix).all(axis=1)
        rows = start + got.found[finite]
        blobs[rows] = got.matrix[finite]
        usable[rows] = True
    return ItemMatrix(version, blobs, usable)


class ItemMemory:
    """The current item matrix, and what keeps it current."""

    def __init__(
        self,
        source: ItemSource,
        item_keys: npt.NDArray[np.bytes_],
        width: int,
        initial: ItemMatrix,
        on_refresh: Callable[[ItemMatrix | None], None] = lambda matrix: None,
        world_id: str = "",
    ) -> None:
        self._source = source
        self._world_id = world_id
        self._keys = item_keys
        self._width = width
        self._current = initial
        self._on_refresh = on_refresh

    @property
    def current(self) -> ItemMatrix:
        return self._current

    def put(self, position: int, blob: npt.NDArray[np.float32]) -> None:
        """A world item's blob as the catalog's change log put it (Redis has it too, so a
        later full read agrees). Written in place: requests gather on this thread."""
        self._current.blobs[position] = blob
        self._current.usable[position] = bool(np.isfinite(blob).all())

    async def refresh(self) -> bool:
        """Read the matrix again if Redis holds a newer load; True when it was swapped.

        The version is read before and after: a load that began meanwhile (it removes the
        version first and writes it last) makes the read worthless, and it is dropped.
        """
        version = await self._source.items_version(LOAD_CALL_TIMEOUT_S)
        if not version or version == self._current.version:
            return False
        if not await self._same_world():
            return False
        matrix = await read_item_matrix(self._source, self._keys, self._width, version)
        if await self._source.items_version(LOAD_CALL_TIMEOUT_S) != version:
            return False
        self._current = matrix
        log.info(
            "item features now at version %s (%d items, %d without features)",
            version,
            len(matrix.usable),
            matrix.missing,
        )
        return True

    async def _same_world(self) -> bool:
        """A load of another world's data is not read: its items would not be this catalog's."""
        found = await self._source.world_id(LOAD_CALL_TIMEOUT_S)
        if same_world(found, self._world_id):
            return True
        log.warning(
            "Redis now holds world %s, this service serves world %s: item features not "
            "re-read (readiness reports redis_world)",
            found,
            self._world_id,
        )
        return False

    async def keep_current(self, every_s: float) -> None:
        """Refresh every `every_s` until cancelled; `on_refresh` hears of each swap (the new
        matrix) and each failure (None). A failure keeps what is held."""
        while not cancel_requested():
            await asyncio.sleep(every_s)
            try:
                swapped = await self.refresh()
            except Exception as exc:  # the task must outlive any one bad refresh
                unexpected = not isinstance(exc, FeatureStoreError)
                log.warning(
                    "item features not refreshed (%s); serving what is held",
                    exc,
                    exc_info=unexpected,
                )
                self._on_refresh(None)
                continue
            if swapped:
                self._on_refresh(self._current)
        raise asyncio.CancelledError
