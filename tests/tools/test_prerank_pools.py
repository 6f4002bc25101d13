"""Pre-rank is fitted on the pools the service's own candidate stages build: recall's every
source (the nearest items, the popular ones, those near the latest positives) less what the
user has seen, not a copy of the nearest and the neighbours alone."""

from __future__ import annotations

import numpy as np
from recsys_tools.world.judge.served_view import Recent
from recsys_tools.world.judge.service_stages import ServiceStages
from recsys_tools.world.learn.prerank import CANDIDATES, user_pools

from app.core.cascade import POPULAR_CANDIDATES
from app.world.neighbours import Neighbours
from app.world.prerank import PrerankWeights
from app.world.schema import load_schema

SCHEMA = load_schema()


def test_the_fit_pools_hold_what_every_source_of_the_service_recalls() -> None:
    rng = np.random.default_rng(3)
    n_items, dim = CANDIDATES + 600, SCHEMA.embedding_dim
    items = rng.normal(size=(n_items, dim)).astype(np.float32)
    user = rng.normal(size=(1, dim)).astype(np.float32)
    # Farthest from the user's vector first: recall's nearest never reaches these.
    far = np.argsort(items @ user[0], kind="stable").astype(np.int64)
    popular = far[:POPULAR_CANDIDATES]  # the most popular items are the farthest
    recent = far[200:201]
    near_recent = far[300:310]  # ...and so are the neighbours of the user's latest positive
    positions = np.full((n_items, len(near_recent)), -1, dtype=np.int32)
    positions[recent[0]] = near_recent
    neighbours = Neighbours(positions, np.ones(positions.shape, dtype=np.float32))
    categories = np.zeros(n_items, dtype=np.int64)
    stages = ServiceStages(SCHEMA, None, items, far, categories, neighbours, PrerankWeights())
    seen = np.sort(np.array([popular[0], near_recent[0]], dtype=np.int64))
    liked = np.array([popular[5]], dtype=np.int64)

    pools = user_pools(
        np.array([0]),
        user,
        items,
        stages,
        neighbours,
        Recent(np.array([0, 1]), recent),
        seen,
        liked,
        categories,
    )

    # The user is kept because the popular source found what they went on to like.
    assert pools.users.tolist() == [0]
    pool = set(pools.pools[0].tolist())
    assert set(popular[1:].tolist()) <= pool
    assert set(near_recent[1:].tolist()) <= pool
    assert pool.isdisjoint(seen.tolist())
    assert pools.labels[0].sum() == 1
    assert len(pools.signals[0]) == len(pools.pools[0])
