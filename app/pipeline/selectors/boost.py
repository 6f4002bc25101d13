"""Selector `boost`: each score valued by the rules (the like objective, fresh-item boosts),
and the candidates put in order by it, best first: the first selector, it gives the others
their order."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Scores
from app.pipeline.selectors.selecting import Candidates, Selecting, best_first
from app.release.rules import RerankRules
from app.world.schema import ScoreScale


def log_factors(
    likes: npt.NDArray[np.float32] | None,
    age_days: npt.NDArray[np.float32],
    rules: RerankRules,
    with_viewed: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """The log of what the rules multiply each candidate by: the like head's value where the
    rules weigh it and the model gave it (a candidate without one, NaN, keeps 1), on an item
    page exp(viewed * its closeness to the item shown, a share of that item's closest
    neighbour's similarity), times every boost whose age window the item falls in."""
    factors = np.zeros(len(age_days), dtype=np.float64)
    if rules.objectives.viewed > 0 and with_viewed is not None:
        factors += rules.objectives.viewed * with_viewed
    weight = rules.objectives.like
    if weight > 0 and likes is not None:
        value = np.where(np.isnan(likes), 1.0, (1 - weight) + weight * likes)
        # A like probability of exactly 0 with a weight of 1 would be log(0): the item
        # falls to the bottom of the scored ones, not out of them.
        factors += np.log(np.maximum(value, np.finfo(np.float32).tiny))
    for boost in rules.boost:
        factors[age_days <= boost.max_age_days] += math.log(boost.multiplier)
    return factors.astype(np.float32)


def adjusted_scores(
    scores: npt.NDArray[np.float32],
    factors: npt.NDArray[np.float32],
    scale: ScoreScale,
) -> npt.NDArray[np.float32]:
    """The scores with the rules' factors applied: a log-odds score gains their log (the
    odds are multiplied, the order never saturates); a probability is multiplied."""
    if scale == "log_odds":
        return (scores + factors).astype(np.float32, copy=False)
    return (scores * np.exp(factors)).astype(np.float32, copy=False)


class Boost:
    reason = "valued below others by the rules ([boost], [objectives] like and viewed)"

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting:
        rules = candidates.rules
        final: Scores = selecting.final
        objectives = rules.objectives
        if (
            rules.boost
            or (objectives.like > 0 and candidates.likes is not None)
            or (objectives.viewed > 0 and candidates.with_viewed is not None)
        ):
            factors = log_factors(
                candidates.likes, candidates.age_days, rules, candidates.with_viewed
            )
            final = adjusted_scores(selecting.final, factors, candidates.scale)
        order = best_first(selecting.order, final, candidates.tie_keys)
        return Selecting(order, final, selecting.aside)
