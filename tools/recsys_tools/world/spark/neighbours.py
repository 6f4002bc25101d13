"""Item-to-item neighbours as a Spark job: learn/neighbours.py's cosine over co-occurrence,
each user's latest HISTORY positives, top NEIGHBOURS_K per item. Only the result, items by k,
comes back to the driver."""

from __future__ import annotations

import numpy as np
from pyspark.sql import Window
from pyspark.sql import functions as sf

from app.release.neighbours import Neighbours
from recsys_tools.world.learn.neighbours import HISTORY, NEIGHBOURS_K, SHRINK
from recsys_tools.world.spark.tables import Part


def neighbours_on_spark(part: Part, k: int = NEIGHBOURS_K, history: int = HISTORY) -> Neighbours:

    latest = part.rows.filter("pos").groupBy("u", "i").agg(sf.max(sf.struct("t", "r")).alias("at"))
    newest_first = Window.partitionBy("u").orderBy(sf.desc("at"))
    kept = (
        latest.withColumn("k", sf.row_number().over(newest_first))
        .filter(sf.col("k") <= history)
        .select("u", "i")
        .cache()
    )
    norms = kept.groupBy("i").agg(sf.sqrt(sf.count("*").cast("double")).alias("norm"))
    together = (
        kept.alias("a")
        .join(kept.alias("b"), "u")
        .filter(sf.col("a.i") != sf.col("b.i"))
        .groupBy(sf.col("a.i").alias("i"), sf.col("b.i").alias("j"))
        .agg(sf.count("*").cast("double").alias("c"))
    )
    scored = (
        together.join(sf.broadcast(norms), "i")
        .join(sf.broadcast(norms.withColumnRenamed("i", "j").withColumnRenamed("norm", "nj")), "j")
        .select(
            "i", "j", (sf.col("c") / (sf.col("norm") * sf.col("nj") + sf.lit(SHRINK))).alias("s")
        )
    )
    best = Window.partitionBy("i").orderBy(sf.desc("s"), "j")
    top = scored.withColumn("rank", sf.row_number().over(best)).filter(sf.col("rank") <= k)
    table = top.select("i", "j", "s", "rank").toArrow()
    kept.unpersist()
    n_items = part.log.n_items
    positions = np.full((n_items, k), -1, dtype=np.int32)
    similarity = np.zeros((n_items, k), dtype=np.float32)
    rows = np.asarray(table.column("i").to_numpy(), dtype=np.int64)
    slots = np.asarray(table.column("rank").to_numpy(), dtype=np.int64) - 1
    positions[rows, slots] = np.asarray(table.column("j").to_numpy(), dtype=np.int32)
    similarity[rows, slots] = np.asarray(table.column("s").to_numpy(), dtype=np.float32)
    return Neighbours(positions, similarity)
