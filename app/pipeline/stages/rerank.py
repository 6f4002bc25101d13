"""Stage `rerank`: the business rules applied to the scored candidates, by rerank's selectors
(app/pipeline/selectors/), each saying what it left out of the answer."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.selectors.rerank import rerank
from app.pipeline.selectors.selecting import Exploring
from app.pipeline.signals import scores_at
from app.pipeline.stages.rerank_trace import record_rerank
from app.pipeline.types import Ranked, RankedItem, Recommendation
from app.release.catalog import Catalog
from app.release.rules import ExploreRule
from app.world.schema import HEAD_NAMES

SECONDS_PER_DAY = 86_400.0
Counts = npt.NDArray[np.float64]


class Exposures(Protocol):
    def counts(self, positions: Positions) -> tuple[Counts, Counts]:
        """Each position's showings and positives so far."""
        ...

    def showed(self, positions: Positions) -> None: ...


class Reranker:
    """The top N after boosting, capping and exploring: the answer. Without `exposure`,
    nothing is explored."""

    stage = Stage.RERANK

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        exposure: Exposures | None = None,
        draw: np.random.Generator | None = None,
    ) -> None:
        self._clock = clock
        self._exposure = exposure
        self._draw = draw or np.random.default_rng()

    async def run(self, ranked: Ranked, ctx: RequestContext) -> Recommendation:
        items = self._select(ranked, ctx)
        return Recommendation(items, ranked.asked.user.cold_start, ranked.model)

    def _select(self, ranked: Ranked, ctx: RequestContext) -> list[RankedItem]:
        catalog = ctx.artifacts.catalog
        # The page's section over the file's own rules (app.release.pages).
        page = ctx.artifacts.page(ranked.asked.query.moment.page)
        rules = page.rules
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
            with_viewed=_with_viewed(catalog, ranked.asked.user.viewed, positions)
            if rules.objectives.viewed > 0
            else None,
            exploring=self._exploring(catalog, positions, rules.explore),
        )
        served = positions[selection.positions]
        if self._exposure is not None and catalog.size > catalog.world_size:
            self._exposure.showed(served[served >= catalog.world_size])
        ctx.metrics.answer_slots(page.name, len(served), len(selection.explored))
        if ctx.trace is not None:
            record_rerank(ctx.trace, ranked, selection, catalog)
        # Only the chosen few become Python strings.
        chosen_ids: list[str] = catalog.ids_at(served).tolist()
        return [
            RankedItem(item_id, None if math.isnan(score) else score)
            for item_id, score in zip(chosen_ids, selection.scores.tolist(), strict=True)
        ]

    def _exploring(
        self, catalog: Catalog, positions: Positions, rule: ExploreRule
    ) -> Exploring | None:
        """The candidates' newcomers and their counts; None where nothing can be explored
        (no exposure counts, exploration off, or no item added while serving)."""
        if self._exposure is None or rule.slots == 0 or catalog.size == catalog.world_size:
            return None
        added = np.flatnonzero(positions >= catalog.world_size)
        if not len(added):
            return None
        shown, chosen = np.zeros(len(positions)), np.zeros(len(positions))
        shown[added], chosen[added] = self._exposure.counts(positions[added])
        newcomer = np.zeros(len(positions), dtype=bool)
        newcomer[added] = shown[added] < rule.max_shown
        if catalog.room is not None and catalog.room.withdrawals:
            newcomer &= ~catalog.room.withdrawn[positions]
        return Exploring(newcomer, shown, chosen, rule, self._draw)


def _with_viewed(
    catalog: Catalog, viewed: int, positions: Positions
) -> npt.NDArray[np.float32] | None:
    """How close each candidate is to the item the page shows, as a share of its closest
    neighbour's similarity (1 for that one, 0 off its neighbours); None on a feed, or in a
    world without neighbours. A share, because the models' scales differ tenfold (cosine's
    closest is near 0.2, EASE's weight near 0.02) and the rules' `viewed` must mean the same
    under either."""
    neighbours = catalog.neighbours_for_pages
    if viewed < 0 or neighbours is None:
        return None
    near, similarity = neighbours.of(viewed)
    valid = (near >= 0) & (similarity > 0)
    if not valid.any():
        return np.zeros(len(positions), dtype=np.float32)
    share = similarity[valid] / similarity[valid].max()
    return scores_at(positions, near[valid].astype(np.int64), share)
