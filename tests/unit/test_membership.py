import numpy as np

from app.core.membership import member_mask, positions_of


def _mask(values: list[int], pool: list[int]) -> list[bool]:
    mask = member_mask(np.array(values, dtype=np.int64), np.array(pool, dtype=np.int64))
    return [bool(flag) for flag in mask]


def test_member_mask_matches_set_membership() -> None:
    assert _mask([5, 2, 9, 0, 7], [7, 0, 3, 5]) == [True, False, False, True, True]


def test_values_beyond_the_largest_in_the_pool_are_not_members() -> None:
    assert _mask([100, 3], [1, 3]) == [False, True]


def test_empty_pool_or_values() -> None:
    assert _mask([1, 2], []) == [False, False]
    assert _mask([], [1, 2]) == []


def test_positions_of_skips_ids_the_catalog_lacks() -> None:
    ids = np.array(["b", "d", "a", "c"])
    order = np.argsort(ids, kind="stable")
    found = positions_of(ids, order, ["c", "zz", "a", "0"])
    assert sorted(found.tolist()) == [2, 3]
    assert positions_of(ids, order, []).tolist() == []
