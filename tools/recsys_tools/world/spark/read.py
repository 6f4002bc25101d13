"""The interaction log read by Spark from any path it reads (local, hdfs://, s3a://), laid out
as the local reader takes it, and indexed to the same vocabularies.

The local reader (read/log.py) numbers users and items in the order they first appear in the
file, among the rows it keeps; so does this, from each row's position in the file, so both
engines give every user and item the same index and the world the same tables. Times are
parsed by the local parser itself, batch by batch on the executors.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as sf
from pyspark.sql import types as st

from app.core.errors import ConfigError
from recsys_tools.world.read.formats import SEPARATORS, file_format
from recsys_tools.world.read.items import ItemInfo, categories
from recsys_tools.world.read.log import LogColumns, ReadCounts, time_column
from recsys_tools.world.read.tables import FLAGS, StrArray, require_columns
from recsys_tools.world.read.times import NO_TIME, unix_seconds

# Python's codec names (codecs.lookup) to the charsets Spark's CSV reader accepts.
_CHARSETS = {
    "utf-8": "utf-8",
    "iso8859-1": "iso-8859-1",
    "ascii": "us-ascii",
    "utf-16": "utf-16",
    "utf-16-be": "utf-16be",
    "utf-16-le": "utf-16le",
    "utf-32": "utf-32",
}


@dataclass(frozen=True, slots=True)
class SparkLog:
    """The kept rows as (u, i, t, w, pos, r): user and item index, unix seconds, weight (null
    without a weight column), positive, position in the file. `users` maps u to user_id."""

    source: str  # the log's name, as errors name it
    uri: str
    rows: DataFrame
    users: DataFrame
    n_users: int
    items: ItemInfo
    counts: ReadCounts
    weighted: bool
    rows_count: int
    positives: int
    items_with_rows: int
    items_with_positives: int

    @property
    def n_items(self) -> int:
        return self.items.size

    @property
    def items_without_interactions(self) -> int:
        return self.n_items - self.items_with_rows

    @property
    def items_without_positives(self) -> int:
        return self.n_items - self.items_with_positives


def _raw(spark: SparkSession, path: str, columns: LogColumns) -> DataFrame:
    layout = columns.layout
    kind = file_format(Path(path), layout, FLAGS["log"])
    if kind == "parquet":
        return spark.read.parquet(path)
    reader = spark.read.option("sep", layout.sep or SEPARATORS.get(kind, ",")).option(
        "encoding", _charset(layout.encoding)
    )
    # Every column as text, as written: ids stay "296", never 296.0.
    frame = reader.option("header", layout.header).option("inferSchema", False).csv(path)
    if not layout.header:
        if len(layout.columns) != len(frame.columns):
            raise ConfigError(
                f"{Path(path).name} has {len(frame.columns)} columns, "
                f"{FLAGS['log']}-columns names {len(layout.columns)}"
            )
        frame = frame.toDF(*layout.columns)
    return frame


def _charset(encoding: str) -> str:
    """Python's name for an encoding as Spark's CSV reader takes it (it takes these only)."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        name = encoding
    if name not in _CHARSETS:
        raise ConfigError(
            f"{FLAGS['log']}-encoding {encoding}: the Spark engine reads "
            f"{', '.join(sorted(set(_CHARSETS.values())))}; re-encode the log or build it "
            "with the local engine"
        )
    return _CHARSETS[name]


# Why the Spark engine refuses a log without times (require_times).
TIMED_ONLY = "the Spark engine builds from logs with times only; leave out --engine spark"


def _times(frame: DataFrame, columns: LogColumns, source: str) -> DataFrame:
    """The time column as unix seconds, NO_TIME where blank, by the local parser."""

    kind = frame.schema["t"].dataType
    if isinstance(kind, st.IntegralType) and columns.time_format is None:
        return frame.withColumn("t", sf.coalesce(sf.col("t").cast("long"), sf.lit(NO_TIME)))
    fmt, name = columns.time_format, time_column(columns, source, TIMED_ONLY)
    text = frame.withColumn("t", sf.col("t").cast("string"))
    schema = st.StructType(
        [f if f.name != "t" else st.StructField("t", st.LongType()) for f in text.schema.fields]
    )

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            at = batch.schema.get_field_index("t")
            seconds = unix_seconds(
                pa.chunked_array([batch.column(at)]), Path(source), name, "time", fmt
            )
            yield batch.set_column(at, "t", pa.array(seconds, pa.int64()))

    return text.mapInArrow(parse, schema)


def _item_vocabulary(spark: SparkSession, items: ItemInfo) -> DataFrame:
    table = pa.table({"item_id": items.ids.tolist(), "i": np.arange(items.size, dtype=np.int32)})
    return spark.createDataFrame(table)


def _first_seen(frame: DataFrame, key: str, index: str) -> tuple[DataFrame, int]:
    """Each distinct `key`, numbered from 0 in the order it first appears in the file."""

    firsts = frame.groupBy(key).agg(sf.min("r").alias("first"))
    # One window over the distinct keys (not the rows): a single task of users-many rows.
    order = Window.orderBy("first")
    numbered = firsts.select(key, (sf.row_number().over(order) - 1).cast("int").alias(index))
    numbered = numbered.cache()
    return numbered, numbered.count()


def _strings(frame: DataFrame, column: str) -> StrArray:
    table = frame.select(column).toArrow()
    return np.asarray(table.column(0).to_numpy(zero_copy_only=False), dtype=np.str_)


def _log_items(vocabulary: DataFrame) -> ItemInfo:
    ids = _strings(vocabulary.orderBy("i"), "item_id")
    names, offsets, codes = categories([], len(ids))
    return ItemInfo(ids, names, offsets, codes, None)


def _selected(frame: DataFrame, path: str, columns: LogColumns) -> DataFrame:

    time = time_column(columns, path, TIMED_ONLY)
    wanted = {"user": columns.user, "item": columns.item, "time": time}
    if columns.min_weight is not None and columns.weight is None:
        raise ConfigError(
            f"{FLAGS['min_weight']} needs a weight column; name it with {FLAGS['weight']}"
        )
    if columns.weight is not None:
        wanted["weight"] = columns.weight
    require_columns(Path(path), wanted, list(frame.columns), FLAGS["log"])
    weight = (
        sf.expr(f"try_cast(`{columns.weight}` as double)")
        if columns.weight is not None
        else sf.lit(None).cast("double")
    )
    return frame.select(
        sf.col(columns.user).cast("string").alias("user_id"),
        sf.col(columns.item).cast("string").alias("item_id"),
        sf.col(time).alias("t"),
        weight.alias("w"),
        sf.monotonically_increasing_id().alias("r"),
    )


def _missing(column: str) -> Column:

    return sf.col(column).isNull() | (sf.trim(sf.col(column)) == "")


def read_spark_log(
    spark: SparkSession, path: str, columns: LogColumns, items: ItemInfo | None
) -> SparkLog:
    """The log's kept rows, indexed; the rows dropped are counted as the local reader does."""

    source = Path(path).name
    frame, infinite = _marked(spark, path, columns, items)
    tally = _tally(frame, infinite, source, columns)
    dropped = {
        name: int(tally[name] or 0)
        for name in ("missing_id", "missing_weight", "item_not_in_table")
    }
    kept = frame.filter(~sf.col("no_id") & ~sf.col("no_weight") & ~sf.col("unknown"))
    if kept.isEmpty():
        reasons = ", ".join(f"{n:,} {r.replace('_', ' ')}" for r, n in dropped.items())
        raise ConfigError(
            f"{source}: none of its {tally['rows']:,} rows is usable (dropped: {reasons}); "
            f"check the id columns ({FLAGS['user']}, {FLAGS['item']}) and the item table"
        )
    if items is None:
        item_vocabulary, _ = _first_seen(kept, "item_id", "i")
        kept = kept.join(sf.broadcast(item_vocabulary), "item_id")
        items = _log_items(item_vocabulary)
        item_vocabulary.unpersist()
    users, n_users = _first_seen(kept, "user_id", "u")
    rows = _times(kept.join(users, "user_id").select("u", "i", "t", "w", "r"), columns, source)
    positive = sf.lit(True)
    if columns.weight is not None and columns.min_weight is not None:
        positive = sf.col("w") >= sf.lit(columns.min_weight)
    rows = rows.select("u", "i", "t", "w", positive.alias("pos"), "r").cache()
    try:
        summary = _summary(rows, source, columns)
    finally:
        frame.unpersist()
    counts = ReadCounts(int(tally["rows"]), dropped, int(summary["below"]))
    return SparkLog(
        source,
        path,
        rows,
        users,
        n_users,
        items,
        counts,
        columns.weight is not None,
        int(summary["n"]),
        int(summary["n"] - summary["below"]),
        int(summary["items"]),
        int(summary["liked"]),
    )


def _marked(
    spark: SparkSession, path: str, columns: LogColumns, items: ItemInfo | None
) -> tuple[DataFrame, Column]:
    """Every row, cached, marked with why it would be dropped (no_id, no_weight, unknown);
    and the condition of a weight that is infinite."""
    frame = _selected(_raw(spark, path, columns), path, columns)
    no_id = _missing("user_id") | _missing("item_id")
    no_weight = ~no_id & (sf.col("w").isNull() | sf.isnan("w")) if columns.weight else sf.lit(False)
    # Refused, as the local reader refuses it: a value the file says, that ALS and the mean
    # weight would meet as a NaN far from here.
    infinite = ~no_id & (sf.abs(sf.col("w")) == sf.lit(float("inf")))
    frame = frame.withColumn("no_id", no_id).withColumn("no_weight", no_weight)
    if items is not None:
        frame = frame.join(sf.broadcast(_item_vocabulary(spark, items)), "item_id", "left")
        unknown = sf.col("i").isNull() & ~sf.col("no_id") & ~sf.col("no_weight")
    else:
        unknown = sf.lit(False)
    return frame.withColumn("unknown", unknown).cache(), infinite


def _tally(frame: DataFrame, infinite: Column, source: str, columns: LogColumns) -> Row:
    """The rows, and how many each reason drops; a log without rows or with an infinite
    weight refused."""
    tally = frame.agg(
        sf.count("*").alias("rows"),
        sf.sum(sf.col("no_id").cast("long")).alias("missing_id"),
        sf.sum(sf.col("no_weight").cast("long")).alias("missing_weight"),
        sf.sum(sf.col("unknown").cast("long")).alias("item_not_in_table"),
        sf.sum(infinite.cast("long")).alias("infinite_weight"),
    ).first()
    assert tally is not None
    if tally["rows"] == 0:
        raise ConfigError(f"{source} has no rows; give {FLAGS['log']} a log with interactions")
    if tally["infinite_weight"]:
        raise ConfigError(
            f"{source}: {columns.weight!r} is infinite in {tally['infinite_weight']:,} of its "
            "rows; a weight must be a finite number: fix those rows or drop them"
        )
    return tally


def _summary(rows: DataFrame, source: str, columns: LogColumns) -> Row:
    """The kept rows' counts; a row without a time, or no positive row, refused."""
    summary = rows.agg(
        sf.count("*").alias("n"),
        sf.sum((sf.col("t") == NO_TIME).cast("long")).alias("no_time"),
        sf.sum((~sf.col("pos")).cast("long")).alias("below"),
        sf.min("w").alias("low"),
        sf.max("w").alias("high"),
        sf.countDistinct("i").alias("items"),
        sf.countDistinct(sf.when(sf.col("pos"), sf.col("i"))).alias("liked"),
    ).first()
    assert summary is not None
    if summary["no_time"]:
        raise ConfigError(
            f"{source}: {summary['no_time']:,} rows have no {columns.time!r}; "
            f"fill them in or name another column with {FLAGS['time']}"
        )
    if summary["below"] == summary["n"]:
        raise ConfigError(
            f"{source}: no row has {columns.weight} >= {columns.min_weight} (weights run from "
            f"{summary['low']:g} to {summary['high']:g}); lower {FLAGS['min_weight']}"
        )
    return summary


def user_ids(log: SparkLog, users: DataFrame | None = None) -> StrArray:
    """The ids of `users` (a frame with column u; default all), in index order."""
    chosen = log.users if users is None else log.users.join(users, "u")
    return _strings(chosen.orderBy("u"), "user_id")
