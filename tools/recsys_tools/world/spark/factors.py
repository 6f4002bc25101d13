"""User and item factors by implicit-feedback ALS as Spark jobs, solving the local engine's
own objective (learn/factorize.py, the implicit library's) over the same BM25 confidences.

The objective is fixed by what the service does with the factors: it folds a user in from
the item factors with the implicit ALS user step (confidence c on what they chose, 1 on the
rest, one regularisation for everyone: app.ingest.foldin). MLlib's ALS fits another one
(confidence 1 + alpha c, regularisation scaled by each row's count): tuned per log it can
recall as well (docs/beyond-one-machine.md), but the users the service folds in would be
solved in another space than the one its item factors were fitted in. So each half-step
here is that user step for every key at once: the confidences are split by user (then by
item) once and cached, the other side's factors travel to the executors as a broadcast,
and each partition solves its keys' normal equations in batches. The start is the local
engine's (the same seeded draw), so on one log both engines reach the same factors up to
the local solver's conjugate-gradient steps.

What each executor holds: the other side's factors (users x dim x 4 bytes for the item
step: 650 MB for 5M users at dim 32) and one partition of confidences.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark import Broadcast
from pyspark.sql import DataFrame
from pyspark.storagelevel import StorageLevel

from recsys_tools.world.learn.factorize import ITERATIONS, Embeddings

FloatArray = npt.NDArray[np.float32]
# Keys whose normal equations are solved by one batched call: 2,048 32x32 systems in float64
# are 16 MB.
SOLVE_BATCH = 2048
_SCHEMA = "k int, f array<float>"


def start_factors(n_users: int, n_items: int, dim: int, seed: int) -> tuple[FloatArray, ...]:
    """implicit's own start (users drawn first, then items, uniform times 0.01)."""
    rng = np.random.default_rng(seed)
    users = rng.random((n_users, dim), dtype=np.float32) * np.float32(0.01)
    items = rng.random((n_items, dim), dtype=np.float32) * np.float32(0.01)
    return users, items


def solve_keys(
    keys: npt.NDArray[np.int64],
    others: npt.NDArray[np.int64],
    confidence: npt.NDArray[np.float64],
    factors: FloatArray,
    regularization: float,
) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """Each key's least-squares factors against the other side's `factors`: the implicit
    ALS step, (YtY + lambda I + Yt (C - I) Y) x = Yt C p, with p 1 on every row given."""
    dim = factors.shape[1]
    # YtY as implicit forms it (float32); each key's own rows in float64.
    base = (factors.T @ factors).astype(np.float64) + regularization * np.eye(dim)
    order = np.argsort(keys, kind="stable")
    keys, others, confidence = keys[order], others[order], confidence[order]
    unique, starts = np.unique(keys, return_index=True)
    bounds = np.append(starts, len(keys))
    solved = np.empty((len(unique), dim), dtype=np.float32)
    for first in range(0, len(unique), SOLVE_BATCH):
        last = min(first + SOLVE_BATCH, len(unique))
        lhs = np.broadcast_to(base, (last - first, dim, dim)).copy()
        rhs = np.empty((last - first, dim))
        for slot, key in enumerate(range(first, last)):
            rows = slice(bounds[key], bounds[key + 1])
            chosen, weight = factors[others[rows]].astype(np.float64), confidence[rows]
            lhs[slot] += chosen.T @ (chosen * (weight - 1.0)[:, None])
            rhs[slot] = weight @ chosen
        solved[first:last] = np.linalg.solve(lhs, rhs[..., None])[..., 0]
    return unique, solved


def _solve_partition(
    key: str,
    other: str,
    factors: Broadcast[FloatArray],
    regularization: float,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    # A partition holds every row of its keys (split by key), in batches cut anywhere.
    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    unique, solved = solve_keys(
        np.asarray(table.column(key).to_numpy(), dtype=np.int64),
        np.asarray(table.column(other).to_numpy(), dtype=np.int64),
        np.asarray(table.column("c").to_numpy(), dtype=np.float64),
        factors.value,
        regularization,
    )
    dim = solved.shape[1]
    offsets = pa.array(np.arange(len(unique) + 1, dtype=np.int32) * dim)
    vectors = pa.ListArray.from_arrays(offsets, pa.array(solved.ravel()))
    yield pa.RecordBatch.from_arrays([pa.array(unique.astype(np.int32)), vectors], ["k", "f"])


def _half_step(
    rows: DataFrame, key: str, other: str, factors: FloatArray, size: int, regularization: float
) -> FloatArray:
    """The factors of every `key` given the other side's; keys without rows get zeros, as
    the local solver gives them (nothing chosen: b is 0)."""
    context = rows.sparkSession.sparkContext
    shared = context.broadcast(factors)
    try:
        solve = partial(_solve_partition, key, other, shared, regularization)
        table = rows.mapInArrow(solve, _SCHEMA).toArrow()
    finally:
        shared.unpersist()
    matrix = np.zeros((size, factors.shape[1]), dtype=np.float32)
    ids = np.asarray(table.column("k").to_numpy(), dtype=np.int64)
    if len(ids):
        values = table.column("f").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix[ids] = np.asarray(values, dtype=np.float32).reshape(len(ids), -1)
    return matrix


def factorize_on_spark(
    confidence: DataFrame, n_users: int, n_items: int, dim: int, seed: int, regularization: float
) -> Embeddings:
    """Factors of size `dim` from rows (u, i, c); users and items without positives get zero
    vectors."""
    # Split into spark.sql.shuffle.partitions: the operator's size for a partition.
    by_user = confidence.repartition("u").persist(StorageLevel.MEMORY_AND_DISK)
    by_item = confidence.repartition("i").persist(StorageLevel.MEMORY_AND_DISK)
    try:
        users, items = start_factors(n_users, n_items, dim, seed)
        for _ in range(ITERATIONS):
            users = _half_step(by_user, "u", "i", items, n_users, regularization)
            items = _half_step(by_item, "i", "u", users, n_items, regularization)
    finally:
        by_user.unpersist()
        by_item.unpersist()
    return Embeddings(users, items)
