"""The build's own holdout: each user's latest share of rows held out, cut as `recsys
split-log` cuts, and the items each evaluated user went on to like."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys_tools.world.judge.split import later_rows
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import BoolArray, IntArray


@dataclass(frozen=True, slots=True)
class HoldoutSplit:
    """Which log rows are for training, and each evaluated user's held-out items.

    User users[k]'s held-out items are items[offsets[k]:offsets[k + 1]]: distinct, none of
    them a training positive of theirs (the service would filter those as seen). moments[k]
    is when their holdout begins.
    """

    train: BoolArray
    users: IntArray
    offsets: IntArray
    items: IntArray
    moments: IntArray
    share: float


def split_holdout(log: InteractionLog, share: float, *, seed: int) -> HoldoutSplit:
    """Each user's latest `share` of rows by time (split.later_rows): the same cut
    `recsys split-log` makes, so the build judges itself on a split shaped like the one its
    world will be judged on (learn on each user's past, answer what came after). The held-out
    items are the positives among those rows; every row from the moment a user's holdout
    begins is kept out of training. In a log without times the rows are drawn at random
    (`seed`), and every moment is 0.
    """
    later = later_rows(log, share, seed=seed)
    begins = np.full(log.n_users, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(begins, log.user[later], log.time[later])
    return _holdout_sets(log, ~later, np.flatnonzero(later & log.positive), begins, share)


def _holdout_sets(
    log: InteractionLog, train: BoolArray, held_rows: IntArray, begins: IntArray, share: float
) -> HoldoutSplit:
    n_items = log.n_items
    seen = np.unique(log.user[train] * n_items + log.item[train])
    keys = np.unique(log.user[held_rows] * n_items + log.item[held_rows])
    keys = keys[~np.isin(keys, seen)]
    owner, items = keys // n_items, keys % n_items
    users = np.unique(owner)
    offsets = np.searchsorted(owner, users)
    return HoldoutSplit(
        train=train,
        users=users,
        offsets=np.append(offsets, len(keys)).astype(np.int64),
        items=items,
        moments=begins[users],
        share=share,
    )
