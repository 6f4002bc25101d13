"""The pre-rank weights, fitted on pools as the service builds them.

For some users of the part being learnt, the service's pool is rebuilt from what was known
before their latest positives by the service's own candidate stages (recall's sources, the
filters and the backfill: judge/service_stages.py), each candidate's signals are computed
with the service's own code (app.pipeline.signals), and the weights chosen are those under
which pre-rank keeps the most of what the users went on to like: pre-rank's job is to keep,
the model's to order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.core.cascade import CANDIDATE_COUNT, PRERANK_KEEP
from app.pipeline.signals import ORDER, SIGNALS, best, prerank_scores, prerank_signals
from app.world.neighbours import Neighbours
from app.world.order import OrderModel, taste_of
from app.world.prerank import PrerankWeights
from recsys_tools.world.judge.served_view import DECAY, Recent, nearby
from recsys_tools.world.judge.service_stages import ServiceStages
from recsys_tools.world.read.tables import IntArray

FloatArray = npt.NDArray[np.float32]
KEEP: int = PRERANK_KEEP
K = 10
CANDIDATES: int = CANDIDATE_COUNT
# Weights of the other signals tried (the item-to-item ones, and the order model's), each
# against the user's vector's 1 (all scaled by their spread): none, a little, as much, more.
GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def _coverage(
    signals: list[FloatArray], labels: list[npt.NDArray[np.bool_]], weights: PrerankWeights
) -> tuple[float, float]:
    """Of the liked items in the pools, the share pre-rank would keep, and the share in its
    first K: what it hands the model, and what it would serve were the model down."""
    kept = first = total = 0.0
    for rows, liked in zip(signals, labels, strict=True):
        order = best(prerank_scores(rows, weights), len(rows))
        kept += float(liked[order[:KEEP]].sum())
        first += float(liked[order[:K]].sum())
        total += float(liked.sum())
    return (kept / total, first / total) if total else (0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Pools:
    """Some users' pools as the service would build them, each with its signals and which
    of its items the user went on to like (only users who liked something in theirs)."""

    users: IntArray
    pools: list[IntArray]
    signals: list[FloatArray]
    labels: list[npt.NDArray[np.bool_]]


def nearest(item_vectors: FloatArray, vector: FloatArray, seen: int) -> IntArray:
    """The items nearest `vector`, as deep as recall asks (its count, or more for a user who
    has seen many, as the evaluation searches): exact, where the service searches its index."""
    depth = min(len(item_vectors), max(CANDIDATES, seen + K))
    scores = item_vectors @ vector
    top = np.argpartition(-scores, depth - 1)[:depth]
    found: IntArray = top[np.argsort(-scores[top], kind="stable")].astype(np.int64)
    return found


def user_pools(
    users: IntArray,
    user_vectors: FloatArray,
    item_vectors: FloatArray,
    stages: ServiceStages,
    neighbours: Neighbours,
    recent: Recent,
    seen: IntArray,
    liked: IntArray,
    categories: IntArray,
    order: OrderModel | None = None,
) -> Pools:
    """Each user's pool as the service's own candidate stages build it (`stages`, over the
    world learnt from the early part), with its signals. `seen` and `liked` are sorted
    user * n_items + item keys (seen before the moment, liked after it)."""
    n_items = len(item_vectors)
    vectors = item_vectors.astype(np.float32)
    kept_users, pools, signals, labels = [], [], [], []
    for user in users.tolist():
        bounds = [user * n_items, (user + 1) * n_items]
        low, high = np.searchsorted(seen, bounds)
        had = seen[low:high] - user * n_items
        latest = recent.of(user)
        near = nearby(neighbours, latest)
        found = nearest(vectors, user_vectors[user], len(had))
        taste = taste_of(order, latest)
        pool, _ = stages.pools(found, user_vectors[user], had, latest, near, taste)
        # The user's own slice of the sorted keys: isin over all of them is a sort per user.
        first, last = np.searchsorted(liked, bounds)
        mine = np.isin(pool, liked[first:last] - user * n_items)
        if mine.any():
            kept_users.append(user)
            pools.append(pool)
            signals.append(
                prerank_signals(
                    pool, user_vectors[user], latest, vectors, near, DECAY, categories, taste=taste
                )
            )
            labels.append(mine)
    return Pools(np.asarray(kept_users, dtype=np.int64), pools, signals, labels)


def fit_prerank(pools: Pools) -> PrerankWeights:
    """The weights under which pre-rank keeps the most of what the users went on to like.

    A grid over the item-to-item signals' weights (the order model's too, where the pools
    have its scores), the user's vector's fixed at 1 (only the order matters), each signal
    scaled by its spread first. The grid holds the vector alone, so the choice never keeps
    less on these users than recall's own order does.
    """
    chosen = [k for k, pool in enumerate(pools.pools) if len(pool) > KEEP]
    if not chosen:
        return PrerankWeights()
    signals = [pools.signals[k] for k in chosen]
    labels = [pools.labels[k] for k in chosen]
    spread = np.concatenate(signals).std(axis=0)
    ordered = bool(spread[ORDER] > 0)
    spread[spread == 0] = 1.0

    def of(name: str) -> float:
        return float(spread[SIGNALS.index(name)])

    choices = weight_grid(
        of("user"),
        of("similar"),
        of("recent"),
        order=of("order"),
        # A world without the order model: its column is 0, its one step 0 (36 choices).
        order_steps=GRID if ordered else (0.0,),
    )
    return max(choices, key=lambda weights: _coverage(signals, labels, weights))


def weight_grid(
    user: float,
    similar: float,
    recent: float,
    similar_steps: tuple[float, ...] = GRID,
    recent_steps: tuple[float, ...] = GRID,
    order: float = 1.0,
    order_steps: tuple[float, ...] = (0.0,),
) -> list[PrerankWeights]:
    """The weights pre-rank's grid tries, given each signal's spread: the user's vector at 1,
    each other signal at each of its steps, all scaled by their spread (only the order
    matters). The blend's search for the first ten tries the same grid."""
    return [
        PrerankWeights(user=1.0 / user, similar=a / similar, recent=b / recent, order=c / order)
        for a in similar_steps
        for b in recent_steps
        for c in order_steps
    ]


@dataclass(frozen=True, slots=True)
class RankedLists:
    """What pre-rank hands the model for each user: the best `depth` of their pool, their
    signals and labels, row by row."""

    users: IntArray
    items: IntArray
    signals: FloatArray
    labels: npt.NDArray[np.int8]


def ranked_lists(pools: Pools, weights: PrerankWeights, depth: int) -> RankedLists:
    users, items, signals, labels = [], [], [], []
    for user, pool, rows, liked in zip(
        pools.users.tolist(), pools.pools, pools.signals, pools.labels, strict=True
    ):
        order = best(prerank_scores(rows, weights), min(depth, len(pool)))
        users.append(np.full(len(order), user, dtype=np.int64))
        items.append(pool[order])
        signals.append(rows[order])
        labels.append(liked[order].astype(np.int8))
    if not users:
        return RankedLists(
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            np.empty((0, len(SIGNALS)), np.float32),
            np.empty(0, np.int8),
        )
    return RankedLists(
        np.concatenate(users),
        np.concatenate(items),
        np.concatenate(signals),
        np.concatenate(labels),
    )
