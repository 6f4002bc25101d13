"""Stage `recall`: FAISS nearest neighbours of the user vector, merged with popular items."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Any

import numpy as np
import numpy.typing as npt

from app.catalog import Catalog
from app.context import RequestContext
from app.errors import FailureKind

Positions = npt.NDArray[np.int64]


def _search(index: Any, vector: npt.NDArray[np.float32], k: int) -> Positions:
    _, ids = index.search(vector.reshape(1, -1), k)
    found: Positions = ids[0]
    return found[found >= 0]


class AnnCandidateSource:
    """Inner-product search on the catalog's FAISS index, run off the event loop."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    async def search(self, catalog: Catalog, vector: npt.NDArray[np.float32], k: int) -> Positions:
        loop = asyncio.get_running_loop()
        query = np.ascontiguousarray(vector, dtype=np.float32)
        return await loop.run_in_executor(self._executor, _search, catalog.index, query, k)


def merge_popular(found: Positions, popular_order: Positions, extra: int) -> Positions:
    """Append the `extra` most popular items that `found` lacks, keeping `found`'s order."""
    if extra <= 0:
        return found
    head = popular_order[: extra + len(found)]
    fresh = head[~np.isin(head, found)][:extra]
    return np.concatenate([found, fresh])


class CandidateRecall:
    """Merges the ANN source with popular items, and tops up when ANN returns too few."""

    def __init__(self, ann: AnnCandidateSource, candidate_count: int, popular_count: int) -> None:
        self._ann = ann
        self._candidate_count = candidate_count
        self._popular_count = popular_count

    async def recall(
        self, user_embedding: npt.NDArray[np.float32], at_least: int, ctx: RequestContext
    ) -> Positions:
        """Unblocked candidates in recall order: ANN hits first, then popular ones."""
        artifacts = ctx.artifacts
        k = min(max(self._candidate_count, at_least), len(artifacts.popular))
        try:
            found = await self._ann.search(artifacts.catalog, user_embedding, k)
        except RuntimeError:  # faiss reports every failure as RuntimeError
            ctx.degrade("recall", FailureKind.ERROR)
            found = np.empty(0, dtype=np.int64)
        found = found[~artifacts.blocked[found]].astype(np.int64, copy=False)
        extra = min(self._popular_count + max(0, k - len(found)), len(artifacts.popular))
        return merge_popular(found, artifacts.popular, extra)
