"""What recall's sources found so far in one request, marked per catalog position.

Each source keeps only what the ones before it lack. Asking that of a sorted copy of the
positions found so far (np.sort, then a binary search per value) costs a sort and a search
per source per request, about 5% of the API's CPU with two thousand candidates; a mark per
catalog position makes the question one gather and the answer one write per item found.

The marks are a byte per catalog row: zeroing a fresh array per request would cost in
proportion to the catalog (a quarter of a millisecond at five million rows), so a request
borrows an array from `Marks` and gives it back with only its own marks cleared, a cost in
proportion to what it found.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions

# Arrays kept for the next requests; more are made while more requests recall at once.
KEPT_FREE = 8


class Taken:
    """The positions found so far, in the order they were found, and a mark for each.

    Positions are catalog rows, never negative; one past the marks (an item added since
    they were sized) grows them."""

    __slots__ = ("_marks", "_parts", "_size")

    def __init__(self, marks: npt.NDArray[np.bool_]) -> None:
        self._marks = marks  # all False
        self._parts: list[Positions] = []
        self._size = 0

    @classmethod
    def holding(cls, positions: Positions, capacity: int = 0) -> Taken:
        taken = cls(np.zeros(max(capacity, 0), dtype=bool))
        taken.add(positions)
        return taken

    def __len__(self) -> int:
        return self._size

    def _cover(self, values: Positions) -> None:
        top = int(values.max()) + 1
        if top > len(self._marks):
            self._marks = np.concatenate([self._marks, np.zeros(top - len(self._marks), bool)])

    def lacks(self, values: Positions) -> npt.NDArray[np.bool_]:
        """For each of `values`, whether it was not found so far."""
        if len(values) == 0:
            return np.zeros(0, dtype=bool)
        self._cover(values)
        return ~self._marks[values]

    def fresh(self, values: Positions) -> Positions:
        """A copy of `values` without those found so far, in their order."""
        kept: Positions = values[self.lacks(values)]
        return kept

    def add(self, found: Positions) -> None:
        """Found by the latest source: after all found before, in its order."""
        if len(found) == 0:
            return
        self._cover(found)
        self._marks[found] = True
        self._parts.append(found)
        self._size += len(found)

    @property
    def positions(self) -> Positions:
        """Everything found so far, in order."""
        if len(self._parts) > 1:
            self._parts = [np.concatenate(self._parts)]
        return self._parts[0] if self._parts else np.empty(0, dtype=np.int64)

    def cleared(self) -> npt.NDArray[np.bool_]:
        """The marks, every one set by this request cleared again."""
        for part in self._parts:
            self._marks[part] = False
        return self._marks


class Marks:
    """Mark arrays for one worker's requests, lent for a recall and given back cleared."""

    def __init__(self) -> None:
        self._free: list[npt.NDArray[np.bool_]] = []

    @contextmanager
    def lent(self, rows: int) -> Iterator[Taken]:
        """A Taken over an array of at least `rows` marks, none set."""
        free = self._free
        try:  # pop, not a test first: the build's evaluation may recall on threads
            marks = free.pop()
        except IndexError:
            marks = np.zeros(rows, dtype=bool)
        if len(marks) < rows:  # the catalog grew (a reload): a larger array from now on
            marks = np.zeros(rows, dtype=bool)
        taken = Taken(marks)
        try:
            yield taken
        finally:
            if len(free) < KEPT_FREE:
                free.append(taken.cleared())
