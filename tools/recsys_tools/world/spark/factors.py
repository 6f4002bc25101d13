"""User and item factors by Spark MLlib's implicit-feedback ALS, over the same BM25
confidences the local engine's ALS learns from (learn/factorize.py).

MLlib's solver weighs each user's regularisation by how many items they chose (ALS-WR), the
local one does not: the local strength is divided by the mean row length, so a user with an
average history is held back as much by either engine.
"""

from __future__ import annotations

import numpy as np
from pyspark.ml.recommendation import ALS
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from recsys_tools.world.learn.factorize import ITERATIONS, Embeddings


def _matrix(frame: DataFrame, size: int, dim: int) -> np.ndarray:
    table = frame.select("id", "features").toArrow()
    matrix = np.zeros((size, dim), dtype=np.float32)
    ids = np.asarray(table.column(0).to_numpy(), dtype=np.int64)
    if len(ids):
        values = table.column(1).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix[ids] = np.asarray(values, dtype=np.float32).reshape(len(ids), dim)
    return matrix


def factorize_on_spark(
    confidence: DataFrame, n_users: int, n_items: int, dim: int, seed: int, regularization: float
) -> Embeddings:
    """Factors of size `dim`; users and items without positives get zero vectors."""

    row = confidence.agg(sf.count("*"), sf.countDistinct("u")).first()
    assert row is not None
    mean_length = row[0] / max(row[1], 1)
    blocks = max(confidence.sparkSession.sparkContext.defaultParallelism, 2)
    als = ALS(
        rank=dim,
        maxIter=ITERATIONS,
        regParam=regularization / mean_length,
        implicitPrefs=True,
        alpha=1.0,
        userCol="u",
        itemCol="i",
        ratingCol="c",
        seed=seed,
        numUserBlocks=blocks,
        numItemBlocks=blocks,
    )
    model = als.fit(confidence)
    return Embeddings(
        _matrix(model.userFactors, n_users, dim), _matrix(model.itemFactors, n_items, dim)
    )
