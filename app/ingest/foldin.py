"""A user's vector from their positives, in closed form: one implicit-ALS user step.

With item factors Y, confidences c_i for the user's items and regularisation lambda:
x = (Y^T Y + sum_i (c_i - 1) y_i y_i^T + lambda I)^-1 sum_i c_i y_i, where Y^T Y is over
every item and computed once. The same step the world build's ALS ends on, so a folded
vector lives in the space of the vectors it built.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions
from app.world.foldin import FoldInParams, Weighting, bm25

FloatArray = npt.NDArray[np.float32]


class FoldIn:
    def __init__(self, items: FloatArray, params: FoldInParams) -> None:
        # Held, not copied: rows of items added while serving are written into it later
        # (app.ingest.world). The gram is the world's: an added item's share is negligible.
        self._items = items
        self._params = params
        k = items.shape[1]
        whole = items.astype(np.float64)
        self._gram = whole.T @ whole + params.regularization * np.eye(k)

    def confidences(
        self, items: Positions, counts: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """The weight of each (distinct) item the user chose `counts` times."""
        params = self._params
        if params.weighting is Weighting.COUNT:
            return counts
        idf = params.idf[items].astype(np.float64)
        weights: npt.NDArray[np.float64] = bm25(
            counts, counts.sum(), params.average_length, idf, params.k1, params.b
        )
        return weights

    def vector(self, positives: Positions) -> FloatArray:
        """The user's vector from their positives (repeats count); zeros for none."""
        k = self._items.shape[1]
        if len(positives) == 0:
            return np.zeros(k, dtype=np.float32)
        items, counts = np.unique(positives, return_counts=True)
        confidence = self.confidences(items, counts.astype(np.float64))
        chosen = self._items[items].astype(np.float64)
        # As implicit does: a negative confidence (an idf below zero, for an item nearly
        # every user chose) weighs the fit by its size and adds nothing to the target.
        a = self._gram + (chosen.T * (np.abs(confidence) - 1.0)) @ chosen
        b = chosen.T @ np.maximum(confidence, 0.0)
        solved: FloatArray = np.linalg.solve(a, b).astype(np.float32)
        return solved
