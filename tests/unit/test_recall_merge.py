import numpy as np

from app.pipeline.sources.popular import merge_popular


def _merge(found: list[int], popular: list[int], extra: int) -> list[int]:
    merged = merge_popular(
        np.array(found, dtype=np.int64), np.array(popular, dtype=np.int64), extra
    )
    return [int(position) for position in merged]


def test_popular_items_follow_ann_hits_without_duplicates() -> None:
    assert _merge([5, 2], [2, 7, 5, 1, 9], extra=2) == [5, 2, 7, 1]


def test_no_extra_keeps_ann_hits() -> None:
    assert _merge([5, 2], [1, 3], extra=0) == [5, 2]


def test_cold_catalog_fill_from_popular_only() -> None:
    assert _merge([], [4, 3, 2], extra=5) == [4, 3, 2]
