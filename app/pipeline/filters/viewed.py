"""Filter `viewed`: an item page never offers the item it shows."""

from __future__ import annotations

from app.core.vocabulary import Removal
from app.pipeline.context import RequestContext
from app.pipeline.types import Filtered, Pool


class ViewedFilter:
    reason = Removal.VIEWED

    async def filter(self, pool: Pool, ctx: RequestContext) -> Filtered:
        positions = pool.positions
        shown = positions == pool.asked.user.viewed
        return Filtered(positions[~shown], positions[shown], self.reason)
