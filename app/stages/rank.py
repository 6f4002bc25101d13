"""Stage `rank`: model scores from Triton, or recall order when Triton cannot answer."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.clients.ranking_model import RankingModelClient
from app.context import RequestContext
from app.errors import RankingModelError


def recall_order_scores(n_items: int) -> npt.NDArray[np.float32]:
    """Descending scores in (0, 1] that keep recall order, for answers ranked without a model."""
    return (1.0 - np.arange(n_items, dtype=np.float32) / max(n_items, 1)).astype(np.float32)


class Scorer:
    """Scores packed rows, keeping their order; falls back instead of failing."""

    def __init__(self, model: RankingModelClient) -> None:
        self._model = model

    async def score(
        self, rows: npt.NDArray[np.float32] | None, n_items: int, ctx: RequestContext
    ) -> npt.NDArray[np.float32]:
        """One score per row; rows is None when fetch already fell back."""
        if rows is None:
            return recall_order_scores(n_items)
        try:
            return await self._model.score(rows, ctx.artifacts.model, ctx.remaining_s())
        except RankingModelError as exc:
            ctx.degrade("rank", exc.kind)
            return recall_order_scores(n_items)
