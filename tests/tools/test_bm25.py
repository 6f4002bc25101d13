"""BM25 is written once (app.world.foldin.bm25) and is implicit's bm25_weight, which the
build's own confidence matrix is made with: the fold-in and the Spark engine weigh as ALS
learnt."""

from __future__ import annotations

import numpy as np
from implicit.nearest_neighbours import bm25_weight
from scipy.sparse import csr_matrix

from app.world.foldin import BM25_B, BM25_K1, bm25, bm25_idf


def test_the_one_formula_is_implicits_bm25_weight() -> None:
    rng = np.random.default_rng(3)
    dense = rng.integers(0, 4, size=(40, 25)).astype(np.float64)
    dense[:, 7] = 0.0  # an item nobody chose
    dense[5] = 0.0  # a user who chose nothing
    counts = csr_matrix(dense)
    expected = bm25_weight(counts, K1=BM25_K1, B=BM25_B).toarray()
    idf = bm25_idf(counts.shape[0], np.bincount(counts.indices, minlength=counts.shape[1]))
    lengths = dense.sum(axis=1)
    average = float(lengths.mean())
    for user in range(dense.shape[0]):
        chosen = np.flatnonzero(dense[user])
        weights = bm25(dense[user, chosen], lengths[user], average, idf[chosen], BM25_K1, BM25_B)
        np.testing.assert_allclose(weights, expected[user, chosen], rtol=1e-12)
