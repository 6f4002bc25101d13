"""The /recommend pipeline. The order of the stages is written here and nowhere else.

features -> recall -> filter -> prerank -> fetch -> pack -> rank -> rerank: the seed's
cascade, with recall casting a wide net, pre-rank keeping a few hundred in process and the
model scoring only those. Each stage is a component
of one shape (app/pipeline/step.py), run, timed and counted by `run_step`; recall's sources
and the filters are lists, in `candidate_stages`. Every stage that calls a dependency falls back
instead of failing and flags the answer (see the table in docs/api.md), so `run` returns an answer
for any request that reached it.

Adding a stage is a file in stages/ and a line in `run`; a candidate source, a file in
sources/ and a line in `candidate_stages`; a filter, a file in filters/ and a line there too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.filters.backfill import PopularBackfill
from app.pipeline.filters.blocked import BlockedFilter
from app.pipeline.filters.excluded import ExcludedFilter
from app.pipeline.filters.seen import SeenFilter
from app.pipeline.filters.viewed import ViewedFilter
from app.pipeline.filters.withdrawn import WithdrawnFilter
from app.pipeline.sources.ann import AnnSource, VectorSearch
from app.pipeline.sources.arrivals import ArrivalsSource
from app.pipeline.sources.popular import PopularSource
from app.pipeline.sources.similar import SimilarSource
from app.pipeline.sources.trending import TrendingSource
from app.pipeline.sources.viewed import ViewedSource
from app.pipeline.stages.features import UserFeatureHydrator
from app.pipeline.stages.filter import CandidateFilter, Filter
from app.pipeline.stages.pack import RowPacker
from app.pipeline.stages.prerank import PreRanker
from app.pipeline.stages.rank import Scorer
from app.pipeline.stages.recall import CandidateRecall, CandidateSource
from app.pipeline.stages.rerank import Reranker
from app.pipeline.step import Step, run_step
from app.pipeline.types import Asked, Hydrated, Pool, Query, Recommendation

NOTHING: Positions = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class CandidateStages:
    """Recall, the filters and pre-rank: the cascade's first half, over the candidates'
    positions alone. The build's evaluation runs these same objects over a world in memory
    (recsys_tools.world.judge.evaluate), so what it measures is what the service does."""

    recall: CandidateRecall
    filter: CandidateFilter
    prerank: PreRanker

    async def run(self, asked: Asked, ctx: RequestContext) -> tuple[Pool, Pool]:
        """The pool after the filters, and the part of it pre-rank hands on."""
        recalled = await run_step(self.recall, asked, ctx)
        kept = await run_step(self.filter, recalled, ctx)
        return kept, await run_step(self.prerank, kept, ctx)


@dataclass(frozen=True, slots=True)
class RecommendPipeline:
    features: UserFeatureHydrator
    candidates: CandidateStages
    fetch: Step[Pool, Hydrated]
    pack: RowPacker
    rank: Scorer
    rerank: Reranker

    async def run(self, query: Query, ctx: RequestContext) -> Recommendation:
        asked: Asked = await run_step(self.features, query, ctx)
        _, best = await self.candidates.run(asked, ctx)
        hydrated = await run_step(self.fetch, best, ctx)
        packed = await run_step(self.pack, hydrated, ctx)
        ranked = await run_step(self.rank, packed, ctx)
        return await run_step(self.rerank, ranked, ctx)


def candidate_stages(
    *,
    search: VectorSearch,
    candidate_count: int,
    popular_count: int,
    trending: Callable[[], Positions] = lambda: NOTHING,
    trending_count: int = 0,
    similar_count: int = 0,
    recent_decay: float = 0.9,
    prerank_keep: int = 5000,
    arrival_count: int = 0,
    viewed_count: int = 0,
    prerank_newcomers: int = 0,
) -> CandidateStages:
    """Recall's sources and the filters, in the order they run, and pre-rank."""
    sources: list[CandidateSource] = [
        ViewedSource(search, viewed_count),
        AnnSource(search),
        ArrivalsSource(arrival_count),
        SimilarSource(similar_count),
        TrendingSource(trending, trending_count),
        PopularSource(popular_count),
    ]
    filters: list[Filter] = [
        BlockedFilter(),
        WithdrawnFilter(),
        SeenFilter(),
        ExcludedFilter(),
        ViewedFilter(),
    ]
    return CandidateStages(
        recall=CandidateRecall(sources, candidate_count),
        filter=CandidateFilter(filters, PopularBackfill()),
        prerank=PreRanker(prerank_keep, recent_decay, prerank_newcomers),
    )


def build_pipeline(
    *,
    features: UserFeatureHydrator,
    candidates: CandidateStages,
    fetch: Step[Pool, Hydrated],
    rank: Scorer,
    rerank: Reranker,
    recent_decay: float = 0.9,
) -> RecommendPipeline:
    """The pipeline: the features stage, the candidate stages (candidate_stages), then fetch,
    pack, rank and rerank."""
    return RecommendPipeline(
        features=features,
        candidates=candidates,
        fetch=fetch,
        pack=RowPacker(recent_decay),
        rank=rank,
        rerank=rerank,
    )
