"""Item-to-item neighbours from what users did, top k per item, by one of two models.

Both start from C = XᵀX over the binary user-item matrix of positives, each user's latest
HISTORY positives counting (which bounds the pairs a long history adds: their square).

- cosine (the default): two items are close when the same users chose both, C divided by
  sqrt(nᵢ·nⱼ) plus a shrink term, so a pair seen together once among few users does not
  outrank one seen together often.
- ease: EASE's item weights (Steck, "Embarrassingly Shallow Autoencoders", 2019),
  B = -P / diag(P) with P = (C + λI)⁻¹: how much having chosen i says of j once every
  other item the user chose is accounted for. It inverts a matrix of the items it fits
  squared, so it fits at most NeighbourModel.max_items of them. Past that it fits the items
  chosen by the most users (counting each user's latest HISTORY positives, in the part it
  learns from): a rarely chosen item's list says little. The rest have no neighbours and
  are no item's neighbour; the report counts the items with neighbours.

The service recalls and pre-ranks with the result (app.world.neighbours); the build's
item-to-item baseline scores with it too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.sparse as sp

from app.core.errors import ConfigError
from app.world.neighbours import Neighbours
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray

log = logging.getLogger("recsys.build")
NEIGHBOURS_K = 50
HISTORY = 100
SHRINK = 10.0
EASE_LAMBDA = 200.0
# The items EASE fits at most by default. The matrix is inverted in place, EASE_BYTES an
# item squared (0.8 GB at 10,000), and its arithmetic grows as the cube, three fits a build
# (the train part, its early part, all).
EASE_MAX_ITEMS = 10_000
# What --ease-max-items may be: at the top, 12.8 GB.
EASE_ITEM_RANGE = (2, 40_000)
EASE_BYTES = 8
# What --ease-lambda may be: below it the matrix may be singular, past it every weight is 0.
EASE_LAMBDAS = (1e-3, 1e6)


@dataclass(frozen=True, slots=True)
class NeighbourModel:
    """Which model scores the neighbours, and EASE's λ and the most items it fits."""

    kind: Literal["cosine", "ease"] = "cosine"
    lam: float = EASE_LAMBDA
    max_items: int = EASE_MAX_ITEMS

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "ease"):
            raise ConfigError(f"neighbours are scored by cosine or ease, not {self.kind!r}")
        low, high = EASE_LAMBDAS
        if not low <= self.lam <= high:
            raise ConfigError(f"EASE's lambda is {self.lam:g}: give one from {low:g} to {high:g}")
        fewest, most = EASE_ITEM_RANGE
        if type(self.max_items) is not int or not fewest <= self.max_items <= most:
            raise ConfigError(
                f"EASE fits at most {self.max_items!r:.40} items: give a whole number from "
                f"{fewest:,} to {most:,}"
            )


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
        return ease_neighbours(together, np.bincount(items, minlength=n_items), model, k)
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


def ease_neighbours(
    together: sp.csr_matrix, chosen_by: IntArray, model: NeighbourModel, k: int
) -> Neighbours:
    """Each item's `k` largest positive weights in EASE's B over the items `ease_items`
    keeps, ties to the lower index: from the co-occurrence counts `together` (items by
    items, its diagonal unread) and `chosen_by`, each item's users, counted exactly (float32
    sums stop counting at 2^24). Both engines call it on the same counts, so they pick the
    same neighbours."""
    n_items = together.shape[0]
    active = ease_items(chosen_by, model.max_items)
    if len(active) < np.count_nonzero(chosen_by):
        log.info(
            "EASE fits the %s items most users chose of %s (--ease-max-items): the rest have "
            "no neighbours",
            f"{len(active):,}",
            f"{np.count_nonzero(chosen_by):,}",
        )
    weights = _ease_weights(together[active][:, active], chosen_by[active], model)
    positions = np.full((n_items, k), -1, dtype=np.int32)
    similarity = np.zeros((n_items, k), dtype=np.float32)
    depth = min(k, len(active) - 1)
    for row, item in enumerate(active.tolist()):
        chosen = largest_weights(weights[row], depth)
        positions[item, : len(chosen)] = active[chosen]
        similarity[item, : len(chosen)] = weights[row, chosen]
    return Neighbours(positions, similarity)


def ease_items(chosen_by: IntArray, most: int) -> IntArray:
    """The items EASE fits, in index order: those chosen at all (`chosen_by`, users per
    item), and past `most` of them the `most` chosen by the most users, ties to the lower
    index."""
    chosen = np.flatnonzero(chosen_by > 0)
    if len(chosen) <= most:
        return chosen
    ranked = chosen[np.lexsort((chosen, -chosen_by[chosen]))]
    kept: IntArray = np.sort(ranked[:most])
    return kept


def _ease_weights(
    pairs: sp.csr_matrix, own: IntArray, model: NeighbourModel
) -> npt.NDArray[np.float64]:
    """B[i, j], what choosing i says of j, the diagonal -inf (never a neighbour), from the
    pairs' counts and each item's `own`. One n-by-n array: the gram is written in Fortran
    order so that LAPACK inverts it in place (by Cholesky: it is positive definite)."""
    n = len(own)
    try:
        gram = pairs.astype(np.float64).toarray(order="F")
        gram[np.diag_indices(n)] = own.astype(np.float64) + model.lam
        inverse = scipy.linalg.inv(gram, overwrite_a=True, check_finite=False, assume_a="pos")
    except MemoryError:
        raise ConfigError(
            f"EASE over {n:,} items needs about {ease_bytes(n) / 2**30:.1f} GiB more memory "
            "than this process could have: lower --ease-max-items"
        ) from None
    except np.linalg.LinAlgError:
        raise ConfigError(
            f"EASE's matrix is singular at --ease-lambda {model.lam:g}: give a larger one"
        ) from None
    del gram
    # P is symmetric: its transpose is the same matrix, in the C order rows are read in.
    weights: npt.NDArray[np.float64] = inverse.T
    weights /= -np.diag(weights)
    np.fill_diagonal(weights, -np.inf)
    return weights


def ease_bytes(items: int) -> int:
    """What fitting EASE over `items` items holds at its peak, its one n-by-n array."""
    return EASE_BYTES * items * items


def check_ease_memory(items: int, model: NeighbourModel, limit: tuple[int, str] | None) -> None:
    """Refuse, before anything is learnt, an EASE (`model`) that cannot fit under this
    process's own memory `limit` (capacity.memory_limit): `items` are those with positives."""
    if limit is None:
        return
    need = ease_bytes(min(items, model.max_items))
    if need > limit[0]:
        raise ConfigError(
            f"EASE over {min(items, model.max_items):,} items needs about "
            f"{need / 2**30:.1f} GiB, more than {limit[1]} ({limit[0] / 2**30:.1f} GiB): "
            "lower --ease-max-items"
        )


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


def positive_neighbours(part: InteractionLog, model: NeighbourModel = COSINE) -> Neighbours:
    """The item-to-item neighbours of the part's positives."""
    return item_neighbours(
        part.user[part.positive],
        part.item[part.positive],
        part.n_users,
        part.n_items,
        model=model,
    )
