"""EASE, the strong item-to-item baseline the served answers are held against.

Steck's "Embarrassingly Shallow Autoencoders" (2019): B = I - P / diag(P) with
P = (XᵀX + λI)⁻¹ over the binary user-item matrix of positives, the diagonal zeroed; a user's
scores are x·B. It needs the dense item-by-item inverse, so it is for catalogs of some
thousands of items: a baseline for benchmarks, never served. λ is chosen on the earlier
part's own split in time, as the world build chooses its settings, not on what is judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from recsys_tools.live_evaluation import questions
from recsys_tools.world.judge.split import later_rows
from recsys_tools.world.read.log import InteractionLog

FloatArray = npt.NDArray[np.float64]
LAMBDAS = (50.0, 100.0, 200.0, 400.0, 800.0)
# EASE at its best: λ over a wider range, and either input, chosen on the judged part itself.
UPPER_LAMBDAS = (20.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1000.0)
INPUTS = ("positives", "every_row")
K = 10


@dataclass(frozen=True, slots=True)
class Ease:
    items: dict[str, int]  # item id -> column
    ids: list[str]
    weights: FloatArray  # B
    popularity: npt.NDArray[np.int64]  # positives per column
    every_row: bool = False  # learnt from every row, not the positives only: asked the same

    def top(
        self, liked: Iterable[str], seen: set[str], k: int = K, popular: bool = False
    ) -> list[str]:
        """The k best unseen items for a user who liked `liked`; the most popular ones for
        a user without any, or for everyone with `popular` (the popularity baseline)."""
        columns = [self.items[item] for item in liked if item in self.items]
        if columns and not popular:
            scores = self.weights[columns].sum(axis=0)
        else:
            scores = self.popularity.astype(np.float64)
        order = np.argsort(-scores, kind="stable")
        chosen: list[str] = []
        for column in order.tolist():
            if self.ids[column] not in seen:
                chosen.append(self.ids[column])
                if len(chosen) == k:
                    break
        return chosen


def fit(log: InteractionLog, lam: float, every_row: bool = False) -> Ease:
    """EASE over the positives, or over every row (`every_row`: an item rated low was
    still chosen to be seen); the popularity baseline counts positives either way."""
    rows = np.ones(len(log.user), dtype=bool) if every_row else log.positive
    active = np.unique(log.item[rows])
    column = np.full(log.n_items, -1, dtype=np.int64)
    column[active] = np.arange(len(active))
    matrix = np.zeros((log.n_users, len(active)), dtype=np.float64)
    matrix[log.user[rows], column[log.item[rows]]] = 1.0
    gram = matrix.T @ matrix
    gram[np.diag_indices_from(gram)] += lam
    inverse = np.linalg.inv(gram)
    weights = -inverse / np.diag(inverse)
    np.fill_diagonal(weights, 0.0)
    ids = log.items.ids[active].tolist()
    # Users who liked each item (a pair counted once, as the binary matrix holds it).
    pairs = np.unique(log.user[log.positive] * log.n_items + log.item[log.positive])
    liked = np.bincount(column[pairs % log.n_items], minlength=len(active)).astype(np.int64)
    return Ease({item: k for k, item in enumerate(ids)}, ids, weights, liked, every_row)


def histories(log: InteractionLog) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Each user's positives (oldest first) and every item they touched."""
    liked: dict[str, list[str]] = {}
    seen: dict[str, set[str]] = {}
    users, items = log.user_ids[log.user].tolist(), log.items.ids[log.item].tolist()
    for user, item, positive in zip(users, items, log.positive.tolist(), strict=True):
        seen.setdefault(user, set()).add(item)
        if positive:
            liked.setdefault(user, []).append(item)
    return liked, seen


def recall_at_k(
    model: Ease, earlier: InteractionLog, later: InteractionLog, popular: bool = False
) -> float:
    """recall@K of each user's answer against their later positives they had not seen
    (`popular`: of the most popular unseen items instead)."""
    liked, seen = histories(earlier)
    asked: Mapping[str, Iterable[str]] = seen if model.every_row else liked
    figures = [
        len(set(model.top(asked.get(one.user, []), set(one.seen), popular=popular)) & one.relevant)
        / min(K, len(one.relevant))
        for one in questions(later, earlier)
    ]
    return float(np.mean(figures)) if figures else 0.0


def best_on_the_judged_part(earlier: InteractionLog, later: InteractionLog) -> dict[str, Any]:
    """EASE at its best on what is judged: λ (UPPER_LAMBDAS) and its input (INPUTS) chosen on
    the later part itself. Not a fair opponent (it has seen the answers' key), an upper bound
    of what EASE gets on this split: the anchor at its strongest."""
    figures = {
        f"{name} {lam:g}": round(
            recall_at_k(fit(earlier, lam, name == "every_row"), earlier, later), 4
        )
        for name in INPUTS
        for lam in UPPER_LAMBDAS
    }
    chosen = max(figures, key=lambda key: figures[key])
    return {f"recall@{K}": figures[chosen], "chosen": chosen, "tried": figures}


def chosen_lambda(
    earlier: InteractionLog, share: float, *, seed: int
) -> tuple[float, dict[str, float]]:
    """The λ of LAMBDAS that recalls best on the earlier part's own split (in time; drawn
    with `seed` in a log without times)."""
    later = later_rows(earlier, share, seed=seed)
    inner, judged = earlier.subset(~later), earlier.subset(later)
    figures = {f"{lam:g}": round(recall_at_k(fit(inner, lam), inner, judged), 4) for lam in LAMBDAS}
    best = max(LAMBDAS, key=lambda lam: figures[f"{lam:g}"])
    return best, figures


def replay(
    model: Ease, earlier: InteractionLog, rows: Sequence[tuple[str, str, bool]], events: bool
) -> float:
    """hit@K over the later positives in time order: before each, the user's answer; then,
    with `events`, the row joins their history (EASE folds a user in by their items alone)."""
    liked, seen = histories(earlier)
    hits = asked = 0
    for user, item, positive in rows:
        if positive:
            asked += 1
            hits += item in model.top(liked.get(user, []), seen.get(user, set()))
        if events:
            seen.setdefault(user, set()).add(item)
            if positive:
                liked.setdefault(user, []).append(item)
    return hits / asked if asked else 0.0
