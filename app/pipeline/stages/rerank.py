"""Stage `rerank`: the business rules applied to the scored candidates, by rerank's selectors
(app/pipeline/selectors/), each saying what it left out of the answer."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from app.core.vocabulary import Stage
from app.pipeline.context import RequestContext
from app.pipeline.selectors.rerank import rerank
from app.pipeline.types import Ranked, RankedItem, Recommendation
from app.release.schema import HEAD_NAMES

SECONDS_PER_DAY = 86_400.0


class Reranker:
    """The top N after boosting and capping: the answer."""

    stage = Stage.RERANK

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    async def run(self, ranked: Ranked, ctx: RequestContext) -> Recommendation:
        items = self._select(ranked, ctx)
        return Recommendation(items, ranked.asked.user.cold_start, ranked.model)

    def _select(self, ranked: Ranked, ctx: RequestContext) -> list[RankedItem]:
        catalog, rules = ctx.artifacts.catalog, ctx.artifacts.rules
        scored, n_items = ranked.scored, ranked.asked.query.num_items
        positions = scored.positions
        age_days = (self._clock() - catalog.published_at[positions]) / SECONDS_PER_DAY
        selection = rerank(
            tie_keys=positions,
            scores=scored.scores,
            categories=catalog.categories[positions],
            age_days=age_days.astype("float32"),
            rules=rules,
            n_items=n_items,
            vectors=None
            if catalog.vectors is None or rules.diversity.relevance >= 1.0
            else catalog.vectors[positions],
            likes=None if scored.heads is None else scored.heads[:, HEAD_NAMES.index("like")],
            scale=ctx.artifacts.schema.score_scale,
            explain=ctx.trace is not None,
        )
        if ctx.trace is not None:
            ctx.trace.reranked(ranked, selection, catalog)
        # Only the chosen few become Python strings.
        chosen_ids: list[str] = catalog.item_ids[positions[selection.positions]].tolist()
        return [
            RankedItem(item_id, None if math.isnan(score) else score)
            for item_id, score in zip(chosen_ids, selection.scores.tolist(), strict=True)
        ]
