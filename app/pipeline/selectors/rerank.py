"""Rerank's selectors in the order they run, written once: the rules' values, the category
cap, diversity among what the cap kept, exploration's slots, the backfill from what the cap
set aside. Adding a rule is
a file beside this one and a line in SELECTORS."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.pipeline.selectors.backfill import SetAsideBackfill
from app.pipeline.selectors.boost import Boost
from app.pipeline.selectors.category_cap import CategoryCap
from app.pipeline.selectors.diversity import Diversity
from app.pipeline.selectors.explore import Explore
from app.pipeline.selectors.selecting import (
    Candidates,
    Exploring,
    Selection,
    Selector,
    run_selectors,
)
from app.release.rules import RerankRules
from app.world.schema import ScoreScale

SELECTORS: tuple[Selector, ...] = (
    Boost(),
    CategoryCap(),
    Diversity(),
    Explore(),
    SetAsideBackfill(),
)


def rerank(
    tie_keys: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float32],
    categories: npt.NDArray[np.int64],
    age_days: npt.NDArray[np.float32],
    rules: RerankRules,
    n_items: int,
    vectors: npt.NDArray[np.float32] | None = None,
    likes: npt.NDArray[np.float32] | None = None,
    scale: ScoreScale = "log_odds",
    explain: bool = False,
    with_viewed: npt.NDArray[np.float32] | None = None,
    exploring: Exploring | None = None,
) -> Selection:
    """Choose the top n_items candidates.

    Orders by score with ties broken by `tie_keys` ascending, so equal scores always come
    out in the same order; unscored candidates (NaN) come after every scored one, in input
    order. Then each selector in turn: the rules' boosts and like and viewed objectives
    (`with_viewed`: each candidate's closeness to the item an item page shows) value each score
    (`scale` says what the scores are: a multiplier multiplies a probability, and a log-odds
    score's odds), at most `max_per_category` of a category stay in the running, with
    `vectors` and a diversity relevance under 1 the answer is chosen again among those by
    maximal marginal relevance, `exploring` gives the answer's last slots to newcomers a
    bandit draws, and what the cap set aside fills the answer where the others cannot.
    """
    candidates = Candidates(
        tie_keys,
        scores,
        categories,
        age_days,
        rules,
        n_items,
        vectors,
        likes,
        scale,
        with_viewed,
        exploring,
    )
    return run_selectors(SELECTORS, candidates, explain)
