"""Recall's marks answer what the sorted search they replace answered, source after source."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.core.membership import member_mask
from app.pipeline.taken import Taken

positions = st.lists(st.integers(min_value=0, max_value=300), max_size=40).map(
    lambda values: np.array(values, dtype=np.int64)
)


@given(capacity=st.integers(min_value=0, max_value=200), sources=st.lists(positions, max_size=6))
def test_each_source_keeps_what_the_ones_before_lack_in_its_order(
    capacity: int, sources: list[np.ndarray]
) -> None:
    taken = Taken(capacity)
    so_far = np.empty(0, dtype=np.int64)
    for found in sources:
        expected = found[~member_mask(found, so_far)]
        assert taken.fresh(found).tolist() == expected.tolist()
        assert taken.lacks(found).tolist() == (~member_mask(found, so_far)).tolist()
        taken.add(expected)
        so_far = np.concatenate([so_far, expected])
        assert taken.positions.tolist() == so_far.tolist()
        assert len(taken) == len(so_far)


def test_a_position_past_the_capacity_is_marked_not_wrapped() -> None:
    taken = Taken.holding(np.array([3, 250], dtype=np.int64), capacity=10)
    assert taken.fresh(np.array([250, 251, 3, 4], dtype=np.int64)).tolist() == [251, 4]
