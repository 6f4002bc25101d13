"""Source `viewed`: on an item page, the items around the one it shows.

First what users chose with it (the neighbours the world keeps for pages, closest first),
then the items nearest its vector: the index's and, searched exactly, those added while
serving, so an item added a moment ago is on its neighbours' pages at once. A feed (no item
viewed) adds none.
"""

from __future__ import annotations

import numpy as np

from app.core.errors import RecallError
from app.core.membership import member_mask
from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.sources.ann import VectorSearch
from app.pipeline.sources.arrivals import nearest_added
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling
from app.release.catalog import Catalog


class ViewedSource:
    """At most `count` items (the page's, where it says) around the viewed item."""

    name = "viewed"

    def __init__(self, search: VectorSearch, count: int) -> None:
        self._search = search
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        viewed = recalling.asked.user.viewed
        count = recalling.sources.count(self.name, self._count)
        catalog = ctx.artifacts.catalog
        if viewed < 0 or count <= 0:
            return so_far.positions[:0]
        taken = np.append(so_far.positions, np.int64(viewed))
        chosen = _chosen_with(catalog, viewed, taken)[:count]
        if len(chosen) >= count or catalog.vectors is None:
            return chosen
        near = await self._nearest(catalog, viewed, count, np.concatenate([taken, chosen]), ctx)
        return np.concatenate([chosen, near[: count - len(chosen)]])

    async def _nearest(
        self, catalog: Catalog, viewed: int, count: int, taken: Positions, ctx: RequestContext
    ) -> Positions:
        """The items nearest the viewed one's vector that `taken` lacks, nearest first."""
        assert catalog.vectors is not None
        vector = catalog.vectors[viewed]
        try:
            found = await self._search.search(catalog, vector, count + len(taken), ctx.time_for())
        except RecallError as exc:
            ctx.degrade(Stage.RECALL, exc.kind, exc)
            found = taken[:0]
        found = found.astype(np.int64, copy=False)
        found = found[~member_mask(found, taken)]
        added = nearest_added(catalog, vector, count, taken)
        if not len(added):
            return found
        both = np.concatenate([found, added])
        order = np.argsort(-(catalog.vectors[both] @ vector), kind="stable")
        merged: Positions = both[order]
        return merged


def _chosen_with(catalog: Catalog, viewed: int, taken: Positions) -> Positions:
    """The viewed item's neighbours that `taken` lacks, closest first."""
    neighbours = catalog.neighbours_for_pages
    if neighbours is None:
        return taken[:0]
    row = neighbours.of(viewed)[0].astype(np.int64)
    row = row[row >= 0]
    fresh: Positions = row[~member_mask(row, taken)]
    return fresh
