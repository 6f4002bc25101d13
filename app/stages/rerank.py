"""Stage `rerank`: the business rules applied to the scored candidates."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import numpy as np
import numpy.typing as npt

from app.context import RequestContext
from app.rules import rerank
from app.stages.types import RankedItem

SECONDS_PER_DAY = 86_400.0


class Reranker:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    def select(
        self,
        positions: npt.NDArray[np.int64],
        scores: npt.NDArray[np.float32],
        unwanted: Collection[str],
        n_items: int,
        ctx: RequestContext,
    ) -> list[RankedItem]:
        """The top n_items after dropping `unwanted` ids, boosting and capping."""
        catalog, rules = ctx.artifacts.catalog, ctx.artifacts.rules
        dropped = (
            np.isin(catalog.item_ids[positions], np.array(list(unwanted), dtype=np.str_))
            if unwanted
            else np.zeros(len(positions), dtype=bool)
        )
        age_days = ((self._clock() - catalog.published_at[positions]) / SECONDS_PER_DAY).astype(
            np.float32
        )
        selection = rerank(
            tie_keys=positions,
            scores=scores,
            categories=catalog.categories[positions],
            age_days=age_days,
            dropped=dropped,
            rules=rules,
            n_items=n_items,
        )
        # Only the chosen few become Python strings.
        chosen_ids: list[str] = catalog.item_ids[positions[selection.positions]].tolist()
        return [
            RankedItem(item_id, score)
            for item_id, score in zip(chosen_ids, selection.scores.tolist(), strict=True)
        ]
