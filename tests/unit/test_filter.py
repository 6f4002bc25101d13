import numpy as np

from app.core.vocabulary import Removal
from app.pipeline.stages.filter import CandidateFilter
from app.release.rules import BlockRule, RerankRules
from tests.unit.fakes import artifacts


def _filter(
    positions: list[int], seen: set[str], excluded: set[str], at_least: int, blocked: set[str]
) -> tuple[list[int], dict[Removal, int]]:
    rules = RerankRules(block=BlockRule(item_ids=frozenset(blocked)))
    seen_at = np.array(sorted(int(item[1:]) for item in seen), dtype=np.int64)  # iN is at N
    result = CandidateFilter().filter(
        np.array(positions, dtype=np.int64), seen_at, excluded, at_least, artifacts(rules)
    )
    return result.kept.tolist(), result.removed


def test_removes_blocked_seen_and_excluded_and_says_how_many_of_each() -> None:
    kept, removed = _filter(
        [5, 4, 3, 2], seen={"i4"}, excluded={"i3", "i4"}, at_least=1, blocked={"i5"}
    )
    assert kept == [2]
    assert removed == {Removal.BLOCKED: 1, Removal.SEEN: 1, Removal.EXCLUDED: 1}


def test_keeps_order_when_nothing_is_removed() -> None:
    kept, removed = _filter([3, 1, 4], set(), set(), at_least=3, blocked=set())
    assert kept == [3, 1, 4]
    assert sum(removed.values()) == 0


def test_backfills_from_popular_items_that_are_neither_present_nor_unwanted() -> None:
    # Popular order is i0, i1, i2...; i0 is seen, i1 blocked (so never popular), i3 present.
    kept, _ = _filter([3, 5], seen={"i0", "i5"}, excluded=set(), at_least=3, blocked={"i1"})
    assert kept == [3, 2, 4]
