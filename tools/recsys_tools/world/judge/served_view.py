"""What the service reads of a user, rebuilt from a log: their latest positives and the items
near those. The evaluation and the pre-rank fit both hand these to the service's own
candidate stages (service_stages.py), so the two judge the pools the service makes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.core.cascade import RECENT_DECAY, RECENT_ITEMS, SIMILAR_CANDIDATES
from app.world.neighbours import NOWHERE, Nearby, Neighbours
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray

RECENT: int = RECENT_ITEMS
DECAY: float = RECENT_DECAY
SIMILAR: int = SIMILAR_CANDIDATES


@dataclass(frozen=True, slots=True)
class Recent:
    """Each user's latest positives, oldest first: items[offsets[u]:offsets[u + 1]]."""

    offsets: IntArray
    items: IntArray

    def of(self, user: int) -> IntArray:
        return self.items[self.offsets[user] : self.offsets[user + 1]]


def latest_positives(part: InteractionLog, count: int = RECENT) -> Recent:
    """What the service reads as a user's recent items: their last `count` positives."""
    rows = np.flatnonzero(part.positive)
    rows = rows[np.lexsort((part.time[rows], part.user[rows]))]
    users = part.user[rows]
    after = np.searchsorted(users, users, side="right") - np.arange(len(rows)) - 1
    rows, users = rows[after < count], users[after < count]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(users, minlength=part.n_users))])
    return Recent(offsets.astype(np.int64), part.item[rows].astype(np.int64))


def nearby(neighbours: Neighbours | None, recent: IntArray) -> Nearby:
    """What the service's features stage finds near the user's latest positives."""
    return neighbours.around(recent, DECAY) if neighbours is not None else NOWHERE
