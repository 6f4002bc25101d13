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
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling
from app.release.catalog import Catalog


def nearest_added(
    catalog: Catalog, vector: npt.NDArray[np.float32], count: int, so_far: Positions
) -> Positions:
    """At most `count` added items that `so_far` lacks, nearest `vector` first.

    Where the world's index has cells, only the added items filed under the cells `vector`
    probes are scored, as the index scans its own (app.release.added_cells); else every
    added row, contiguous past the world's, in one product over a view of them."""
    room = catalog.room
    base, size = catalog.world_size, catalog.size
    if room is None or count <= 0 or catalog.vectors is None or size <= base:
        return so_far[:0]
    if room.cells is not None:
        positions = room.cells.probed(vector, base, size)
    else:
        positions = np.arange(base, size, dtype=np.int64)
    if not room.all_live:
        positions = positions[room.present[positions] & ~room.withdrawn[positions]]
    taken = so_far[so_far >= base]
    wanted = min(count + len(taken), len(positions))
    if wanted <= 0:
        return so_far[:0]
    scores = (
        catalog.vectors[positions] @ vector
        if room.cells is not None
        else (catalog.vectors[base:size] @ vector)[positions - base]
    )
    cut = len(scores) - wanted
    best = np.argpartition(scores, cut)[cut:] if cut > 0 else np.arange(len(scores))
    found: Positions = positions[best[np.argsort(-scores[best], kind="stable")]]
    if len(taken):
        found = found[~member_mask(found, taken)]
    return found[:count]


class ArrivalsSource:
    """At most `count` added items (the page's, where it says), by the user's vector."""

    name = "arrivals"

    def __init__(self, count: int) -> None:
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        count = recalling.sources.count(self.name, self._count)
        embedding = recalling.asked.user.blob[: ctx.artifacts.schema.embedding_dim]
        return nearest_added(ctx.artifacts.catalog, embedding, count, so_far.positions)
