"""Filter `excluded`: items the request itself asks to leave out."""

from __future__ import annotations

from app.core.membership import member_mask
from app.core.vocabulary import Removal
from app.pipeline.context import RequestContext
from app.pipeline.types import Filtered, Pool


class ExcludedFilter:
    reason = Removal.EXCLUDED

    async def filter(self, pool: Pool, ctx: RequestContext) -> Filtered:
        positions = pool.positions
        # Ids the catalog lacks cannot be candidates, so they drop out here.
        excluded_at = ctx.artifacts.positions_of(pool.asked.query.exclude_item_ids)
        excluded = member_mask(positions, excluded_at)
        return Filtered(positions[~excluded], positions[excluded], self.reason)
