"""The /recommend pipeline. The order of the stages is written here and nowhere else.

features -> recall -> filter -> fetch -> pack -> rank -> rerank. Every stage that calls a
dependency falls back instead of failing and flags the answer (see the README's table), so
`run` returns an answer for any request that reached it.
"""

from __future__ import annotations

import numpy as np

from app.core.vocabulary import Stage
from app.pipeline.context import RequestContext
from app.pipeline.packing import pack_rows
from app.pipeline.stages.features import UserFeatureHydrator
from app.pipeline.stages.fetch import CandidateHydrator
from app.pipeline.stages.filter import CandidateFilter
from app.pipeline.stages.rank import Scorer
from app.pipeline.stages.recall import CandidateRecall
from app.pipeline.stages.rerank import Reranker
from app.pipeline.stages.types import Query, Recommendation


class RecommendPipeline:
    def __init__(
        self,
        features: UserFeatureHydrator,
        recall: CandidateRecall,
        filter: CandidateFilter,
        fetch: CandidateHydrator,
        rank: Scorer,
        rerank: Reranker,
    ) -> None:
        self._features = features
        self._recall = recall
        self._filter = filter
        self._fetch = fetch
        self._rank = rank
        self._rerank = rerank

    async def run(self, query: Query, ctx: RequestContext) -> Recommendation:
        artifacts = ctx.artifacts
        with ctx.stage(Stage.FEATURES):
            user = await self._features.hydrate(query, ctx)
        # Ask recall for enough that the answer can be full after the filter.
        at_least = query.num_items + len(user.seen) + len(query.exclude_item_ids)
        with ctx.stage(Stage.RECALL):
            recalled = await self._recall.recall(user, at_least, ctx)
        ctx.count(Stage.RECALL, len(recalled))
        with ctx.stage(Stage.FILTER):
            filtered = self._filter.filter(
                recalled, user.seen, query.exclude_item_ids, query.num_items, artifacts
            )
        for reason, count in filtered.removed.items():
            ctx.metrics.removed_count[reason].inc(count)
        ctx.count(Stage.FILTER, len(filtered.kept))
        with ctx.stage(Stage.FETCH):
            hydrated = await self._fetch.hydrate(filtered.kept, ctx)
        ctx.count(Stage.FETCH, len(hydrated.found))
        with ctx.stage(Stage.PACK):
            rows = (
                pack_rows(artifacts.schema, user.blob, hydrated.blobs, user.context)
                if len(hydrated.found)
                else np.empty((0, artifacts.schema.width), np.float32)
            )
        with ctx.stage(Stage.RANK):
            scored = await self._rank.score(hydrated, rows, ctx)
        ctx.count(Stage.RANK, int(np.count_nonzero(~np.isnan(scored.scores))))
        with ctx.stage(Stage.RERANK):
            items = self._rerank.select(scored, query.num_items, ctx)
        ctx.count(Stage.RERANK, len(items))
        return Recommendation(items=items, cold_start=user.cold_start)
