"""Source `ann`: FAISS nearest neighbours of the user's embedding, on the loop or in a pool."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor, Future
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from app.core.errors import FailureKind, RecallError
from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling
from app.release.catalog import Catalog

_NONE: Positions = np.empty(0, dtype=np.int64)


class VectorSearch(Protocol):
    async def search(
        self, catalog: Catalog, vector: npt.NDArray[np.float32], k: int, timeout_s: float
    ) -> Positions: ...


def _search(index: Any, vector: npt.NDArray[np.float32], k: int) -> Positions:
    _, ids = index.search(vector.reshape(1, -1), k)
    found: Positions = ids[0]
    return found[found >= 0]


def _failed(exc: RuntimeError) -> RecallError:  # faiss reports every failure as RuntimeError
    return RecallError(FailureKind.ERROR, str(exc))


class InlineSearch:
    """Inner-product search on the catalog's FAISS index, on the event loop itself.

    A search of a few hundred microseconds costs less than handing it to a thread and back
    (measured: the API's CPU per request about 15% lower on the demo world); the event loop
    is busy for that long, which is why slow indexes use a pool (PooledSearch) instead.
    """

    async def search(
        self, catalog: Catalog, vector: npt.NDArray[np.float32], k: int, timeout_s: float
    ) -> Positions:
        if timeout_s <= 0:
            raise RecallError(FailureKind.TIMEOUT, "no time left before the deadline")
        try:
            return _search(catalog.index, np.ascontiguousarray(vector, dtype=np.float32), k)
        except RuntimeError as exc:
            raise _failed(exc) from exc


class PooledSearch:
    """Inner-product search on the catalog's FAISS index, in a thread pool off the event loop.

    At most `max_pending` searches wait or run at once: a search that cannot start soon
    would only finish after its request gave up, so beyond that recall falls back at once.
    """

    def __init__(self, executor: Executor, max_pending: int) -> None:
        self._executor = executor
        self._max_pending = max_pending
        self._pending = 0

    def _release(self, _: Future[Positions]) -> None:
        self._pending -= 1

    async def search(
        self, catalog: Catalog, vector: npt.NDArray[np.float32], k: int, timeout_s: float
    ) -> Positions:
        if timeout_s <= 0:
            raise RecallError(FailureKind.TIMEOUT, "no time left before the deadline")
        if self._pending >= self._max_pending:
            raise RecallError(FailureKind.OVERLOADED, f"{self._pending} searches queued")
        loop = asyncio.get_running_loop()
        query = np.ascontiguousarray(vector, dtype=np.float32)
        future = self._executor.submit(_search, catalog.index, query, k)
        self._pending += 1
        # Released when the search really ends (or is cancelled before it starts), not when
        # its request stops waiting, so the bound counts the pool's actual backlog.
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(self._release, done))
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.wrap_future(future)
        except TimeoutError as exc:
            raise RecallError(FailureKind.TIMEOUT, f"search took over {timeout_s:.3f}s") from exc
        except RuntimeError as exc:
            raise _failed(exc) from exc


class AnnSource:
    """The `wanted` nearest items to the user's embedding; none, flagged, when search fails."""

    name = "ann"

    def __init__(self, search: VectorSearch) -> None:
        self._search = search

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        artifacts = ctx.artifacts
        embedding = recalling.asked.user.blob[: artifacts.schema.embedding_dim]
        try:
            found = await self._search.search(
                artifacts.catalog, embedding, recalling.wanted, ctx.time_for()
            )
        except RecallError as exc:
            ctx.degrade(Stage.RECALL, exc.kind, exc)
            return _NONE
        found = found.astype(np.int64, copy=False)
        return so_far.fresh(found)
