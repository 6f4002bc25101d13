"""Filter `blocked`: items the rules' block list names."""

from __future__ import annotations

from app.core.vocabulary import Removal
from app.pipeline.context import RequestContext
from app.pipeline.types import Filtered, Pool


class BlockedFilter:
    reason = Removal.BLOCKED

    async def filter(self, pool: Pool, ctx: RequestContext) -> Filtered:
        positions = pool.positions
        blocked = ctx.artifacts.blocked[positions]
        return Filtered(positions[~blocked], positions[blocked], self.reason)
