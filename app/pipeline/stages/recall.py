"""Stage `recall`: the candidate sources, asked in turn, merged in their order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.types import Asked, Pool, Recalling


class CandidateSource(Protocol):
    @property
    def name(self) -> str:
        """The source's name in a trace: ann, similar, trending, popular."""
        ...

    async def candidates(
        self, recalling: Recalling, so_far: Positions, ctx: RequestContext
    ) -> Positions:
        """Candidates absent from `so_far`, in this source's order; none rather than fail."""
        ...


class CandidateRecall:
    """Asks each source in turn, so a later one can make up what the earlier ones missed."""

    stage = Stage.RECALL

    def __init__(self, sources: Sequence[CandidateSource], candidate_count: int) -> None:
        self._sources = tuple(sources)
        self._candidate_count = candidate_count

    async def run(self, asked: Asked, ctx: RequestContext) -> Pool:
        catalog_size = len(ctx.artifacts.popular)
        recalling = Recalling(asked, min(max(self._candidate_count, asked.at_least), catalog_size))
        so_far: Positions = np.empty(0, dtype=np.int64)
        trace, ids = ctx.trace, ctx.artifacts.catalog.item_ids
        for source in self._sources:
            fresh = await source.candidates(recalling, so_far, ctx)
            so_far = np.concatenate([so_far, fresh]) if len(so_far) else fresh
            if trace is not None:
                trace.recalled(source.name, fresh, ids)
        if trace is not None and trace.follows and trace.followed.source is None:
            user_vector = asked.user.blob[: ctx.artifacts.schema.embedding_dim]
            trace.not_recalled(user_vector, ctx.artifacts.catalog)
        return Pool(asked, so_far)
