"""A log split in time per user: the earlier part to build a world from, the later to judge it.

Each user's rows, in time order, are cut at the same share: the first (1 - share) of them
(rounded down) are the earlier part, the rest the later part. Serving is learning from the past and
answering what comes next; a split of this shape is what the world must be judged on.
A log without times is cut at the same share, each user's later rows drawn at random with a
seed: there is no past to learn from, only a part to hold out.
Both parts are written as CSV with the columns the world commands take by default
(user_id, item_id, timestamp where the log has times, and the weight column under its own
name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from app.core.errors import ConfigError
from recsys_tools.world.read.log import InteractionLog, row_keys
from recsys_tools.world.read.tables import BoolArray

EARLIER, LATER = "earlier.csv", "later.csv"


@dataclass(frozen=True, slots=True)
class SplitFiles:
    earlier: Path
    later: Path
    earlier_rows: int
    later_rows: int


def later_rows(log: InteractionLog, share: float, *, seed: int) -> BoolArray:
    """Each user's rows after their first floor((1 - share) * rows), by time (the log is by
    user, then time); at least one row stays earlier, so a user with one row has nothing
    later. In a log without times, as many of each user's rows drawn at random: by a key per
    row from `seed` and the row's user and item ids, so the draw of one user's rows is the
    same whatever else the file holds (split-log on the whole log, the build on what it kept)."""
    if not 0 < share < 1:
        raise ConfigError(f"--later-share must be between 0 and 1, not {share}")
    counts = np.bincount(log.user, minlength=log.n_users)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(len(log.user)) - start[log.user]
    if not log.timed:
        keys = row_keys(log.user_ids, log.items.ids, log.user, log.item, seed + 1)
        shuffled = np.lexsort((keys, log.user))  # each user's rows in the draw's order
        rank = np.empty(len(log.user), dtype=np.int64)
        rank[shuffled] = np.arange(len(shuffled)) - start[log.user[shuffled]]
    # The epsilon keeps 0.8 * 5 (3.9999999999999996 in floating point) at 4.
    keep = np.maximum(np.floor((1 - share) * counts + 1e-9), 1).astype(np.int64)
    later: BoolArray = rank >= keep[log.user]
    return later


def _table(log: InteractionLog, rows: BoolArray, weight_name: str | None) -> pa.Table:
    columns = {
        "user_id": pa.array(log.user_ids[log.user[rows]]),
        "item_id": pa.array(log.items.ids[log.item[rows]]),
    }
    if log.timed:
        columns["timestamp"] = pa.array(log.time[rows])
    if log.weight is not None and weight_name is not None:
        columns[weight_name] = pa.array(log.weight[rows])
    return pa.table(columns)


def write_split(
    log: InteractionLog, share: float, folder: Path, weight_name: str | None, *, seed: int
) -> SplitFiles:
    later = later_rows(log, share, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / EARLIER, folder / LATER
    for path, rows in zip(paths, (~later, later), strict=True):
        pacsv.write_csv(_table(log, rows, weight_name), path)
    return SplitFiles(paths[0], paths[1], int((~later).sum()), int(later.sum()))
