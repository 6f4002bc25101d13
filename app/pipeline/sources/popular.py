"""Source `popular`: the most popular items, more of them when the sources before fell short."""

from __future__ import annotations

import numpy as np

from app.core.membership import member_mask
from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling


def fresh_popular(found: Positions, popular_order: Positions, extra: int) -> Positions:
    """The `extra` most popular items that `found` lacks, most popular first."""
    if extra <= 0:
        return popular_order[:0]
    head = popular_order[: extra + len(found)]
    fresh: Positions = head[~member_mask(head, found)][:extra]
    return fresh


def merge_popular(found: Positions, popular_order: Positions, extra: int) -> Positions:
    """`found`, in its order, then the `extra` most popular items it lacks."""
    if extra <= 0:
        return found
    return np.concatenate([found, fresh_popular(found, popular_order, extra)])


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
        found = len(so_far)
        extra = min(count + max(0, recalling.wanted - found), len(popular))
        if extra <= 0:
            return popular[:0]
        fresh: Positions = so_far.fresh(popular[: extra + found])[:extra]
        return fresh
