"""Selector `category_cap`: at most `max_per_category` items of a category in the running;
the rest set aside, in order, for the backfill."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.pipeline.selectors.selecting import Candidates, Selecting


def rank_within_group(groups: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """For each element, how many earlier elements share its group (0 for the first)."""
    by_group = np.argsort(groups, kind="stable")
    sorted_groups = groups[by_group]
    starts = np.r_[True, sorted_groups[1:] != sorted_groups[:-1]]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(groups)), 0))
    ranks = np.empty(len(groups), dtype=np.intp)
    ranks[by_group] = np.arange(len(groups)) - group_start
    return ranks


class CategoryCap:
    reason = "the category cap ([diversity] max_per_category)"

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting:
        cap = candidates.rules.diversity.max_per_category
        if cap <= 0:
            return selecting
        order = selecting.order
        within = rank_within_group(candidates.categories[order]) < cap
        aside = np.concatenate([selecting.aside, order[~within]])
        return Selecting(order[within], selecting.final, aside)
