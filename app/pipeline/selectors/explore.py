"""Selector `explore`: the answer's last slots may go to newcomers the ranking left out.

A newcomer is an item added while serving that has been shown fewer than `max_shown` times.
Among those the ranker scored but left past the answer (the best-scored 8 a slot), each
draws a rate from its Beta posterior (the rule's prior, then its own showings and
positives: Thompson sampling), and the highest draws take the last `slots` of the answer.
An item no one has seen yet draws near the prior's rate; one shown often without a positive
draws low and stops being picked; one that earns positives is picked more, and soon ranks
in on its own. Capped items are not explored past the cap: exploration runs after the cap
and diversity, among what they kept."""

from __future__ import annotations

import numpy as np

from app.pipeline.selectors.selecting import Candidates, Selecting

# Newcomers that draw, per exploration slot: the best-scored of those left out.
DRAWN_PER_SLOT = 8


class Explore:
    reason = "made room for a newcomer ([explore])"

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting:
        exploring = candidates.exploring
        n = candidates.n_items
        order = selecting.order
        if exploring is None or exploring.rule.slots == 0 or len(order) <= n:
            return selecting
        # The newcomers the ranker scored, by their place in the order: those past the answer.
        eligible = np.flatnonzero(exploring.newcomer & ~np.isnan(candidates.scores))
        place = np.full(len(candidates.scores), -1, dtype=np.int64)
        place[order] = np.arange(len(order))
        places = np.sort(place[eligible])
        places = places[places >= n]
        if not len(places):
            return selecting
        rule = exploring.rule
        # The best-scored of them draw: a newcomer the ranker puts far down is not explored
        # (and a request draws a few numbers, not one per newcomer in the pool).
        places = places[: DRAWN_PER_SLOT * rule.slots]
        waiting = order[places]
        slots = min(rule.slots, len(waiting), n)
        chosen = exploring.chosen[waiting]
        unchosen = np.maximum(exploring.shown[waiting] - chosen, 0.0)
        drawn = exploring.draw.beta(
            rule.prior_rate * rule.prior_weight + chosen,
            (1.0 - rule.prior_rate) * rule.prior_weight + unchosen,
        )
        best = np.argsort(-drawn, kind="stable")[:slots]
        picked = waiting[best]
        kept = n - slots
        left = np.delete(order, places[best])
        order = np.concatenate([left[:kept], picked, left[kept:]])
        return Selecting(order, selecting.final, selecting.aside, picked)
