"""Source `popular`: the most popular items, more of them when the sources before fell short."""

from __future__ import annotations

from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling


def fresh_popular(so_far: Taken, popular_order: Positions, extra: int) -> Positions:
    """The `extra` most popular items that `so_far` lacks, most popular first."""
    if extra <= 0:
        return popular_order[:0]
    fresh: Positions = so_far.fresh(popular_order[: extra + len(so_far)])[:extra]
    return fresh


class PopularSource:
    """`count` popular items, plus as many as the sources before fell short of `wanted`."""

    name = "popular"

    def __init__(self, count: int) -> None:
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        popular = ctx.artifacts.popular
        count = recalling.sources.count(self.name, self._count)
        extra = min(count + max(0, recalling.wanted - len(so_far)), len(popular))
        return fresh_popular(so_far, popular, extra)
