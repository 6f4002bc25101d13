"""Exploration: the answer's last slots for newcomers a bandit draws, per page, counted."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from app.core.metrics import ServiceMetrics
from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.selectors.rerank import rerank
from app.pipeline.selectors.selecting import Exploring
from app.pipeline.signals import best
from app.pipeline.stages.prerank import keep_newcomers
from app.pipeline.stages.rerank import Counts, Reranker
from app.pipeline.types import Asked, ModelUsed, Moment, Query, Ranked, Scored, UserFeatures
from app.release.arrivals import ChangeBatch, ItemChange, make_room
from app.release.artifacts import serving_artifacts
from app.release.catalog import in_room
from app.release.rules import ExploreRule, PageRule, RerankRules
from tests.unit.fakes import KEYS, artifacts

SCORES = np.array([3.0, 2.5, 2.0, 1.5, 1.0, 0.5], dtype=np.float32)


def _select(
    newcomer: list[bool],
    shown: list[float] | None = None,
    chosen: list[float] | None = None,
    rule: ExploreRule | None = None,
    seed: int = 1,
    scores: np.ndarray | None = None,
) -> tuple[list[int], list[int]]:
    n = len(newcomer)
    exploring = Exploring(
        np.array(newcomer),
        np.array(shown or [0.0] * n),
        np.array(chosen or [0.0] * n),
        rule or ExploreRule(),
        np.random.default_rng(seed),
    )
    selection = rerank(
        tie_keys=np.arange(n, dtype=np.int64),
        scores=SCORES[:n] if scores is None else scores,
        categories=np.zeros(n, dtype=np.int64),
        age_days=np.full(n, 100.0, dtype=np.float32),
        rules=RerankRules(boost=()),
        n_items=3,
        exploring=exploring,
    )
    return selection.positions.tolist(), selection.explored.tolist()


def test_a_newcomer_the_ranking_left_out_takes_the_last_slot() -> None:
    answer, explored = _select([False, False, False, False, True, False])
    assert answer == [0, 1, 4]
    assert explored == [4]
    # One already in the answer on its merit is not explored.
    answer, explored = _select([True, False, False, False, False, False])
    assert (answer, explored) == ([0, 1, 2], [])


def test_nothing_is_explored_when_off_or_unscored() -> None:
    newcomer = [False, False, False, True, True, False]
    assert _select(newcomer, rule=ExploreRule(slots=0)) == ([0, 1, 2], [])
    unscored = SCORES.copy()
    unscored[3:5] = np.nan
    assert _select(newcomer, scores=unscored) == ([0, 1, 2], [])


def test_the_bandit_favours_the_newcomer_users_choose() -> None:
    newcomer = [False, False, False, True, True, False]
    # Both shown 200 times: item 3 chosen 40 times, item 4 never.
    shown, chosen = [0, 0, 0, 200, 200, 0], [0, 0, 0, 40, 0, 0]
    picks = [
        _select(newcomer, [float(v) for v in shown], [float(v) for v in chosen], seed=s)[1][0]
        for s in range(200)
    ]
    assert picks.count(3) > 190
    # Unseen, both draw from the prior alone: each gets its turns.
    fresh = [_select(newcomer, seed=s)[1][0] for s in range(200)]
    assert 50 < fresh.count(3) < 150


def test_more_slots_take_more_of_the_answers_end() -> None:
    answer, explored = _select(
        [False, False, False, True, True, True], rule=ExploreRule(slots=2), seed=3
    )
    assert answer[0] == 0
    assert sorted(answer[1:]) == sorted(explored)
    assert len(explored) == 2


class FakeExposure:
    def __init__(self, shown: dict[int, float]) -> None:
        self.shown = shown
        self.showed_positions: list[int] = []

    def counts(self, positions: Positions) -> tuple[Counts, Counts]:
        shown = np.array([self.shown.get(p, 0.0) for p in positions.tolist()])
        return shown, np.zeros(len(positions))

    def showed(self, positions: Positions) -> None:
        self.showed_positions += positions.tolist()


def _ctx_with_added(rules: RerankRules) -> RequestContext:
    """The six-item catalog with two items added while serving, at 6 and 7."""
    base = artifacts()
    vectors = np.ones((6, 2), dtype=np.float32)
    catalog = dataclasses.replace(base.catalog, vectors=vectors, neighbours=None)
    room = make_room(catalog.categories, catalog.published_at, vectors, capacity=4, blob_width=3)
    puts = tuple(ItemChange(f"n{p}", p, "t", ("a",), 1, 9, (0.5,), (1.0, 2.0)) for p in (6, 7))
    room.apply(ChangeBatch(1, puts, ()))
    grown = in_room(catalog, room)
    served = serving_artifacts(base.schema, grown, rules, base.routing, KEYS)
    return RequestContext("r1", time.monotonic() + 0.1, 0.01, served, ServiceMetrics())


def _ranked(page: str) -> Ranked:
    nothing = np.empty(0, dtype=np.int64)
    user = UserFeatures(np.zeros(3, np.float32), np.zeros(3, np.float32), nothing, False)
    asked = Asked(Query("u1", 3, moment=Moment(page=page)), user)
    positions = np.array([0, 1, 2, 3, 6, 7], dtype=np.int64)
    return Ranked(asked, Scored(positions, SCORES.copy()), ModelUsed())


def _slots(ctx: RequestContext, page: str, slot: str) -> float:
    value: float = ctx.metrics.slots.labels(page, slot)._value.get()
    return value


async def test_the_stage_explores_newcomers_per_page_and_counts_the_slots() -> None:
    rules = RerankRules(boost=(), pages={"home": PageRule(explore=ExploreRule(slots=0))})
    exposure = FakeExposure({7: 900.0})  # 7 has had its chance
    stage = Reranker(clock=time.time, exposure=exposure, draw=np.random.default_rng(0))
    ctx = _ctx_with_added(rules)
    answer = await stage.run(_ranked("other"), ctx)
    assert [item.item_id for item in answer.items] == ["i0", "i1", "n6"]
    assert exposure.showed_positions == [6]
    assert _slots(ctx, "other", "explored") == 1
    assert _slots(ctx, "other", "ranked") == 2
    # The home page's section turns it off there.
    home = await stage.run(_ranked("home"), ctx)
    assert [item.item_id for item in home.items] == ["i0", "i1", "i2"]
    assert _slots(ctx, "home", "explored") == 0
    assert _slots(ctx, "home", "ranked") == 3


def test_pre_rank_keeps_a_place_for_the_best_newcomers() -> None:
    # Newcomers 6 and 7 score below every world item: 7 a little above 6.
    scores = np.array([5, 4, 3, 2, 1, 0.0, -2, -1], dtype=np.float32)
    positions = np.array([0, 1, 2, 3, 4, 5, 6, 7], dtype=np.int64)
    kept = keep_newcomers(best(scores, 4), positions, scores, 6, reserved=1)
    assert positions[kept].tolist() == [0, 1, 2, 7]
    kept = keep_newcomers(best(scores, 4), positions, scores, 6, reserved=5)
    assert positions[kept].tolist() == [0, 1, 7, 6]
