import numpy as np

from app.pipeline.sources.popular import fresh_popular
from app.pipeline.taken import Taken


def _merge(found: list[int], popular: list[int], extra: int) -> list[int]:
    so_far = Taken.holding(np.array(found, dtype=np.int64))
    fresh = fresh_popular(so_far, np.array(popular, dtype=np.int64), extra)
    return [*found, *(int(position) for position in fresh)]


def test_popular_items_follow_ann_hits_without_duplicates() -> None:
    assert _merge([5, 2], [2, 7, 5, 1, 9], extra=2) == [5, 2, 7, 1]


def test_no_extra_keeps_ann_hits() -> None:
    assert _merge([5, 2], [1, 3], extra=0) == [5, 2]


def test_cold_catalog_fill_from_popular_only() -> None:
    assert _merge([], [4, 3, 2], extra=5) == [4, 3, 2]
