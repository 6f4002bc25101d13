"""Source `trending`: the items most chosen lately (decayed counts the ingest consumer keeps)."""

from __future__ import annotations

from collections.abc import Callable

from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.taken import Taken
from app.pipeline.types import Recalling


class TrendingSource:
    """Up to `count` of the trending items the sources before did not find, hottest first.
    A page may set its own count, but the items come only where the service reads them
    (RECSYS_TRENDING_CANDIDATES above 0)."""

    name = "trending"

    def __init__(self, trending: Callable[[], Positions], count: int) -> None:
        self._trending = trending
        self._count = count

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        hot = self._trending()[: recalling.sources.count(self.name, self._count)]
        return so_far.fresh(hot)
