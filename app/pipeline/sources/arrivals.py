"""Source `arrivals`: items added while serving, nearest the user's vector first.

The world's FAISS index holds the items it was built with; the added ones are searched here,
exactly, over their rows of the held vectors (a few thousand inner products: tens of
microseconds), so an item is recallable the moment its change is applied.
"""

from __future__ import annotations

import numpy as np

from app.core.membership import member_mask
from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.types import Recalling


class ArrivalsSource:
    """At most `count` added items, by the user's vector against theirs."""

    name = "arrivals"

    def __init__(self, count: int) -> None:
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Positions, ctx: RequestContext
    ) -> Positions:
        catalog = ctx.artifacts.catalog
        room = catalog.room
        if room is None or self._count <= 0 or catalog.vectors is None:
            return so_far[:0]
        live = room.live(catalog.world_size, catalog.size)
        if len(so_far):
            live = live[~member_mask(live, so_far)]
        if len(live) <= self._count:
            return live
        embedding = recalling.asked.user.blob[: ctx.artifacts.schema.embedding_dim]
        scores = catalog.vectors[live] @ embedding
        best = np.argpartition(-scores, self._count - 1)[: self._count]
        chosen: Positions = live[best[np.argsort(-scores[best], kind="stable")]]
        return chosen
