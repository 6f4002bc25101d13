"""Item-to-item neighbours from what users did: cosine over co-occurrence, top k per item.

Two items are close when the same users chose both: C = XᵀX over the binary user-item matrix
of positives, divided by sqrt(nᵢ·nⱼ) plus a shrink term, so a pair seen together once among
few users does not outrank one seen together often. Each user's latest HISTORY positives
count, which bounds the pairs a long history adds (their square). The service recalls and
pre-ranks with the result (app.world.neighbours); the build's item-to-item baseline scores
with it too.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from app.world.neighbours import Neighbours
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray

NEIGHBOURS_K = 50
HISTORY = 100
SHRINK = 10.0


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
) -> Neighbours:
    """Each item's `k` closest items (fewer where it co-occurs with fewer; -1 pads)."""
    users, items = _latest(user, item, history)
    matrix = sp.csr_matrix(
        (np.ones(len(users), dtype=np.float32), (users, items)), shape=(n_users, n_items)
    )
    together = (matrix.T @ matrix).tocsr()
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


def positive_neighbours(part: InteractionLog) -> Neighbours:
    """The item-to-item neighbours of the part's positives."""
    return item_neighbours(
        part.user[part.positive], part.item[part.positive], part.n_users, part.n_items
    )
