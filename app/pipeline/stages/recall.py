"""Stage `recall`: the candidate sources, asked in turn, merged in their order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.taken import Marks, Taken
from app.pipeline.trace import ItemIds, Trace, first_ids
from app.pipeline.types import Asked, Pool, Recalling
from app.release.catalog import Catalog


class CandidateSource(Protocol):
    @property
    def name(self) -> str:
        """The source's name in a trace and in a page's `sources` (app.release.rules)."""
        ...

    async def candidates(
        self, recalling: Recalling, so_far: Taken, ctx: RequestContext
    ) -> Positions:
        """Candidates `so_far` lacks, in this source's order; none rather than fail."""
        ...


class CandidateRecall:
    """Asks each source in turn, so a later one can make up what the earlier ones missed."""

    stage = Stage.RECALL

    def __init__(self, sources: Sequence[CandidateSource], candidate_count: int) -> None:
        self._sources = tuple(sources)
        self._candidate_count = candidate_count
        self._marks = Marks()

    async def run(self, asked: Asked, ctx: RequestContext) -> Pool:
        catalog_size = len(ctx.artifacts.popular)
        sources = ctx.artifacts.page(asked.query.moment.page).sources
        wanted = max(sources.count("ann", self._candidate_count), asked.at_least)
        recalling = Recalling(asked, min(wanted, catalog_size), sources)
        trace, ids = ctx.trace, ctx.artifacts.catalog
        with self._marks.lent(ctx.artifacts.catalog.rows) as so_far:
            for source in self._sources:
                fresh = await source.candidates(recalling, so_far, ctx)
                so_far.add(fresh)
                if trace is not None:
                    _recalled(trace, source.name, fresh, ids)
            found = so_far.positions
        if trace is not None:
            trace.record(self.stage).went_out = len(found)
            if trace.follows and trace.followed.source is None:
                user_vector = asked.user.blob[: ctx.artifacts.schema.embedding_dim]
                _not_recalled(trace, user_vector, ctx.artifacts.catalog)
        return Pool(asked, found)


def _recalled(trace: Trace, source: str, fresh: Positions, ids: ItemIds) -> None:
    sources = trace.record(Stage.RECALL).table(
        "sources", "Candidates by source", ["source", "count", "first"]
    )
    sources.rows.append({"source": source, "count": len(fresh), "first": first_ids(ids, fresh)})
    if trace.followed.source is None and trace.holds_followed(fresh):
        trace.followed.source = source


def _not_recalled(trace: Trace, user_vector: npt.NDArray[np.float32], catalog: Catalog) -> None:
    """How near the user the followed item is, where no source brought it."""
    facts = trace.followed.facts
    rows = trace.rows(Stage.RECALL, "sources")
    facts["ann_returned"] = next((s["count"] for s in rows if s["source"] == "ann"), 0)
    facts["catalog_size"] = catalog.size
    if catalog.vectors is None or not user_vector.any():
        return
    similarity = catalog.vectors @ user_vector
    mine = similarity[trace.about]
    facts["similarity"] = round(float(mine), 4)
    facts["similarity_rank"] = int(np.count_nonzero(similarity > mine)) + 1
