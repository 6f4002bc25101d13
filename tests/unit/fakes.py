"""Stand-ins for Redis, FAISS and Triton behind the stages' protocols, on a six-item catalog.

Items i0..i5; item blobs are [embedding(2) | price(1)] with price = the item's number, so the
fake model (score = price / 10) ranks i5 first. Tests of the real clients use real servers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from app.clients.feature_store import FLOAT32, BlobState, ItemBlobs, UserRecord, decode_item_blobs
from app.core.errors import DependencyError, FailureKind, RankingModelError
from app.core.metrics import ServiceMetrics
from app.core.vocabulary import Positions, Scores
from app.pipeline.context import RequestContext
from app.pipeline.recommend import RecommendPipeline, build_pipeline, candidate_stages
from app.pipeline.stages.features import UserFeatureHydrator
from app.pipeline.stages.fetch import ItemFeatureHydrator
from app.pipeline.stages.rank import Scorer
from app.pipeline.stages.rerank import Reranker
from app.pipeline.types import Asked, Query, UserFeatures
from app.release.artifacts import ServingArtifacts, serving_artifacts
from app.release.catalog import Catalog
from app.release.keyspace import KeySpace
from app.release.plan import ModelAnswer, ModelRouting, Routed
from app.release.rules import RerankRules
from app.world.schema import ModelSignature
from tests.unit.tiny_schema import tiny_schema

N_ITEMS = 6
ITEM_IDS = [f"i{n}" for n in range(N_ITEMS)]
NOW = 1_700_000_000.0
KEYS = KeySpace("t")


def artifacts(rules: RerankRules | None = None) -> ServingArtifacts:
    schema = tiny_schema()
    catalog = Catalog(
        item_ids=np.array(ITEM_IDS),
        categories=np.arange(N_ITEMS, dtype=np.int64),
        published_at=np.full(N_ITEMS, NOW - 365 * 86_400, dtype=np.int64),
        # Popularity: i0 most popular, then i1...
        popular_order=np.arange(N_ITEMS, dtype=np.int64),
        default_user_blob=np.array([0.0, 0.0, -1.0], dtype=np.float32),
        index=None,
    )
    model = ModelSignature("m", "1", "features", "FP32", (-1, schema.width), "score", "FP32", 4)
    routing = ModelRouting(Routed("", model))
    return serving_artifacts(schema, catalog, rules or RerankRules(), routing, KEYS)


def context(budget_s: float = 0.1, reserve_s: float = 0.01) -> RequestContext:
    return RequestContext(
        request_id="r1",
        deadline=time.monotonic() + budget_s,
        reserve_s=reserve_s,
        artifacts=artifacts(),
        metrics=ServiceMetrics(),
    )


def item_blob(n: int) -> bytes:
    return np.array([1.0, float(n), float(n)], dtype=FLOAT32).tobytes()


def user_record(seen: Sequence[int] = ()) -> UserRecord:
    """A stored user; `seen` holds catalog positions, which are the item numbers here."""
    blob = np.array([1.0, 0.5, 2.0], dtype=np.float32)
    return UserRecord(blob, BlobState.PRESENT, np.array(seen, dtype=np.int64))


@dataclass
class FakeUserStore:
    record: UserRecord = field(default_factory=user_record)
    error: DependencyError | None = None
    timeouts: list[float] = field(default_factory=list)

    async def user(self, user_id: str, timeout_s: float) -> UserRecord:
        self.timeouts.append(timeout_s)
        if self.error is not None:
            raise self.error
        return self.record


@dataclass
class FakeItemStore:
    """Blobs by item key; a key left out has no blob."""

    blobs: dict[bytes, bytes | None] = field(
        default_factory=lambda: {
            KEYS.item(i).encode(): item_blob(n) for n, i in enumerate(ITEM_IDS)
        }
    )
    error: DependencyError | None = None
    requested: list[bytes] = field(default_factory=list)

    async def items(self, keys: Sequence[bytes], timeout_s: float) -> ItemBlobs:
        self.requested = list(keys)
        if self.error is not None:
            raise self.error
        return decode_item_blobs([self.blobs.get(key) for key in keys], 3)


@dataclass
class FakeSearch:
    """Nearest neighbours: i3, i4, i5 in that order (an index would rank by the user)."""

    hits: list[int] = field(default_factory=lambda: [3, 4, 5])
    error: DependencyError | None = None

    async def search(
        self, catalog: Catalog, vector: npt.NDArray[np.float32], k: int, timeout_s: float
    ) -> Positions:
        if self.error is not None:
            raise self.error
        return np.array(self.hits[:k], dtype=np.int64)


def price_scores(rows: npt.NDArray[np.float32]) -> Scores:
    schema = tiny_schema()
    price = rows[:, schema.blocks["item_dense"]].reshape(-1)
    return (price / 10.0).astype(np.float32)


@dataclass
class FakeModel:
    error: RankingModelError | None = None
    override: Scores | None = None
    calls: int = 0
    versions: list[str] = field(default_factory=list)  # as asked, one per call
    guarded: list[bool] = field(default_factory=list)  # whether each call went by the breaker
    rows: list[int] = field(default_factory=list)  # rows in each call
    failing_versions: dict[str, RankingModelError] = field(default_factory=dict)
    url: str = "fake:8001"

    async def score(
        self,
        rows: npt.NDArray[np.float32],
        routed: Routed,
        timeout_s: float,
        request_id: str,
        guarded: bool = True,
    ) -> ModelAnswer:
        self.calls += 1
        self.versions.append(routed.version)
        self.guarded.append(guarded)
        self.rows.append(len(rows))
        failing = self.failing_versions.get(routed.version)
        if failing is not None:
            raise failing
        if self.error is not None:
            raise self.error
        scores = self.override if self.override is not None else price_scores(rows)
        return ModelAnswer(scores, routed.version or "1")


@dataclass
class FakeFallback:
    """Scores at most `fits` rows, as the in-process ranker does when time is short."""

    fits: int = 100

    async def score(self, rows: npt.NDArray[np.float32], timeout_s: float) -> Scores:
        if self.fits == 0:
            raise RankingModelError(FailureKind.TIMEOUT, "no time left to rank in process")
        return price_scores(rows[: self.fits])


@dataclass
class World:
    users: FakeUserStore = field(default_factory=FakeUserStore)
    items: FakeItemStore = field(default_factory=FakeItemStore)
    search: FakeSearch = field(default_factory=FakeSearch)
    model: FakeModel = field(default_factory=FakeModel)
    fallback: FakeFallback | None = None

    def pipeline(self, candidates: int = 3, popular: int = 1) -> RecommendPipeline:
        return build_pipeline(
            features=UserFeatureHydrator(
                self.users, 0.02, clock=lambda: datetime(2024, 1, 1, 10, tzinfo=UTC)
            ),
            candidates=candidate_stages(
                search=self.search, candidate_count=candidates, popular_count=popular
            ),
            fetch=ItemFeatureHydrator(self.items, 0.02),
            rank=Scorer(self.model, self.fallback, 0.05),
            rerank=Reranker(clock=lambda: NOW),
        )


def asked(
    num_items: int = 3,
    seen: Sequence[int] = (),
    exclude: frozenset[str] = frozenset(),
    user_id: str = "u1",
) -> Asked:
    """A request for `user_id` whose features were read: blob and context are zeros."""
    user = UserFeatures(
        np.zeros(4, np.float32), np.zeros(3, np.float32), np.array(seen, np.int64), False
    )
    return Asked(Query(user_id, num_items, exclude), user)
