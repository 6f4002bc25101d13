"""Source `similar`: the neighbours of the user's latest positives (item to item)."""

from __future__ import annotations

from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling


class SimilarSource:
    """Up to `count` items near what the user chose last, closest first, that the sources
    before did not find. A world without neighbours, or a user without positives, adds none:
    the ANN source already follows their vector."""

    name = "similar"

    def __init__(self, count: int) -> None:
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        near = recalling.asked.user.nearby.items
        count = recalling.sources.count(self.name, self._count)
        fresh: Positions = so_far.fresh(near)[:count]
        return fresh
