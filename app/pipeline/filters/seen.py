"""Filter `seen`: items the user has seen, whatever the length of their history."""

from __future__ import annotations

from app.core.membership import member_mask
from app.core.vocabulary import Removal
from app.pipeline.context import RequestContext
from app.pipeline.types import Filtered, Pool


class SeenFilter:
    reason = Removal.SEEN

    async def filter(self, pool: Pool, ctx: RequestContext) -> Filtered:
        positions = pool.positions
        seen = member_mask(positions, pool.asked.user.seen)
        return Filtered(positions[~seen], positions[seen], self.reason)
