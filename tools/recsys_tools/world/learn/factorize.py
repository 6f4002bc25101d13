"""User and item embeddings from the positives, by implicit-feedback ALS.

The service recalls by inner product (user_vec · item_vec over a FAISS index), which is
exactly what ALS's factors are fitted to approximate, so the factors go in unnormalised:
normalising items would throw away the popularity their length carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from implicit.cpu.als import AlternatingLeastSquares
from implicit.nearest_neighbours import bm25_weight
from scipy.sparse import csr_matrix
from threadpoolctl import threadpool_limits

from app.world.foldin import BM25_B, BM25_K1, FoldInParams, Weighting, bm25_idf
from recsys_tools.world.read.log import InteractionLog

FloatArray = npt.NDArray[np.float32]

# ALS solves each user (then each item) independently: results do not depend on threads.
FIT_THREADS = 2
ITERATIONS = 15
# The default where none is chosen (regularization.py chooses one per log: the best on the
# public movie-ratings sets were 10 to 30; 0.05, the library's default, lost a tenth).
REGULARIZATION = 10.0


@dataclass(frozen=True, slots=True)
class Embeddings:
    users: FloatArray
    items: FloatArray


def _counts(log: InteractionLog) -> csr_matrix:
    counts = csr_matrix(
        (
            np.ones(int(log.positive.sum()), dtype=np.float32),
            (log.user[log.positive], log.item[log.positive]),
        ),
        shape=(log.n_users, log.n_items),
    )
    counts.sum_duplicates()
    return counts


def confidence_matrix(log: InteractionLog) -> csr_matrix:
    """Users by items; repeated positives on one item add up before weighting."""
    return bm25_weight(_counts(log), K1=BM25_K1, B=BM25_B).tocsr().astype(np.float32)


def foldin_params(log: InteractionLog, regularization: float = REGULARIZATION) -> FoldInParams:
    """What the service needs to fold a user in as `factorize` fitted them: bm25_weight's
    idf and mean row length over these counts, its K1 and B, and the ALS regularisation."""
    counts = _counts(log)
    idf = bm25_idf(counts.shape[0], np.bincount(counts.indices, minlength=counts.shape[1]))
    row_sums = np.asarray(counts.sum(axis=1)).ravel()
    per_user = np.bincount(log.user[log.positive], minlength=log.n_users)
    return FoldInParams(
        weighting=Weighting.BM25,
        regularization=regularization,
        idf=idf.astype(np.float32),
        average_length=float(row_sums.mean()) if len(row_sums) else 1.0,
        k1=BM25_K1,
        b=BM25_B,
        max_user_positives=int(per_user.max()) if len(per_user) else 0,
    )


def factorize(
    log: InteractionLog, dim: int, seed: int, regularization: float = REGULARIZATION
) -> Embeddings:
    """Factors of size `dim`; users and items without positives get zero vectors."""
    matrix = confidence_matrix(log)
    # OpenBLAS's own threads fight ALS's; one BLAS thread is what implicit asks for.
    with threadpool_limits(1, "blas"):
        model = AlternatingLeastSquares(
            factors=dim,
            regularization=regularization,
            iterations=ITERATIONS,
            random_state=seed,
            num_threads=FIT_THREADS,
        )
        model.fit(matrix, show_progress=False)
    users = np.asarray(model.user_factors, dtype=np.float32)[:, :dim]
    items = np.asarray(model.item_factors, dtype=np.float32)[:, :dim]
    # Without positives a row's factors are its random start, not a learned taste.
    users[np.diff(matrix.indptr) == 0] = 0.0
    items[np.bincount(matrix.indices, minlength=log.n_items) == 0] = 0.0
    return Embeddings(np.ascontiguousarray(users), np.ascontiguousarray(items))
