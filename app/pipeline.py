"""The /recommend pipeline. The order of the stages is written here and nowhere else."""

from __future__ import annotations

from app.api_models import RecommendRequest
from app.context import RequestContext
from app.packing import pack_rows
from app.stages.features import UserFeatureHydrator
from app.stages.fetch import ItemFeatureHydrator
from app.stages.rank import Scorer
from app.stages.recall import CandidateRecall
from app.stages.rerank import Reranker
from app.stages.types import Recommendation


class RecommendPipeline:
    def __init__(
        self,
        features: UserFeatureHydrator,
        recall: CandidateRecall,
        fetch: ItemFeatureHydrator,
        rank: Scorer,
        rerank: Reranker,
    ) -> None:
        self._features = features
        self._recall = recall
        self._fetch = fetch
        self._rank = rank
        self._rerank = rerank

    async def run(self, request: RecommendRequest, ctx: RequestContext) -> Recommendation:
        schema = ctx.artifacts.schema
        with ctx.stage("features"):
            user = await self._features.hydrate(request.user_id, request.context, ctx)
        unwanted = user.seen.union(request.exclude_item_ids)
        # Ask recall for enough that the answer can be full after the filters drop items.
        at_least = request.num_items + len(unwanted)
        with ctx.stage("recall"):
            positions = await self._recall.recall(user.blob[: schema.embedding_dim], at_least, ctx)
        ctx.count("recall", len(positions))
        with ctx.stage("fetch"):
            hydrated = await self._fetch.hydrate(positions, ctx)
        ctx.count("fetch", len(hydrated.positions))
        with ctx.stage("pack"):
            rows = (
                None
                if hydrated.blobs is None
                else pack_rows(schema, user.blob, hydrated.blobs, user.context)
            )
        with ctx.stage("rank"):
            scores = await self._rank.score(rows, len(hydrated.positions), ctx)
        ctx.count("rank", len(scores))
        with ctx.stage("rerank"):
            items = self._rerank.select(
                hydrated.positions, scores, unwanted, request.num_items, ctx
            )
        ctx.count("rerank", len(items))
        return Recommendation(items=items, cold_start=user.cold_start)
