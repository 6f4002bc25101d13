"""What rerank's selectors share: the candidates and the rules, the order they work on, the
shape of a selector, and the runner that applies them in turn and says, for each candidate
the model put in the answer and rerank left out, which selector left it out.

A selector takes the order so far and returns a new one: the candidates still in the running,
best first, and those it set aside. The first (boost) puts the candidates in order; the
others keep it. It never guesses for another: the runner compares the
first `n_items` before and after each selector, so the reason an item was left out is the
selector that last pushed it past the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Indices, Scores
from app.release.rules import ExploreRule, RerankRules
from app.world.schema import ScoreScale

NONE: Indices = np.empty(0, dtype=np.intp)


@dataclass(frozen=True, slots=True)
class Candidates:
    """The scored candidates as rerank sees them; every array is one entry a candidate."""

    tie_keys: npt.NDArray[np.int64]  # equal scores come out in this key's order, ascending
    scores: Scores  # the model's; NaN: not scored (a degraded answer's backfill)
    categories: npt.NDArray[np.int64]
    age_days: npt.NDArray[np.float32]
    rules: RerankRules
    n_items: int
    vectors: npt.NDArray[np.float32] | None = None  # for diversity
    likes: npt.NDArray[np.float32] | None = None  # the model's like head
    scale: ScoreScale = "log_odds"
    # On an item page: each one's closeness to the item shown, its similarity as a share of
    # the closest neighbour's (1 for that one, 0 off the item's neighbours); None: a feed.
    with_viewed: npt.NDArray[np.float32] | None = None
    exploring: Exploring | None = None  # None: nothing to explore


@dataclass(frozen=True, slots=True)
class Exploring:
    """What exploration reads, one entry a candidate: whether it is a newcomer still to be
    explored, its showings and positives so far; the page's rule and this request's draw."""

    newcomer: npt.NDArray[np.bool_]
    shown: npt.NDArray[np.float64]
    chosen: npt.NDArray[np.float64]
    rule: ExploreRule
    draw: np.random.Generator


@dataclass(frozen=True, slots=True)
class Selecting:
    """Indices into the candidates: those in the running, best first, and those set aside
    (which may yet fill the answer), with every candidate's score as rerank values it."""

    order: Indices
    final: Scores
    aside: Indices = field(default_factory=lambda: NONE)
    explored: Indices = field(default_factory=lambda: NONE)  # put in the answer to explore


class Selector(Protocol):
    @property
    def reason(self) -> str:
        """Why an item this selector pushes past the answer is not served."""
        ...

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting: ...


@dataclass(frozen=True, slots=True)
class Selection:
    """Positions into the candidate arrays, best first, and their final scores; and for the
    candidates a selector pushed past the answer, which one (a reason by index)."""

    positions: Indices
    scores: Scores
    left_out: dict[int, str] = field(default_factory=dict)
    explored: Indices = field(default_factory=lambda: NONE)


def best_first(candidates: Indices, final: Scores, tie_keys: npt.NDArray[np.int64]) -> Indices:
    """`candidates` by score, best first, ties by `tie_keys`; unscored (NaN) ones after, in
    the order given."""
    values = final[candidates]
    missing = np.isnan(values)
    if not missing.any():
        whole: Indices = candidates[np.lexsort((tie_keys[candidates], -values))]
        return whole
    scored, unscored = candidates[~missing], candidates[missing]
    order: Indices = scored[np.lexsort((tie_keys[scored], -final[scored]))]
    return np.concatenate([order, unscored])


def run_selectors(
    selectors: Sequence[Selector], candidates: Candidates, explain: bool = False
) -> Selection:
    """The answer: the first n_items after every selector. The first selector orders (the
    candidates come to it in input order, so the list is sorted once, by the score it
    values). With `explain`, why each item in the model's own first n_items that is not
    served was left out."""
    n = candidates.n_items
    scores = candidates.scores
    everyone = np.arange(len(scores), dtype=np.intp)
    selecting = Selecting(everyone, scores)
    out_by: dict[int, str] = {}
    # Only a traced request pays for the model's own order, to compare against.
    before = best_first(everyone, scores, candidates.tie_keys)[:n] if explain else NONE
    for selector in selectors:
        selecting = selector.select(selecting, candidates)
        if explain:
            after = selecting.order[:n]
            _note(out_by, before, after, selector.reason)
            before = after
    chosen = selecting.order[:n]
    return Selection(chosen, selecting.final[chosen], out_by, selecting.explored)


def _note(out_by: dict[int, str], before: Indices, after: Indices, reason: str) -> None:
    """Who left the answer through this selector, and who came back into it."""
    for j in np.setdiff1d(before, after).tolist():
        out_by[int(j)] = reason
    for j in after.tolist():
        out_by.pop(int(j), None)
