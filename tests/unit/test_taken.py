"""Recall's marks answer what the sorted search they replace answered, source after source,
and are given back clean for the next request."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.core.membership import member_mask
from app.pipeline.taken import Marks, Taken

positions = st.lists(st.integers(min_value=0, max_value=300), max_size=40).map(
    lambda values: np.array(values, dtype=np.int64)
)
MARKS = Marks()  # shared by every example: what one leaves set, the next would see


@given(rows=st.integers(min_value=0, max_value=200), sources=st.lists(positions, max_size=6))
def test_each_source_keeps_what_the_ones_before_lack_in_its_order(
    rows: int, sources: list[np.ndarray]
) -> None:
    so_far = np.empty(0, dtype=np.int64)
    with MARKS.lent(rows) as taken:
        for found in sources:
            expected = found[~member_mask(found, so_far)]
            assert taken.fresh(found).tolist() == expected.tolist()
            assert taken.lacks(found).tolist() == (~member_mask(found, so_far)).tolist()
            taken.add(expected)
            so_far = np.concatenate([so_far, expected])
            assert taken.positions.tolist() == so_far.tolist()
            assert len(taken) == len(so_far)


def test_a_position_past_the_rows_is_marked_not_wrapped() -> None:
    taken = Taken.holding(np.array([3, 250], dtype=np.int64), capacity=10)
    assert taken.fresh(np.array([250, 251, 3, 4], dtype=np.int64)).tolist() == [251, 4]


def test_marks_are_given_back_clear_even_when_the_recall_is_cut_short() -> None:
    marks = Marks()
    try:
        with marks.lent(100) as taken:
            taken.add(np.array([5, 7, 150], dtype=np.int64))
            raise TimeoutError
    except TimeoutError:
        pass
    with marks.lent(100) as again:
        assert again.lacks(np.array([5, 7, 150], dtype=np.int64)).all()
    with marks.lent(1000) as larger:  # a reload grew the catalog: the marks grow too
        larger.add(np.array([999], dtype=np.int64))
        assert not larger.lacks(np.array([999], dtype=np.int64))[0]
