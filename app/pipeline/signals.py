"""The pre-rank signals of candidates, computed in process: the service's pre-rank stage and
the world build's evaluation and fit call the same code, so the weights fitted offline are
applied to the very numbers they were fitted on."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions
from app.world.neighbours import Nearby
from app.world.order import NO_TASTE, Taste
from app.world.prerank import PrerankWeights
from app.world.schema import FeatureSchema

SIGNALS = ("user", "similar", "recent", "recent_max", "recent_mean", "recent_category", "order")
# Pre-rank weighs the first three and `order`, the order model's score (app.world.order), 0
# where the world has none: PrerankWeights' fields. The others are for the ranking model's
# sequence block only: the candidate's best and mean likeness to the latest positives
# (unweighted), and the recency-weighted share of them in its category.
WEIGHED = 3
ORDER = SIGNALS.index("order")


def scores_at(
    positions: Positions, scored: Positions, scores: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Each of `positions`' score among (`scored`, `scores`), 0 where it has none."""
    found = np.zeros(len(positions), dtype=np.float32)
    if not len(scored) or not len(positions):
        return found
    order = np.argsort(scored)
    at = np.minimum(np.searchsorted(scored, positions, sorter=order), len(scored) - 1)
    hit = scored[order[at]] == positions
    found[hit] = scores[order[at[hit]]]
    return found


def prerank_signals(
    positions: Positions,
    user_vector: npt.NDArray[np.float32],
    recent: Positions,
    vectors: npt.NDArray[np.float32],
    nearby: Nearby,
    decay: float,
    categories: npt.NDArray[np.int64] | None = None,
    weighed_only: bool = False,
    taste: Taste = NO_TASTE,
) -> npt.NDArray[np.float32]:
    """One row per candidate, one column per signal in SIGNALS' order; `nearby` is what the
    world's neighbours say is near `recent` (Neighbours.around, with the same decay);
    `categories`, each catalog item's category code (None: that column stays 0); `taste`,
    what the order model makes of `recent` (OrderModel.taste).
    `weighed_only`: only pre-rank's columns (the first WEIGHED and ORDER) are filled
    (pre-rank over the whole pool needs no more; the pack stage computes the rest for the
    rows it keeps)."""
    signals = np.zeros((len(positions), len(SIGNALS)), dtype=np.float32)
    if not len(positions):
        return signals
    candidate = vectors[positions]
    signals[:, 0] = candidate @ user_vector.astype(np.float32)
    if not len(recent):
        return signals
    signals[:, 1] = scores_at(positions, nearby.items, nearby.scores)
    latest = vectors[recent]
    weights = decay ** np.arange(len(recent) - 1, -1, -1, dtype=np.float32)
    mean_latest = (weights @ latest) / weights.sum()
    signals[:, 2] = candidate @ mean_latest
    if taste.state.size:  # without a taste the column stays 0: no pass over the pool
        signals[:, ORDER] = taste.scores(positions)
    if weighed_only:
        return signals
    each = candidate @ latest.T  # [candidates, latest positives]
    signals[:, 3] = each.max(axis=1)
    signals[:, 4] = each.mean(axis=1)
    if categories is not None:
        same = categories[positions][:, None] == categories[recent][None, :]
        signals[:, 5] = (same @ weights) / weights.sum()
    return signals


def sequence_columns(
    schema: FeatureSchema, signals: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """The schema's sequence block from the signals: the columns it names, in its order."""
    picked: npt.NDArray[np.float32] = signals[:, [SIGNALS.index(name) for name in schema.sequence]]
    return picked


def prerank_scores(
    signals: npt.NDArray[np.float32], weights: PrerankWeights
) -> npt.NDArray[np.float32]:
    vector = np.array([weights.user, weights.similar, weights.recent], dtype=np.float32)
    scores: npt.NDArray[np.float32] = signals[:, :WEIGHED] @ vector
    if weights.order:  # a world without the order model sums its three as before, no copy
        scores += np.float32(weights.order) * signals[:, ORDER]
    return scores


def best(scores: npt.NDArray[np.float32], keep: int) -> npt.NDArray[np.intp]:
    """Indices of the `keep` highest scores, highest first."""
    if keep >= len(scores):
        return np.argsort(-scores, kind="stable")
    top = np.argpartition(-scores, keep - 1)[:keep]
    ordered: npt.NDArray[np.intp] = top[np.argsort(-scores[top], kind="stable")]
    return ordered
