import numpy as np

from app.core.vocabulary import Removal
from app.pipeline.filters.backfill import PopularBackfill
from app.pipeline.filters.blocked import BlockedFilter
from app.pipeline.filters.excluded import ExcludedFilter
from app.pipeline.filters.seen import SeenFilter
from app.pipeline.stages.filter import CandidateFilter
from app.pipeline.types import Pool
from app.release.rules import BlockRule, RerankRules
from tests.unit.fakes import artifacts, asked, context


async def _filter(
    positions: list[int], seen: set[str], excluded: set[str], at_least: int, blocked: set[str]
) -> tuple[list[int], dict[Removal, int]]:
    rules = RerankRules(block=BlockRule(item_ids=frozenset(blocked)))
    ctx = context()
    ctx.artifacts = artifacts(rules)
    seen_at = sorted(int(item[1:]) for item in seen)  # iN is at N
    request = asked(at_least, seen_at, frozenset(excluded))
    stage = CandidateFilter([BlockedFilter(), SeenFilter(), ExcludedFilter()], PopularBackfill())
    kept = await stage.run(Pool(request, np.array(positions, dtype=np.int64)), ctx)
    removed = {reason: ctx.metrics.removed_count[reason]._value.get() for reason in Removal}
    return kept.positions.tolist(), removed


async def test_removes_blocked_seen_and_excluded_and_says_how_many_of_each() -> None:
    kept, removed = await _filter(
        [5, 4, 3, 2], seen={"i4"}, excluded={"i3", "i4"}, at_least=1, blocked={"i5"}
    )
    assert kept == [2]
    assert removed == {
        Removal.BLOCKED: 1,
        Removal.SEEN: 1,
        Removal.EXCLUDED: 1,
        Removal.WITHDRAWN: 0,
        Removal.VIEWED: 0,
    }


async def test_keeps_order_when_nothing_is_removed() -> None:
    kept, removed = await _filter([3, 1, 4], set(), set(), at_least=3, blocked=set())
    assert kept == [3, 1, 4]
    assert sum(removed.values()) == 0


async def test_backfills_from_popular_items_that_are_neither_present_nor_unwanted() -> None:
    # Popular order is i0, i1, i2...; i0 is seen, i1 blocked (so never popular), i3 present.
    kept, _ = await _filter([3, 5], seen={"i0", "i5"}, excluded=set(), at_least=3, blocked={"i1"})
    assert kept == [3, 2, 4]


async def test_each_filter_says_what_it_removed_and_why() -> None:
    ctx = context()
    pool = Pool(asked(seen=[4, 2]), np.array([5, 4, 3, 2], dtype=np.int64))
    result = await SeenFilter().filter(pool, ctx)
    assert result.kept.tolist() == [5, 3]
    assert result.removed.tolist() == [4, 2]
    assert result.reason is Removal.SEEN
