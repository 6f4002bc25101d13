"""Item-to-item neighbours from what users did, top k per item, by one of two models.

Both start from C = XᵀX over the binary user-item matrix of positives, each user's latest
HISTORY positives counting (which bounds the pairs a long history adds: their square).

- cosine (the default): two items are close when the same users chose both, C divided by
  sqrt(nᵢ·nⱼ) plus a shrink term, so a pair seen together once among few users does not
  outrank one seen together often.
- ease: EASE's item weights (Steck, "Embarrassingly Shallow Autoencoders", 2019),
  B = -P / diag(P) with P = (C + λI)⁻¹: how much having chosen i says of j once every
  other item the user chose is accounted for. It inverts a matrix of the items with
  positives squared, so it has a ceiling (NeighbourModel.max_items) and refuses past it.

The service recalls and pre-ranks with the result (app.world.neighbours); the build's
item-to-item baseline scores with it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from app.core.errors import ConfigError
from app.world.neighbours import Neighbours
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray

NEIGHBOURS_K = 50
HISTORY = 100
SHRINK = 10.0
EASE_LAMBDA = 200.0
# The items with positives EASE inverts at most: 8 bytes an item squared, about four times
# over while inverting (3.2 GB at 10,000), and a cube's arithmetic (about a minute on 2
# cores, three times a build: the train part, its early part, all).
EASE_MAX_ITEMS = 10_000
# What --ease-lambda may be: below it the matrix may be singular, past it every weight is 0.
EASE_LAMBDAS = (1e-3, 1e6)


@dataclass(frozen=True, slots=True)
class NeighbourModel:
    """Which model scores the neighbours, and EASE's λ and ceiling."""

    kind: Literal["cosine", "ease"] = "cosine"
    lam: float = EASE_LAMBDA
    max_items: int = EASE_MAX_ITEMS

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "ease"):
            raise ConfigError(f"neighbours are scored by cosine or ease, not {self.kind!r}")
        low, high = EASE_LAMBDAS
        if not low <= self.lam <= high:
            raise ConfigError(f"EASE's lambda is {self.lam:g}: give one from {low:g} to {high:g}")


COSINE = NeighbourModel()


def _latest(user: IntArray, item: IntArray, history: int) -> tuple[IntArray, IntArray]:
    """Distinct (user, item) pairs, each user's latest `history` (rows by user, then time)."""
    if not len(user):
        return user, item
    keys = user * (int(item.max()) + 1) + item
    _, from_end = np.unique(keys[::-1], return_index=True)
    rows = np.sort(len(keys) - 1 - from_end)  # each pair's latest row, in the log's order
    users = user[rows]
    after = np.searchsorted(users, users, side="right") - np.arange(len(rows)) - 1
    keep = after < history
    return users[keep], item[rows][keep]


def item_neighbours(
    user: IntArray,
    item: IntArray,
    n_users: int,
    n_items: int,
    k: int = NEIGHBOURS_K,
    history: int = HISTORY,
    model: NeighbourModel = COSINE,
) -> Neighbours:
    """Each item's `k` closest items (fewer where it co-occurs with fewer; -1 pads)."""
    users, items = _latest(user, item, history)
    matrix = sp.csr_matrix(
        (np.ones(len(users), dtype=np.float32), (users, items)), shape=(n_users, n_items)
    )
    together = (matrix.T @ matrix).tocsr()
    if model.kind == "ease":
        return ease_neighbours(together, model, k)
    together.setdiag(0)
    together.eliminate_zeros()
    norms = np.sqrt(np.asarray(matrix.sum(axis=0)).ravel())
    positions = np.full((n_items, k), -1, dtype=np.int32)
    similarity = np.zeros((n_items, k), dtype=np.float32)
    indptr, indices, counts = together.indptr, together.indices, together.data
    for row in range(n_items):
        begin, end = indptr[row], indptr[row + 1]
        if begin == end:
            continue
        chosen, scores = closest(indices[begin:end], counts[begin:end], norms[row], norms, k)
        positions[row, : len(chosen)] = chosen
        similarity[row, : len(chosen)] = scores
    return Neighbours(positions, similarity)


def closest(
    others: npt.NDArray[np.int32],
    counts: npt.NDArray[np.float32],
    norm: np.float32,
    norms: npt.NDArray[np.float32],
    k: int,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """One item's `k` closest among the `others` it co-occurs with (`counts` times): cosine
    with SHRINK, in float32, ties to the lower index (`others` sorted). Both engines rank
    with it, so they pick the same neighbours."""
    scores = counts / (norm * norms[others] + SHRINK)
    top = np.argsort(-scores, kind="stable")[:k]
    return others[top], scores[top]


def ease_neighbours(together: sp.csr_matrix, model: NeighbourModel, k: int) -> Neighbours:
    """Each item's `k` largest positive weights in EASE's B, from the co-occurrence counts
    `together` (items by items, its diagonal each item's own count); ties to the lower
    index. Both engines call it on the same counts, so they pick the same neighbours."""
    n_items = together.shape[0]
    active = np.flatnonzero(together.diagonal() > 0)
    check_ease_fits(len(active), model)
    weights = _ease_weights(together[active][:, active].toarray(), model.lam)
    positions = np.full((n_items, k), -1, dtype=np.int32)
    similarity = np.zeros((n_items, k), dtype=np.float32)
    depth = min(k, len(active) - 1)
    for row, item in enumerate(active.tolist()):
        chosen = largest_weights(weights[row], depth)
        positions[item, : len(chosen)] = active[chosen]
        similarity[item, : len(chosen)] = weights[row, chosen]
    return Neighbours(positions, similarity)


def _ease_weights(counts: npt.NDArray[np.float32], lam: float) -> npt.NDArray[np.float64]:
    """B[i, j], what choosing i says of j, the diagonal -inf (never a neighbour). The gram is
    let go once inverted: at the ceiling each n-by-n float64 array is 0.8 GB."""
    gram = counts.astype(np.float64)
    gram[np.diag_indices_from(gram)] += lam
    try:
        weights = np.asarray(np.linalg.inv(gram), dtype=np.float64)
    except np.linalg.LinAlgError:
        raise ConfigError(
            f"EASE's matrix is singular at --ease-lambda {lam:g}: give a larger one"
        ) from None
    del gram
    weights /= -np.diag(weights)
    np.fill_diagonal(weights, -np.inf)
    return weights


def largest_weights(row: npt.NDArray[np.float64], depth: int) -> npt.NDArray[np.int64]:
    """The positions of the row's `depth` largest positive values, value down, index up:
    ties at the cut go to the lower index too (argpartition alone picks among them)."""
    if depth <= 0:
        return np.zeros(0, dtype=np.int64)
    cut = row[np.argpartition(-row, depth - 1)[depth - 1]]
    candidates = np.flatnonzero((row >= cut) & (row > 0))
    order = np.lexsort((candidates, -row[candidates]))
    chosen: npt.NDArray[np.int64] = candidates[order][:depth]
    return chosen


def check_ease_fits(items: int, model: NeighbourModel) -> None:
    if items > model.max_items:
        raise ConfigError(
            f"EASE's neighbours invert a matrix of the items with positives squared: "
            f"{items:,} items, past the ceiling of {model.max_items:,}; build with "
            "--neighbours cosine"
        )


def positive_neighbours(part: InteractionLog, model: NeighbourModel = COSINE) -> Neighbours:
    """The item-to-item neighbours of the part's positives."""
    return item_neighbours(
        part.user[part.positive],
        part.item[part.positive],
        part.n_users,
        part.n_items,
        model=model,
    )
