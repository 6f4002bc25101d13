"""EASE, the strong item-to-item baseline the served answers are held against.

Steck's "Embarrassingly Shallow Autoencoders" (2019): B = I - P / diag(P) with
P = (XᵀX + λI)⁻¹ over the binary user-item matrix of positives, the diagonal zeroed; a user's
scores are x·B. With fewer users than items (play-count sets: 1,892 users, 15,421 artists)
the same P comes from the users' side, P = (I - Xᵀ(XXᵀ + λI)⁻¹X) / λ (Woodbury), so the
inverse is users by users and B is never formed: x·B = x - x·P / diag(P), as exact. Either way
it inverts a matrix of the smaller side, so it is for sets where one side is some thousands:
a baseline for benchmarks, never served. λ is chosen on the earlier part's own split in time,
as the world build chooses its settings, not on what is judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from recsys_tools.live_evaluation import questions
from recsys_tools.world.judge.split import later_rows
from recsys_tools.world.read.log import InteractionLog

FloatArray = npt.NDArray[np.float64]
LAMBDAS = (50.0, 100.0, 200.0, 400.0, 800.0)
# EASE at its best: λ over a wider range, and either input, chosen on the judged part itself.
UPPER_LAMBDAS = (20.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1000.0)
INPUTS = ("positives", "every_row")
Side = Literal["users", "items"]
K = 10


class Scores(Protocol):
    def __call__(self, columns: Sequence[int]) -> FloatArray:
        """x·B for the user whose positives are `columns` (a column twice counts twice)."""
        ...

    def weighted(self, x: FloatArray) -> FloatArray:
        """x·B for any x over the columns (each positive weighed as x says)."""
        ...


@dataclass(frozen=True, slots=True)
class ItemSide:
    """B itself, items by items."""

    weights: FloatArray

    def __call__(self, columns: Sequence[int]) -> FloatArray:
        scores: FloatArray = self.weights[list(columns)].sum(axis=0)
        return scores

    def weighted(self, x: FloatArray) -> FloatArray:
        scores: FloatArray = x @ self.weights
        return scores


@dataclass(frozen=True, slots=True)
class UserSide:
    """B through the users' side: with M = `inverse` = (XXᵀ + λI)⁻¹, P = (I - XᵀMX) / λ, so
    `kept` = 1 - diag(XᵀMX) is λ·diag(P) and x·B = x - (x - XᵀM·Xx) / kept."""

    matrix: sp.csr_matrix  # X, users by items, binary
    inverse: FloatArray
    kept: FloatArray

    def __call__(self, columns: Sequence[int]) -> FloatArray:
        x = np.bincount(np.asarray(columns, dtype=np.int64), minlength=self.matrix.shape[1])
        return self.weighted(x.astype(np.float64))

    def weighted(self, x: FloatArray) -> FloatArray:
        through = self.matrix.T @ (self.inverse @ (self.matrix @ x))
        scores: FloatArray = x - (x - through) / self.kept
        return scores


@dataclass(frozen=True, slots=True)
class Ease:
    items: dict[str, int]  # item id -> column
    ids: list[str]
    scores: Scores
    popularity: npt.NDArray[np.int64]  # positives per column
    every_row: bool = False  # learnt from every row, not the positives only: asked the same

    def top(
        self, liked: Iterable[str], seen: set[str], k: int = K, popular: bool = False
    ) -> list[str]:
        """The k best unseen items for a user who liked `liked`; the most popular ones for
        a user without any, or for everyone with `popular` (the popularity baseline)."""
        columns = [self.items[item] for item in liked if item in self.items]
        if columns and not popular:
            scores = self.scores(columns)
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


def item_side(matrix: sp.csr_matrix, lam: float) -> ItemSide:
    # From the sparse product: a dense XᵀX of a wide X is where OpenBLAS's threaded syrk
    # crashes (numpy issue 19685; a segfault at 15,421 items here).
    gram = (matrix.T @ matrix).toarray()
    gram[np.diag_indices_from(gram)] += lam
    weights = np.linalg.inv(gram)
    weights /= -np.diag(weights)
    np.fill_diagonal(weights, 0.0)
    return ItemSide(weights)


def user_side(matrix: sp.csr_matrix, lam: float) -> UserSide:
    gram = (matrix @ matrix.T).toarray()
    gram[np.diag_indices_from(gram)] += lam
    inverse = np.linalg.inv(gram)
    # Items by users, dense (233 MB at 15,427 items and 1,892 users): diag(XᵀMX) in one product.
    through = np.asarray(matrix.T @ inverse)
    kept = 1.0 - np.asarray(matrix.T.multiply(through).sum(axis=1)).ravel()
    return UserSide(matrix, inverse, kept)


def fit(log: InteractionLog, lam: float, every_row: bool = False, side: Side | None = None) -> Ease:
    """EASE over the positives, or over every row (`every_row`: an item rated low was
    still chosen to be seen); the popularity baseline counts positives either way. B comes
    from the smaller side (`side` None), or the side asked for."""
    rows = np.ones(len(log.user), dtype=bool) if every_row else log.positive
    active = np.unique(log.item[rows])
    column = np.full(log.n_items, -1, dtype=np.int64)
    column[active] = np.arange(len(active))
    pairs = (log.user[rows], column[log.item[rows]])
    matrix = sp.csr_matrix(
        (np.ones(len(pairs[0])), pairs), shape=(log.n_users, len(active)), dtype=np.float64
    )
    matrix.sum_duplicates()
    matrix.data[:] = 1.0  # a pair twice in the log is still one 1
    if side is None:
        side = "users" if log.n_users < len(active) else "items"
    scores: Scores = user_side(matrix, lam) if side == "users" else item_side(matrix, lam)
    ids = log.items.ids[active].tolist()
    # Users who liked each item (a pair counted once, as the binary matrix holds it).
    liked_pairs = np.unique(log.user[log.positive] * log.n_items + log.item[log.positive])
    liked = np.bincount(column[liked_pairs % log.n_items], minlength=len(active)).astype(np.int64)
    return Ease({item: k for k, item in enumerate(ids)}, ids, scores, liked, every_row)


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
