"""Source `similar`: the neighbours of the user's latest positives (item to item)."""

from __future__ import annotations

from app.core.membership import member_mask
from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.stages.types import Recalling


class SimilarSource:
    """Up to `count` items near what the user chose last, closest first, that the sources
    before did not find. A world without neighbours, or a user without positives, adds none:
    the ANN source already follows their vector."""

    def __init__(self, count: int, decay: float) -> None:
        self._count = count
        self._decay = decay

    async def candidates(
        self, recalling: Recalling, so_far: Positions, ctx: RequestContext
    ) -> Positions:
        neighbours = ctx.artifacts.catalog.neighbours
        recent = recalling.asked.user.recent
        if neighbours is None or not self._count or not len(recent):
            return recent[:0]
        near, _ = neighbours.around(recent, self._decay)
        fresh: Positions = near[~member_mask(near, so_far)][: self._count]
        return fresh
