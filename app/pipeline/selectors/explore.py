"""Selector `explore`: the answer's last slots may go to newcomers the ranking left out.

A newcomer is an item added while serving that has been shown fewer than `max_shown` times.
Among those the ranker scored but left past the answer, each draws a rate from its Beta
posterior (the rule's prior, then its own showings and positives: Thompson sampling), and
the highest draws take the last `slots` of the answer. An item no one has seen yet draws
near the prior's rate; one shown often without a positive draws low and stops being
picked; one that earns positives is picked more, and soon ranks in on its own. Capped items
are not explored past the cap: exploration runs after the cap and diversity, among what they
kept."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from app.pipeline.selectors.selecting import Candidates, Selecting


class Explore:
    reason = "made room for a newcomer ([explore])"

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting:
        exploring = candidates.exploring
        n = candidates.n_items
        order = selecting.order
        if exploring is None or exploring.rule.slots == 0 or len(order) <= n:
            return selecting
        head, rest = order[:n], order[n:]
        waiting = rest[exploring.newcomer[rest] & ~np.isnan(candidates.scores[rest])]
        if not len(waiting):
            return selecting
        rule = exploring.rule
        slots = min(rule.slots, len(waiting), n)
        chosen = exploring.chosen[waiting]
        unchosen = np.maximum(exploring.shown[waiting] - chosen, 0.0)
        drawn = exploring.draw.beta(
            rule.prior_rate * rule.prior_weight + chosen,
            (1.0 - rule.prior_rate) * rule.prior_weight + unchosen,
        )
        picked = waiting[np.argsort(-drawn, kind="stable")[:slots]]
        left = rest[~np.isin(rest, picked)]
        kept = n - slots
        order = np.concatenate([head[:kept], picked, head[kept:], left])
        return replace(selecting, order=order, explored=picked)
