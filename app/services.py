"""Everything a running service holds, built and checked at start-up, closed at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import faiss

from app.artifacts import ArtifactsRef, serving_artifacts
from app.breaker import BreakerState, CircuitBreaker
from app.catalog import MODEL_FILE, load_catalog
from app.clients.feature_store import FeatureStore, KeySpace, connect_redis
from app.clients.ranking_model import RankingModelClient, TritonPool, connect_triton
from app.errors import DependencyError, SchemaError
from app.local_ranker import LocalRanker, load_local_ranker
from app.metrics import ServiceMetrics
from app.pipeline import RecommendPipeline
from app.rules import load_rules
from app.schema import FeatureSchema, ModelSignature, load_schema, signature_mismatches
from app.settings import Settings
from app.stages.features import UserFeatureHydrator
from app.stages.fetch import ItemFeatureHydrator
from app.stages.filter import CandidateFilter
from app.stages.rank import Scorer
from app.stages.recall import AnnCandidateSource, CandidateRecall
from app.stages.rerank import Reranker

log = logging.getLogger(__name__)
T = TypeVar("T")
STARTUP_CALL_TIMEOUT_S = 2.0


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: ServiceMetrics
    store: FeatureStore
    model: TritonPool
    artifacts: ArtifactsRef
    pipeline: RecommendPipeline
    breakers: dict[str, CircuitBreaker]
    executor: ThreadPoolExecutor
    local_ranker: LocalRanker | None
    draining: bool = field(default=False)

    def budget_s(self, requested_ms: int | None) -> float:
        """The request's budget: the configured one, or less when the caller asks for less."""
        settings = self.settings
        budget_ms = settings.request_budget_ms
        if requested_ms is not None:
            budget_ms = min(budget_ms, max(settings.min_budget_ms, float(requested_ms)))
        return budget_ms / 1000.0

    async def aclose(self) -> None:
        await self.model.close()
        await self.store.aclose()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.local_ranker is not None:
            self.local_ranker.close()


async def retry_dependency(what: str, attempt: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """Retry a start-up call while its dependency is unavailable, up to timeout_s."""
    give_up = time.monotonic() + timeout_s
    while True:
        try:
            return await attempt()
        except DependencyError as exc:
            if time.monotonic() > give_up:
                raise
            log.info("waiting for %s: %s", what, exc)
            await asyncio.sleep(0.5)


async def checked_signature(
    model: RankingModelClient, schema: FeatureSchema, timeout_s: float
) -> ModelSignature:
    """Wait for the model, then refuse to go on if it disagrees with the feature schema."""
    signature = await retry_dependency("the triton model", model.ready_signature, timeout_s)
    problems = signature_mismatches(schema, signature)
    if problems:
        raise SchemaError(
            f"Triton model {signature.name!r} at {model.url} does not match the feature "
            "schema: " + "; ".join(problems)
        )
    return signature


async def pool_signature(
    pool: TritonPool, schema: FeatureSchema, timeout_s: float
) -> ModelSignature:
    """Every endpoint checked; chunks are cut to fit the smallest max_batch_size among them."""
    signatures = await asyncio.gather(
        *(checked_signature(endpoint, schema, timeout_s) for endpoint in pool.endpoints)
    )
    return min(signatures, key=lambda signature: signature.max_batch_size)


def _breaker(
    name: str, settings: Settings, metrics: ServiceMetrics, excused: Callable[[], bool]
) -> CircuitBreaker:
    # The names come from the configuration, fixed at start-up: a small, fixed label set.
    gauge = metrics.breaker.labels(name)
    gauge.set(BreakerState.CLOSED)

    def export(state: BreakerState) -> None:
        gauge.set(state)

    return CircuitBreaker(
        name,
        settings.breaker_failures,
        settings.breaker_open_ms / 1000.0,
        on_change=export,
        excused=excused,
    )


def _local_ranker(settings: Settings, schema: FeatureSchema) -> LocalRanker | None:
    if not settings.fallback_ranker:
        log.info("fallback ranking: recall order (RECSYS_FALLBACK_RANKER is off)")
        return None
    path = settings.fallback_model or settings.artifacts_dir / MODEL_FILE
    ranker = load_local_ranker(path, schema)
    log.info("fallback ranking: %s in process with onnxruntime", path)
    return ranker


async def start_services(
    settings: Settings, metrics: ServiceMetrics, running_late: Callable[[], bool] = lambda: False
) -> Services:
    """Build and check everything; `running_late` says when timeouts are the loop's fault."""
    schema = load_schema(settings.feature_schema)
    rules = load_rules(settings.rules_file)
    # Requests already run concurrently; OpenMP threads inside one search only contend.
    faiss.omp_set_num_threads(1)
    catalog = await asyncio.to_thread(
        load_catalog, settings.artifacts_dir, schema, settings.index_nprobe
    )
    urls = settings.triton_urls
    triton_names = ["triton"] if len(urls) == 1 else [f"triton-{n}" for n in range(len(urls))]
    breakers = {
        name: _breaker(name, settings, metrics, running_late) for name in ["redis", *triton_names]
    }
    redis_timeout_s = settings.redis_timeout_ms / 1000.0
    redis = connect_redis(
        settings.redis_url,
        settings.redis_max_connections,
        redis_timeout_s,
        cluster=settings.redis_cluster,
    )
    store = FeatureStore(
        redis,
        schema,
        KeySpace(settings.redis_key_prefix),
        settings.max_seen_items,
        breakers["redis"],
    )
    model_name = settings.model_name or schema.model_name
    model = TritonPool(
        [
            connect_triton(url, model_name, settings.model_version, breakers[name])
            for url, name in zip(urls, triton_names, strict=True)
        ]
    )
    try:
        await retry_dependency(
            "redis",
            lambda: store.check_layout(STARTUP_CALL_TIMEOUT_S),
            settings.startup_timeout_s,
        )
        signature = await pool_signature(model, schema, settings.startup_timeout_s)
        local_ranker = await asyncio.to_thread(_local_ranker, settings, schema)
    except BaseException:
        await model.close()
        await store.aclose()
        raise
    artifacts = ArtifactsRef(serving_artifacts(schema, catalog, rules, signature, store.keys))
    executor = ThreadPoolExecutor(settings.recall_threads, thread_name_prefix="recall")
    pipeline = RecommendPipeline(
        features=UserFeatureHydrator(store, redis_timeout_s),
        recall=CandidateRecall(
            AnnCandidateSource(executor, settings.recall_queue),
            settings.candidate_count,
            settings.popular_candidates,
        ),
        filter=CandidateFilter(),
        fetch=ItemFeatureHydrator(store, redis_timeout_s),
        rank=Scorer(model, local_ranker, settings.triton_timeout_ms / 1000.0),
        rerank=Reranker(),
    )
    log.info(
        "serving %d items, model %s v%s (%d inputs wide, max batch %d)",
        catalog.size,
        signature.name,
        signature.version,
        schema.width,
        signature.max_batch_size,
    )
    return Services(
        settings, metrics, store, model, artifacts, pipeline, breakers, executor, local_ranker
    )
