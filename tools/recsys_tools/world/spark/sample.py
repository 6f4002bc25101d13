"""The users whose every row the driver gathers: the ranker and the blend learn on them, the
world is judged on them. Chosen by a hash of the user's index and the seed, so a rebuild of the
same log gathers the same users, whatever the partitioning."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.spark.read import SparkLog

BUCKETS = 1_000_000


def sampled_users(log: SparkLog, rows: int, seed: int) -> DataFrame:
    """(u,) of about `rows` rows' worth of users; every user where the log is smaller."""

    total = log.rows.count()
    share = min(1.0, rows / max(total, 1))
    bucket = sf.pmod(sf.xxhash64(sf.col("u"), sf.lit(seed)), sf.lit(BUCKETS))
    return log.users.select("u").filter(
        bucket < sf.lit(int(share * BUCKETS)) if share < 1 else "true"
    )


def gather(
    log: SparkLog, rows: DataFrame, users: DataFrame
) -> tuple[InteractionLog, npt.NDArray[np.int64]]:
    """The chosen users' rows as a local log, ordered by user then time, as read_log orders
    them; its users are the chosen ones with rows (in index order), its items the whole
    catalog. Also each of its users' index in the whole log."""

    named = sf.broadcast(users.join(log.users, "u"))
    table = rows.join(named, "u").select("u", "user_id", "i", "t", "w", "pos", "r").toArrow()
    u = np.asarray(table.column("u").to_numpy(), dtype=np.int64)
    t = np.asarray(table.column("t").to_numpy(), dtype=np.int64)
    r = np.asarray(table.column("r").to_numpy(), dtype=np.int64)
    order = np.lexsort((r, t, u))
    present, first, user = np.unique(u[order], return_index=True, return_inverse=True)
    names = np.asarray(table.column("user_id").to_numpy(zero_copy_only=False), dtype=np.str_)
    ids = names[order][first]
    weight = None
    if log.weighted:
        weight = np.asarray(table.column("w").to_numpy(zero_copy_only=False), dtype=np.float64)
        weight = weight[order]
    return InteractionLog(
        source=log.source,
        user_ids=ids,
        items=log.items,
        user=user.astype(np.int64),
        item=np.asarray(table.column("i").to_numpy(), dtype=np.int64)[order],
        time=t[order],
        weight=weight,
        positive=np.asarray(table.column("pos").to_numpy(zero_copy_only=False), dtype=bool)[order],
        counts=log.counts,
    ), present.astype(np.int64)
