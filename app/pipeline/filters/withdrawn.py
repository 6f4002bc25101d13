"""Filter `withdrawn`: items taken out of the catalog while serving (POST /catalog/withdrawals).

The withdrawn mask is written in place when a withdrawal is applied, so it holds for every
request from then on, those already running included.
"""

from __future__ import annotations

from app.core.vocabulary import Removal
from app.pipeline.context import RequestContext
from app.pipeline.types import Filtered, Pool


class WithdrawnFilter:
    reason = Removal.WITHDRAWN

    async def filter(self, pool: Pool, ctx: RequestContext) -> Filtered:
        positions = pool.positions
        withdrawn = ctx.artifacts.withdrawn
        if withdrawn is None:
            return Filtered(positions, positions[:0], self.reason)
        out = withdrawn[positions]
        return Filtered(positions[~out], positions[out], self.reason)
