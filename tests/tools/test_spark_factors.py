"""The Spark engine's ALS step against the implicit library's own, on one small matrix."""

from __future__ import annotations

import numpy as np
from implicit.cpu.als import user_factor
from recsys_tools.world.spark.factors import SOLVE_BATCH, solve_keys, start_factors
from scipy.sparse import csr_matrix


def test_each_key_is_solved_as_the_implicit_user_step_solves_it() -> None:
    rng = np.random.default_rng(3)
    users, items, dim = SOLVE_BATCH + 40, 60, 8  # more keys than one batched solve
    dense = (rng.random((users, items)) < 0.1) * rng.uniform(0.2, 5.0, (users, items))
    dense[5] = 0.0  # a user with nothing chosen is left out, as the local solver zeroes them
    matrix = csr_matrix(dense.astype(np.float32))
    factors = rng.normal(0.0, 0.3, (items, dim)).astype(np.float32)
    coo = matrix.tocoo()
    shuffled = rng.permutation(coo.nnz)  # a partition's rows come in any order
    keys, solved = solve_keys(
        coo.row[shuffled].astype(np.int64),
        coo.col[shuffled].astype(np.int64),
        coo.data[shuffled].astype(np.float64),
        factors,
        10.0,
    )
    assert 5 not in keys
    assert np.array_equal(keys, np.flatnonzero(np.diff(matrix.indptr)))
    gram = factors.T @ factors
    for slot in (0, 1, len(keys) // 2, len(keys) - 1):
        user = int(keys[slot])
        theirs = user_factor(factors, gram, matrix, user, 10.0, dim)
        assert np.allclose(solved[slot], theirs, rtol=1e-3, atol=1e-5), user


def test_the_start_is_the_implicit_librarys_seeded_draw() -> None:
    users, items = start_factors(4, 3, 2, seed=9)
    rng = np.random.default_rng(9)
    assert np.array_equal(users, rng.random((4, 2), dtype=np.float32) * np.float32(0.01))
    assert np.array_equal(items, rng.random((3, 2), dtype=np.float32) * np.float32(0.01))
