"""ALS's regularisation, chosen on the log's own split in time.

How much ALS should shrink its factors depends on the log: on the public movie-ratings sets
the best recall of the user·item product came at 30 on one and 10 to 20 on the other, and the
wrong one of those cost a tenth of it (0.05, the library's default, as much). So each build
factorises the earlier part of its own split (split_holdout, the shape the world is judged
on) at each value of GRID and measures how much of what the users went on to like the
product recalls (recall@10 of the unseen items, as the index would recall them).

A few hundred users make that figure noisy (a standard error of about 0.01 on the smaller
public set, more than the grid's neighbours differ by), and the world served is learnt on
more of the log than the part the choice is made on, where more shrinkage pays. So the
value kept is the largest within one standard error of the best (the one-standard-error
rule): on both public sets it is the one the later ratings favoured (30 and 20), where the
best alone picked 1 and 20.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from recsys_tools.world.judge.holdout import HoldoutSplit, split_holdout
from recsys_tools.world.learn.factorize import factorize
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray

GRID = (1.0, 3.0, 10.0, 20.0, 30.0, 40.0, 80.0)
# Enough users for the figures to tell the grid's points apart; a large log stays quick.
MAX_USERS = 2000
K = 10


@dataclass(frozen=True, slots=True)
class Choice:
    regularization: float
    recall: dict[str, float]  # recall@10 at each value tried
    standard_error: float = 0.0  # of the best figure


def _recall(
    users: npt.NDArray[np.float32],
    items: npt.NDArray[np.float32],
    holdout: HoldoutSplit,
    chosen: IntArray,
    seen: dict[int, IntArray],
) -> npt.NDArray[np.float64]:
    """Each chosen user's recall@10 of the product's unseen top."""
    figures = []
    for k in chosen.tolist():
        user = int(holdout.users[k])
        relevant = holdout.items[holdout.offsets[k] : holdout.offsets[k + 1]]
        scores = items @ users[user]
        scores[seen.get(user, relevant[:0])] = -np.inf
        top = np.argpartition(-scores, K)[:K] if len(scores) > K else np.arange(len(scores))
        figures.append(float(np.isin(top, relevant).sum()) / min(K, len(relevant)))
    return np.asarray(figures, dtype=np.float64)


def choose_regularization(part: InteractionLog, dim: int, seed: int, share: float) -> Choice:
    """The largest value of GRID whose factors, learnt on each user's past, recall what came
    after within a standard error of the best; the default where no one can judge."""
    holdout = split_holdout(part, share, seed=seed)
    if not len(holdout.users):
        return Choice(GRID[2], {})
    early = part.subset(holdout.train)
    chosen = np.arange(len(holdout.users))
    if len(chosen) > MAX_USERS:
        chosen = np.sort(np.random.default_rng(seed).choice(chosen, MAX_USERS, replace=False))
    order = np.argsort(early.user, kind="stable")
    bounds = np.searchsorted(early.user[order], np.arange(part.n_users + 1))
    seen = {
        int(user): early.item[order[bounds[user] : bounds[user + 1]]]
        for user in holdout.users[chosen].tolist()
    }
    per_user = {
        value: _recall(*_factors(early, dim, seed, value), holdout, chosen, seen) for value in GRID
    }
    means = {value: float(recalls.mean()) for value, recalls in per_user.items()}
    best = max(GRID, key=lambda value: means[value])
    error = float(per_user[best].std() / np.sqrt(len(per_user[best])))
    kept = max(value for value in GRID if means[value] >= means[best] - error)
    return Choice(kept, {f"{value:g}": round(means[value], 4) for value in GRID}, error)


def _factors(
    part: InteractionLog, dim: int, seed: int, value: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    factors = factorize(part, dim, seed, value)
    return factors.users, factors.items
