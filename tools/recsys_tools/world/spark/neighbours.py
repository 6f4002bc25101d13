"""Item-to-item neighbours as Spark jobs: learn/neighbours.py's models over co-occurrence,
each user's latest HISTORY positives, top NEIGHBOURS_K per item.

A self-join of the kept rows on the user makes one row per pair of a user's items (up to
HISTORY squared per user: a billion rows at 25M interactions, 12 minutes on 2 cores), so
the co-occurrence is counted as the local engine counts it, by a sparse product, on slices
of users: each slice's XᵀX leaves its partition already summed, the slices' counts meet
by item, and each item's top k is chosen there, in the local engine's arithmetic (float32
counts and norms, ties to the lower index), so both engines pick the same neighbours. Only
the result, items by k, comes back to the driver. EASE's weights need the whole matrix
inverted: its counts, summed per pair on the cluster (of the items it fits, at most
NeighbourModel.max_items, the others' rows dropped before the product), come back to the
driver, which chooses with learn/neighbours.ease_neighbours itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import scipy.sparse as sp
from pyspark import Broadcast
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as sf

from app.world.neighbours import Neighbours
from recsys_tools.world.learn.neighbours import (
    COSINE,
    HISTORY,
    NEIGHBOURS_K,
    NeighbourModel,
    closest,
    ease_items,
    ease_neighbours,
)
from recsys_tools.world.read.tables import BoolArray
from recsys_tools.world.spark.tables import Part

# Kept (user, item) rows per slice of users: a slice's product holds at most this many
# times HISTORY pairs (40 M, under 500 MB) before it is summed.
SLICE_ROWS = 400_000
_PAIRS = "i int, j int, c float"
_TOP = "i int, rank int, j int, s float"


def _arrays(batches: Iterator[pa.RecordBatch], *names: str) -> list[npt.NDArray[np.int64]]:
    table = pa.Table.from_batches(list(batches))
    return [np.asarray(table.column(name).to_numpy(), dtype=np.int64) for name in names]


def _together(
    n_items: int, fitted: Broadcast[BoolArray] | None, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One slice of users' co-occurrence counts, i != j; only of the `fitted` items where
    EASE fits some (a pair's count is of the users who chose both, so dropping the other
    items' rows first counts the same)."""
    user, item = _arrays(batches, "u", "i")
    if fitted is not None:
        keep = fitted.value[item]
        user, item = user[keep], item[keep]
    if not len(user):
        return
    _, rows = np.unique(user, return_inverse=True)
    matrix = sp.csr_matrix(
        (np.ones(len(rows), dtype=np.float32), (rows, item)), shape=(int(rows.max()) + 1, n_items)
    )
    counts = (matrix.T @ matrix).tocoo()
    off = counts.row != counts.col
    yield pa.RecordBatch.from_arrays(
        [
            pa.array(counts.row[off].astype(np.int32)),
            pa.array(counts.col[off].astype(np.int32)),
            pa.array(counts.data[off].astype(np.float32)),
        ],
        ["i", "j", "c"],
    )


def _top(
    n_items: int,
    k: int,
    norms: Broadcast[npt.NDArray[np.float32]],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The slices' counts summed per pair, and each item's k best, as item_neighbours
    chooses them."""
    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    together = sp.csr_matrix(
        (
            np.asarray(table.column("c").to_numpy(), dtype=np.float32),
            (table.column("i").to_numpy(), table.column("j").to_numpy()),
        ),
        shape=(n_items, n_items),
    )
    together.sum_duplicates()
    lengths = norms.value
    found: list[tuple[np.ndarray, ...]] = []
    indptr, indices, counts = together.indptr, together.indices, together.data
    for row in np.flatnonzero(np.diff(indptr)).tolist():
        begin, end = indptr[row], indptr[row + 1]
        chosen, scores = closest(indices[begin:end], counts[begin:end], lengths[row], lengths, k)
        found.append((np.full(len(chosen), row), np.arange(len(chosen)), chosen, scores))
    if not found:
        return
    columns = [np.concatenate(part) for part in zip(*found, strict=True)]
    yield pa.RecordBatch.from_arrays(
        [
            pa.array(columns[0].astype(np.int32)),
            pa.array(columns[1].astype(np.int32)),
            pa.array(columns[2].astype(np.int32)),
            pa.array(columns[3].astype(np.float32)),
        ],
        ["i", "rank", "j", "s"],
    )


def _summed(pairs: DataFrame, n_items: int) -> sp.csr_matrix:
    """The slices' counts summed per pair on the cluster, on the driver as learn/neighbours
    holds them: items by items, float32, the diagonal empty (ease_neighbours reads each
    item's own count from the exact one)."""
    # One triangle comes back (the counts are symmetric), 12 bytes a pair: at 10,000 items
    # chosen together about 600 MB, under spark.driver.maxResultSize's 1 GB default (past
    # about 13,000, raise it with --spark-conf).
    upper = pairs.filter("i < j").groupBy("i", "j").agg(sf.sum("c").cast("float").alias("c"))
    table = upper.toArrow()
    first = np.asarray(table.column("i").to_numpy(), dtype=np.int64)
    second = np.asarray(table.column("j").to_numpy(), dtype=np.int64)
    counts = np.asarray(table.column("c").to_numpy(), dtype=np.float32)
    return sp.csr_matrix(
        (
            np.concatenate([counts, counts]),
            (np.concatenate([first, second]), np.concatenate([second, first])),
        ),
        shape=(n_items, n_items),
    )


def neighbours_on_spark(
    part: Part, k: int = NEIGHBOURS_K, history: int = HISTORY, model: NeighbourModel = COSINE
) -> Neighbours:
    latest = part.rows.filter("pos").groupBy("u", "i").agg(sf.max(sf.struct("t", "r")).alias("at"))
    newest_first = Window.partitionBy("u").orderBy(sf.desc("at"))
    kept = (
        latest.withColumn("k", sf.row_number().over(newest_first))
        .filter(sf.col("k") <= history)
        .select("u", "i")
        .cache()
    )
    n_items = part.log.n_items
    per_item = kept.groupBy("i").count().toArrow()
    chosen_by = np.zeros(n_items, dtype=np.int64)
    chosen_by[np.asarray(per_item.column("i").to_numpy(), dtype=np.int64)] = np.asarray(
        per_item.column("count").to_numpy(), dtype=np.int64
    )
    context = part.rows.sparkSession.sparkContext
    slices = max(-(-int(chosen_by.sum()) // SLICE_ROWS), context.defaultParallelism, 1)
    norms = context.broadcast(np.sqrt(chosen_by.astype(np.float32)))
    fitted = None
    if model.kind == "ease":
        mask = np.zeros(n_items, dtype=bool)
        mask[ease_items(chosen_by, model.max_items)] = True
        fitted = context.broadcast(mask)
    try:
        pairs = kept.repartition(slices, "u").mapInArrow(
            partial(_together, n_items, fitted), _PAIRS
        )
        if model.kind == "ease":
            return ease_neighbours(_summed(pairs, n_items), chosen_by, model, k)
        top = pairs.repartition(slices, "i").mapInArrow(partial(_top, n_items, k, norms), _TOP)
        table = top.toArrow()
    finally:
        norms.unpersist()
        if fitted is not None:
            fitted.unpersist()
        kept.unpersist()
    positions = np.full((n_items, k), -1, dtype=np.int32)
    similarity = np.zeros((n_items, k), dtype=np.float32)
    rows = np.asarray(table.column("i").to_numpy(), dtype=np.int64)
    slots = np.asarray(table.column("rank").to_numpy(), dtype=np.int64)
    positions[rows, slots] = np.asarray(table.column("j").to_numpy(), dtype=np.int32)
    similarity[rows, slots] = np.asarray(table.column("s").to_numpy(), dtype=np.float32)
    return Neighbours(positions, similarity)
