"""The service's own candidate stages (recall's sources, the filters, pre-rank), run over a
world held in memory: the evaluation's pools are the service's, made by the same objects in
the same order (app.pipeline.recommend.candidate_stages), not a copy of them.

What the service reads from Redis per request (the user's vector, seen list, latest
positives) comes from the evaluation's query instead; trending is empty, as in a world just
loaded; the rules block nothing. The stages' settings are the service's defaults unless
given.
"""

from __future__ import annotations

import math
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from app.core.metrics import ServiceMetrics
from app.core.settings import Settings
from app.core.vocabulary import Positions
from app.pipeline.context import RequestContext
from app.pipeline.recommend import CandidateStages, candidate_stages
from app.pipeline.types import Asked, Query, UserFeatures
from app.release.artifacts import ServingArtifacts, serving_artifacts
from app.release.catalog import Catalog
from app.release.keyspace import KeySpace
from app.release.plan import ModelRouting, Routed
from app.release.rules import NEUTRAL_RULES
from app.world.neighbours import Nearby, Neighbours
from app.world.order import NO_TASTE, Taste
from app.world.prerank import PrerankWeights
from app.world.schema import FeatureSchema, ModelSignature

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]
T = TypeVar("T")
# The answer the evaluation asks for: ten items, as its figures are @10.
ASKED = 10


class FoundSearch:
    """A search already made: the evaluation searches every user's vector at once (one FAISS
    call for many), and recall takes each user's first `k` of it."""

    def __init__(self) -> None:
        self.found: IntArray = np.empty(0, dtype=np.int64)

    async def search(
        self, catalog: Catalog, vector: FloatArray, k: int, timeout_s: float
    ) -> Positions:
        if k > len(self.found):
            raise ValueError(f"the evaluation searched {len(self.found)} deep, recall asks {k}")
        found: Positions = self.found[:k]
        return found[found >= 0]


def _artifacts(
    schema: FeatureSchema,
    index: Any,
    vectors: FloatArray,
    popular: IntArray,
    categories: IntArray,
    neighbours: Neighbours | None,
    prerank: PrerankWeights,
) -> ServingArtifacts:
    size = len(popular)
    catalog = Catalog(
        item_ids=np.arange(size).astype(np.str_),
        categories=categories,
        published_at=np.zeros(size, dtype=np.int64),
        popular_order=popular,
        default_user_blob=np.zeros(schema.embedding_dim, dtype=np.float32),
        index=index,
        vectors=vectors,
        neighbours=neighbours,
        prerank=prerank,
    )
    # Never asked: the candidate stages call no model.
    model = ModelSignature("offline", "", "", "FP32", (), "", "FP32", 0)
    routing = ModelRouting(Routed("", model))
    return serving_artifacts(schema, catalog, NEUTRAL_RULES, routing, KeySpace("offline"))


class ServiceStages:
    """The service's candidate stages over one world's arrays, a user at a time."""

    def __init__(
        self,
        schema: FeatureSchema,
        index: Any,
        vectors: FloatArray,
        popular: IntArray,
        categories: IntArray,
        neighbours: Neighbours | None,
        prerank: PrerankWeights,
        settings: Settings | None = None,
    ) -> None:
        # The defaults, as a service started without RECSYS_* variables has them.
        given = Settings.model_construct() if settings is None else settings
        self._search = FoundSearch()
        self._stages: CandidateStages = candidate_stages(
            search=self._search,
            candidate_count=given.candidate_count,
            popular_count=given.popular_candidates,
            trending_count=given.trending_candidates,
            similar_count=given.similar_candidates,
            recent_decay=given.recent_decay,
            prerank_keep=given.prerank_keep,
        )
        self._artifacts = _artifacts(
            schema, index, vectors, popular, categories, neighbours, prerank
        )
        self._metrics = ServiceMetrics()

    def pools(
        self,
        found: IntArray,
        blob: FloatArray,
        seen: IntArray,
        recent: IntArray,
        near: Nearby,
        taste: Taste = NO_TASTE,
    ) -> tuple[IntArray, IntArray]:
        """The pool after the filters and what pre-rank hands the model, as positions, for a
        user of this `blob` who has `seen` and chose `recent` last (whose `near` items are
        those, and `taste` what the order model makes of them); `found`: their vector's
        nearest items, deep enough for recall."""
        self._search.found = found
        features = UserFeatures(
            blob=blob,
            context_row=np.zeros(0, dtype=np.float32),
            seen=seen,
            cold_start=False,
            recent=recent,
            nearby=near,
            taste=taste,
        )
        asked = Asked(Query("offline", ASKED), features)
        ctx = RequestContext("offline", math.inf, 0.0, self._artifacts, self._metrics)
        pool, handed = _to_the_end(self._stages.run(asked, ctx))
        return pool.positions, handed.positions


def _to_the_end(running: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result, run without an event loop: over a world in memory no stage
    waits on anything (no Redis, a search already made), so it finishes at its first step,
    thousands of users a second; one that would wait is an error, not a hang."""
    try:
        running.send(None)
    except StopIteration as finished:
        result: T = finished.value
        return result
    running.close()
    raise RuntimeError("a candidate stage waited on I/O over a world in memory")
