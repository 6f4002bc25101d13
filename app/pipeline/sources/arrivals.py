"""Source `arrivals`: items added while serving, nearest the user's vector first.

The world's FAISS index holds the items it was built with; the added ones are searched here,
exactly, over their rows of the held vectors (a few thousand inner products: tens of
microseconds), so an item is recallable the moment its change is applied.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.membership import member_mask
from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.types import Recalling
from app.release.catalog import Catalog


def nearest_added(
    catalog: Catalog, vector: npt.NDArray[np.float32], count: int, so_far: Positions
) -> Positions:
    """At most `count` added items that `so_far` lacks, nearest `vector` first."""
    room = catalog.room
    if room is None or count <= 0 or catalog.vectors is None:
        return so_far[:0]
    live = room.live(catalog.world_size, catalog.size)
    if len(so_far):
        live = live[~member_mask(live, so_far)]
    if len(live) <= count:
        return live
    scores = catalog.vectors[live] @ vector
    best = np.argpartition(-scores, count - 1)[:count]
    chosen: Positions = live[best[np.argsort(-scores[best], kind="stable")]]
    return chosen


class ArrivalsSource:
    """At most `count` added items (the page's, where it says), by the user's vector."""

    name = "arrivals"

    def __init__(self, count: int) -> None:
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Positions, ctx: RequestContext
    ) -> Positions:
        count = recalling.sources.count(self.name, self._count)
        embedding = recalling.asked.user.blob[: ctx.artifacts.schema.embedding_dim]
        return nearest_added(ctx.artifacts.catalog, embedding, count, so_far)
