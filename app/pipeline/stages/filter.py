"""Stage `filter`: the filters in turn, each removing candidates for its one reason, then the
backfill. Runs before any feature is read, so no work is spent on a removed candidate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.core.vocabulary import Removal, Stage
from app.pipeline.context import RequestContext
from app.pipeline.trace import ItemIds, Trace
from app.pipeline.types import Filtered, Pool


class Filter(Protocol):
    @property
    def reason(self) -> Removal: ...

    async def filter(self, pool: Pool, ctx: RequestContext) -> Filtered: ...


class Backfill(Protocol):
    async def fill(self, recalled: Pool, kept: Pool, ctx: RequestContext) -> Pool:
        """`kept`, topped up when it is shorter than the answer; `recalled` is what came in."""
        ...


class CandidateFilter:
    """Each filter sees what the ones before it kept, so a candidate is counted once, under
    the first reason that removed it."""

    stage = Stage.FILTER

    def __init__(self, filters: Sequence[Filter], backfill: Backfill) -> None:
        self._filters = tuple(filters)
        self._backfill = backfill

    async def run(self, pool: Pool, ctx: RequestContext) -> Pool:
        kept, trace = pool, ctx.trace
        for candidate_filter in self._filters:
            result = await candidate_filter.filter(kept, ctx)
            ctx.metrics.removed_count[result.reason].inc(len(result.removed))
            kept = Pool(pool.asked, result.kept)
            if trace is not None:
                _filtered(trace, result, ctx.artifacts.catalog)
        filled = await self._backfill.fill(pool, kept, ctx)
        if trace is not None:
            record = trace.record(self.stage)
            record.came_in, record.went_out = pool.candidates, filled.candidates
            if filled.candidates > kept.candidates:
                record.facts["backfilled"] = filled.candidates - kept.candidates
        return filled


def _filtered(trace: Trace, result: Filtered, ids: ItemIds) -> None:
    trace.record(Stage.FILTER).remove(result.reason, result.removed, ids)
    if trace.followed.removed_by is None and trace.holds_followed(result.removed):
        trace.followed.removed_by = result.reason
