"""The consumer's fold-in is the world build's ALS user step: checked against implicit's own
on the same item factors and confidences (implicit comes with the operator's tools)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from threadpoolctl import threadpool_limits

from app.ingest.foldin import FoldIn
from app.world.foldin import PLAIN, FoldInParams, Weighting

implicit_als = pytest.importorskip("implicit.cpu.als")
bm25 = pytest.importorskip("implicit.nearest_neighbours")


def _implicit_user(items: np.ndarray, confidences: csr_matrix, regularization: float) -> np.ndarray:
    with threadpool_limits(1, "blas"):
        model = implicit_als.AlternatingLeastSquares(
            factors=items.shape[1], regularization=regularization, use_cg=False
        )
    model.item_factors = items.astype(np.float32)
    model.user_factors = np.zeros((1, items.shape[1]), dtype=np.float32)
    return np.asarray(model.recalculate_user(0, confidences)).ravel()


def test_plain_counts_fold_in_as_implicit_does() -> None:
    rng = np.random.default_rng(3)
    items = rng.normal(size=(50, 8)).astype(np.float32)
    positives = np.array([3, 7, 7, 20, 41])
    counts = csr_matrix(([1.0, 2.0, 1.0, 1.0], ([0, 0, 0, 0], [3, 7, 20, 41])), shape=(1, 50))
    ours = FoldIn(items, PLAIN).vector(positives)
    np.testing.assert_allclose(
        ours, _implicit_user(items, counts, PLAIN.regularization), rtol=1e-4, atol=1e-5
    )


def test_bm25_weights_fold_in_as_the_build_weighs_them() -> None:
    rng = np.random.default_rng(5)
    n_users, n_items = 40, 30
    dense = (rng.random((n_users, n_items)) < 0.2) * rng.integers(1, 3, (n_users, n_items))
    matrix = csr_matrix(dense.astype(np.float32))
    weighted = bm25.bm25_weight(matrix, K1=100.0, B=0.8).tocsr()
    document_frequency = np.bincount(matrix.indices, minlength=n_items)
    params = FoldInParams(
        weighting=Weighting.BM25,
        regularization=0.05,
        idf=(np.log(n_users) - np.log1p(document_frequency)).astype(np.float32),
        average_length=float(np.asarray(matrix.sum(axis=1)).mean()),
    )
    items = rng.normal(size=(n_items, 6)).astype(np.float32)
    user = int(np.argmax(dense.sum(axis=1)))
    positives = np.repeat(np.arange(n_items), dense[user])
    ours = FoldIn(items, params).vector(positives)
    np.testing.assert_allclose(
        ours, _implicit_user(items, weighted[user], 0.05), rtol=1e-3, atol=1e-4
    )


def test_no_positives_fold_in_to_zeros() -> None:
    items = np.ones((4, 3), dtype=np.float32)
    assert FoldIn(items, PLAIN).vector(np.empty(0, dtype=np.int64)).tolist() == [0.0, 0.0, 0.0]
