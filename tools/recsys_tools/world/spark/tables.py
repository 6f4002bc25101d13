"""The per-user and per-item tables of a world, counted by Spark: the split in time, the
tallies the dense features are computed from, the seen lists and positives (streamed to
their files, never whole on the driver), the fold-in parameters.

Each mirrors a local function named in its docstring; the parity tests hold them equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as sf

from app.core.errors import ConfigError
from app.world.foldin import BM25_B, BM25_K1, FoldInParams, Weighting, bm25, bm25_idf
from recsys_tools.world.learn.derive import ItemTallies, Totals, UserTallies
from recsys_tools.world.read.tables import StrArray
from recsys_tools.world.spark.read import SparkLog
from recsys_tools.world.store.npz_stream import NpzStream

# Users per chunk written to a streamed list file.
CHUNK_USERS = 20_000


@dataclass(frozen=True, slots=True)
class Part:
    """Some of a SparkLog's rows (the train part, or all), with the log's vocabularies."""

    log: SparkLog
    rows: DataFrame


def with_later(rows: DataFrame, share: float) -> DataFrame:
    """The rows with `later`: judge/split.later_rows, each user's rows past their first
    floor((1 - share) * rows), in time then file order, at least one kept earlier."""

    if not 0 < share < 1:
        raise ConfigError(f"--later-share must be between 0 and 1, not {share}")
    ordered = Window.partitionBy("u").orderBy("t", "r")
    whole = Window.partitionBy("u")
    rank = sf.row_number().over(ordered) - 1
    keep = sf.greatest(
        sf.floor(sf.lit(1 - share) * sf.count("*").over(whole) + sf.lit(1e-9)), sf.lit(1)
    )
    return rows.withColumn("later", rank >= keep)


def _dense_column(frame: DataFrame, key: str, column: str, size: int, fill: Any) -> np.ndarray:
    table = frame.select(key, column).toArrow()
    values = np.full(size, fill, dtype=np.asarray(fill).dtype)
    index = np.asarray(table.column(0).to_numpy(), dtype=np.int64)
    values[index] = np.asarray(table.column(1).to_numpy(zero_copy_only=False))
    return values


def item_tallies(part: Part) -> ItemTallies:
    """derive.item_tallies."""

    n = part.log.n_items
    per_item = (
        part.rows.groupBy("i")
        .agg(
            sf.count("*").cast("long").alias("rows"),
            sf.sum(sf.col("pos").cast("double")).alias("positives"),
            sf.min("t").alias("first"),
            sf.sum(sf.coalesce("w", sf.lit(0.0))).alias("weight_sum"),
        )
        .cache()
    )
    tallies = ItemTallies(
        rows=_dense_column(per_item, "i", "rows", n, np.int64(0)),
        positives=_dense_column(per_item, "i", "positives", n, np.float64(0)),
        first=_dense_column(per_item, "i", "first", n, np.int64(0)),
        weight_sum=_dense_column(per_item, "i", "weight_sum", n, np.float64(0)),
    )
    per_item.unpersist()
    return tallies


def _category_entries(part: Part) -> DataFrame:
    """(i, code) for each of an item's categories, as read/items.ItemInfo lists them."""
    items = part.log.items
    owners = np.repeat(np.arange(items.size, dtype=np.int32), np.diff(items.category_offsets))
    spark = part.rows.sparkSession
    return spark.createDataFrame(
        [(int(i), int(c)) for i, c in zip(owners, items.category_codes, strict=True)],
        "i int, code int",
    )


def user_tallies(part: Part) -> UserTallies:
    """derive.user_tallies."""

    n = part.log.n_users
    per_user = (
        part.rows.groupBy("u")
        .agg(
            sf.count("*").cast("long").alias("rows"),
            sf.sum(sf.col("pos").cast("double")).alias("positives"),
            sf.min("t").alias("first"),
            sf.max("t").alias("last"),
        )
        .cache()
    )
    spread = np.zeros(n)
    if part.log.items.category_names:
        entries = sf.broadcast(_category_entries(part))
        breadth = (
            part.rows.filter("pos")
            .join(entries, "i")
            .groupBy("u")
            .agg(sf.countDistinct("code").cast("double").alias("categories"))
        )
        spread = _dense_column(breadth, "u", "categories", n, np.float64(0))
    tallies = UserTallies(
        rows=_dense_column(per_user, "u", "rows", n, np.int64(0)),
        positives=_dense_column(per_user, "u", "positives", n, np.float64(0)),
        first=_dense_column(per_user, "u", "first", n, np.int64(0)),
        last=_dense_column(per_user, "u", "last", n, np.int64(0)),
        categories=spread,
    )
    per_user.unpersist()
    return tallies


def totals(part: Part, users: UserTallies, items: ItemTallies) -> Totals:
    """derive.totals."""

    row = part.rows.agg(
        sf.count("*").alias("n"),
        sf.min("t").alias("first"),
        sf.max("t").alias("last"),
        sf.sum(sf.col("pos").cast("long")).alias("positives"),
        sf.min("w").alias("low"),
        sf.max("w").alias("high"),
        sf.sum("w").alias("sum"),
    ).first()
    assert row is not None
    weights = None
    if part.log.weighted and row["n"]:
        weights = (float(row["low"]), float(row["high"]), float(row["sum"]) / row["n"])
    return Totals(
        first_time=int(row["first"] or 0),
        last_time=int(row["last"] or 0),
        total_positives=int(row["positives"] or 0),
        top_user_positives=float(users.positives.max()) if len(users.positives) else 0.0,
        top_item_positives=float(items.positives.max()) if len(items.positives) else 0.0,
        weights=weights,
        n_categories=len(part.log.items.category_names),
    )


def positive_counts(part: Part) -> DataFrame:
    """(u, i, n): how often each user chose each item, the ALS's and fold-in's input."""

    return part.rows.filter("pos").groupBy("u", "i").agg(sf.count("*").cast("double").alias("n"))


def idf(part: Part, counts: DataFrame) -> npt.NDArray[np.float64]:
    """bm25_weight's idf: log(users) - log1p(users who chose the item)."""

    frequency = counts.groupBy("i").agg(sf.count("*").cast("long").alias("df"))
    document_frequency = _dense_column(frequency, "i", "df", part.log.n_items, np.int64(0))
    return bm25_idf(part.log.n_users, document_frequency)


def foldin_params(
    part: Part, counts: DataFrame, weights: npt.NDArray[np.float64], regularization: float
) -> FoldInParams:
    """factorize.foldin_params, from the positive counts."""

    n_users = part.log.n_users
    row = counts.agg(sf.sum("n").alias("total")).first()
    per_user = part.rows.filter("pos").groupBy("u").count().agg(sf.max("count")).first()
    total = float(row["total"] or 0.0) if row is not None else 0.0
    return FoldInParams(
        weighting=Weighting.BM25,
        regularization=regularization,
        idf=weights.astype(np.float32),
        average_length=total / n_users if n_users else 1.0,
        k1=BM25_K1,
        b=BM25_B,
        max_user_positives=int(per_user[0] or 0) if per_user is not None else 0,
    )


def bm25_confidence(
    part: Part, counts: DataFrame, weights: npt.NDArray[np.float64], average_length: float
) -> DataFrame:
    """(u, i, c): implicit's bm25_weight over the counts, the confidence ALS learns from."""

    spark = part.rows.sparkSession
    idf_table = spark.createDataFrame(
        [(i, float(v)) for i, v in enumerate(weights)], "i int, idf double"
    )
    lengths = counts.groupBy("u").agg(sf.sum("n").alias("length"))
    value = bm25(sf.col("n"), sf.col("length"), average_length, sf.col("idf"), BM25_K1, BM25_B)
    return (
        counts.join(lengths, "u")
        .join(sf.broadcast(idf_table), "i")
        .select("u", "i", value.cast("float").alias("c"))
    )


def _stream_lists(
    path: Path, user_ids: StrArray, item_ids: StrArray, lists: DataFrame, total: int
) -> int:
    """Write (user_ids, offsets, item_ids) to `path` from per-user arrays of item indexes,
    in user order, one partition at a time; returns the users written."""
    owners: list[int] = []
    counts: list[int] = []

    def chunks() -> Iterator[npt.NDArray[np.str_]]:
        batch: list[np.ndarray] = []
        for row in lists.orderBy("u").toLocalIterator(prefetchPartitions=True):
            picked = np.asarray(row["items"], dtype=np.int64)
            owners.append(int(row["u"]))
            counts.append(len(picked))
            batch.append(picked)
            if len(batch) >= CHUNK_USERS:
                yield item_ids[np.concatenate(batch)]
                batch = []
        if batch:
            yield item_ids[np.concatenate(batch)]

    with NpzStream(path) as out:
        out.array("item_ids", item_ids.dtype, (total,), chunks())
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        out.array("offsets", np.int64, offsets.shape, [offsets])
        users = user_ids[np.asarray(owners, dtype=np.int64)]
        out.array("user_ids", user_ids.dtype, users.shape, [users])
    return len(owners)


def write_seen(part: Part, path: Path, user_ids: StrArray) -> tuple[int, int]:
    """from_log.seen_lists: each user's distinct items, newest first (ties: later in the
    file first); returns the users and the longest list."""

    pairs = part.rows.groupBy("u", "i").agg(sf.max(sf.struct("t", "r")).alias("at"))
    lists = pairs.groupBy("u").agg(
        sf.sort_array(sf.collect_list(sf.struct("at", "i")), asc=False).alias("entries")
    )
    lists = lists.select("u", sf.transform("entries", lambda e: e["i"]).alias("items")).cache()
    summary = lists.agg(sf.sum(sf.size("items")), sf.max(sf.size("items"))).first()
    assert summary is not None
    users = _stream_lists(path, user_ids, part.log.items.ids, lists, int(summary[0] or 0))
    lists.unpersist()
    return users, int(summary[1] or 0)


def write_positives(part: Part, path: Path, user_ids: StrArray) -> int:
    """from_log.positive_lists: each user's positives oldest first, repeats kept."""

    lists = (
        part.rows.filter("pos")
        .groupBy("u")
        .agg(sf.sort_array(sf.collect_list(sf.struct("t", "r", "i"))).alias("entries"))
        .select("u", sf.transform("entries", lambda e: e["i"]).alias("items"))
        .cache()
    )
    row = lists.agg(sf.sum(sf.size("items"))).first()
    assert row is not None
    users = _stream_lists(path, user_ids, part.log.items.ids, lists, int(row[0] or 0))
    lists.unpersist()
    return users
