"""An added item's vector from the users who chose it: the item side of the fold-in.

An item added while serving starts at its attributes' guess (app.world.item_prior). As
users choose it, its vector is refitted from theirs: a ridge regression of the score the
world gives an item its users chose (`target`, the mean of x_u . y_i over the world's
positives) on the vectors x_u of the users who chose it, centred on the guess g and
weighing it as much as `prior_users` users:

    y = (sum_u x_u x_u^T + mu I)^-1 (target * sum_u x_u + mu g),  mu = prior_users * E|x|^2

Each chooser's vector is taken at the world's typical user norm: a vector folded in while
serving may be scaled otherwise (a world whose users' vectors were not made by its fold-in),
and what a chooser says is its direction. With no user it is the guess; with many, the
users who chose it score it as the world's users score what they chose. It lives in the
space the world's vectors do, so the user fold-in and the ranker read it as any other item's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
# Refit at these numbers of choosers, then every REFIT_EVERY: each refit is a change in the
# catalog's log, read by every process, so they come fewer as an item's vector settles.
FIRST_REFITS = (1, 2, 4, 8, 16, 32)
REFIT_EVERY = 64
# The users kept per item to refit from: the latest, enough for a 32-dimensional fit.
KEPT_CHOOSERS = 256


def refit_due(choosers: int) -> bool:
    return choosers in FIRST_REFITS or (choosers > 0 and choosers % REFIT_EVERY == 0)


@dataclass(frozen=True, slots=True)
class ItemStep:
    target: float  # the score the world's users give what they chose, on average
    user_norm: float  # the world's users' root mean square norm
    prior_users: float = 4.0  # how many choosers the guess is worth

    def vector(self, guess: FloatArray, choosers: FloatArray) -> FloatArray:
        """The item's vector from its guess and the vectors of the users who chose it."""
        k = len(guess)
        if not len(choosers):
            return guess.astype(np.float32, copy=True)
        x = choosers.astype(np.float64)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = x / np.maximum(norms, 1e-12) * self.user_norm
        mu = self.prior_users * self.user_norm**2
        a = x.T @ x + mu * np.eye(k)
        b = self.target * x.sum(axis=0) + mu * guess.astype(np.float64)
        solved: FloatArray = np.linalg.solve(a, b).astype(np.float32)
        return solved


def item_step(
    users: FloatArray,
    items: FloatArray,
    offsets: npt.NDArray[np.int64],
    positives: npt.NDArray[np.int64],
    prior_users: float = 4.0,
    sample: int = 20_000,
) -> ItemStep:
    """The step's constants from the world: its users' vectors, item vectors, and each
    user's positives (user u's are positives[offsets[u]:offsets[u + 1]])."""
    rng = np.random.default_rng(0)
    counts = np.diff(offsets)
    owners = np.repeat(np.arange(len(counts)), counts)
    norm = max(float(np.sqrt(np.mean(np.sum(users.astype(np.float64) ** 2, axis=1)))), 1e-6)
    if not len(positives):
        return ItemStep(norm, norm, prior_users)
    picked = rng.choice(len(positives), size=min(sample, len(positives)), replace=False)
    scores = np.einsum("ij,ij->i", users[owners[picked]], items[positives[picked]])
    return ItemStep(float(np.mean(scores)), norm, prior_users)
