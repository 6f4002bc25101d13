"""The item step: an added item's vector from its guess and the users who chose it."""

from __future__ import annotations

import numpy as np

from app.ingest.item_step import ItemStep, item_step, refit_due


def test_without_choosers_the_vector_is_the_guess() -> None:
    guess = np.array([0.3, -0.2], dtype=np.float32)
    np.testing.assert_array_equal(
        ItemStep(0.5, 1.0).vector(guess, np.empty((0, 2), dtype=np.float32)), guess
    )


def test_choosers_pull_the_vector_until_they_score_it_as_the_world_does() -> None:
    step = ItemStep(target=0.5, user_norm=1.0)
    guess = np.array([0.0, 1.0], dtype=np.float32)  # the attributes say: like the y-axis
    chooser = np.array([[1.0, 0.0]], dtype=np.float32)  # the users who chose it say: x-axis
    scores = [
        float(chooser[0] @ step.vector(guess, np.repeat(chooser, n, axis=0))) for n in (1, 4, 64)
    ]
    assert scores[0] < scores[1] < scores[2]
    assert abs(scores[2] - 0.5) < 0.05
    # Its guessed side fades no faster than the evidence against it comes.
    assert step.vector(guess, np.repeat(chooser, 64, axis=0))[1] > 0.0


def test_refits_come_fewer_as_the_vector_settles() -> None:
    assert [n for n in range(1, 200) if refit_due(n)] == [1, 2, 4, 8, 16, 32, 64, 128, 192]


def test_the_constants_come_from_what_the_worlds_users_chose() -> None:
    users = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    items = np.array([[0.5, 0.0], [0.0, 0.25], [9.0, 9.0]], dtype=np.float32)
    # user 0 chose item 0 (0.5), user 1 chose item 1 (0.5).
    step = item_step(users, items, np.array([0, 1, 2]), np.array([0, 1]), prior_users=2.0)
    assert step.target == 0.5
    assert step.user_norm == np.sqrt((1.0 + 4.0) / 2)
    # A chooser folded in at another scale says the same: its direction.
    small = step.vector(np.zeros(2, np.float32), np.array([[0.01, 0.0]], np.float32))
    large = step.vector(np.zeros(2, np.float32), np.array([[10.0, 0.0]], np.float32))
    np.testing.assert_allclose(small, large, rtol=1e-6)
