"""Everything a running service holds, built and checked at start-up, closed at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import faiss

from app.artifacts import ArtifactsRef, serving_artifacts
from app.catalog import load_catalog
from app.clients.feature_store import FeatureStore, KeySpace, connect_redis
from app.clients.ranking_model import RankingModelClient, connect_triton
from app.errors import DependencyError, SchemaError
from app.metrics import ServiceMetrics
from app.pipeline import RecommendPipeline
from app.rules import load_rules
from app.schema import FeatureSchema, ModelSignature, load_schema, signature_mismatches
from app.settings import Settings
from app.stages.features import UserFeatureHydrator
from app.stages.fetch import ItemFeatureHydrator
from app.stages.rank import Scorer
from app.stages.recall import AnnCandidateSource, CandidateRecall
from app.stages.rerank import Reranker

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: ServiceMetrics
    store: FeatureStore
    model: RankingModelClient
    artifacts: ArtifactsRef
    pipeline: RecommendPipeline
    executor: ThreadPoolExecutor

    async def aclose(self) -> None:
        await self.model.close()
        await self.store.aclose()
        self.executor.shutdown(wait=False, cancel_futures=True)


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
            f"Triton model {signature.name!r} does not match the feature schema: "
            + "; ".join(problems)
        )
    return signature


async def start_services(settings: Settings, metrics: ServiceMetrics) -> Services:
    schema = load_schema(settings.feature_schema)
    rules = load_rules(settings.rules_file)
    # Requests already run concurrently; OpenMP threads inside one search only contend.
    faiss.omp_set_num_threads(1)
    catalog = await asyncio.to_thread(
        load_catalog, settings.artifacts_dir, schema, settings.index_nprobe
    )
    timeout_s = settings.redis_timeout_ms / 1000.0
    redis = connect_redis(settings.redis_url, settings.redis_max_connections, timeout_s)
    store = FeatureStore(
        redis, schema, KeySpace(settings.redis_key_prefix), settings.max_seen_items
    )
    model_name = settings.model_name or schema.model_name
    model = connect_triton(settings.triton_url, model_name, settings.model_version)
    try:
        await retry_dependency("redis", store.check_layout, settings.startup_timeout_s)
        signature = await checked_signature(model, schema, settings.startup_timeout_s)
    except BaseException:
        await model.close()
        await store.aclose()
        raise
    artifacts = ArtifactsRef(serving_artifacts(schema, catalog, rules, signature, store.keys))
    executor = ThreadPoolExecutor(settings.recall_threads, thread_name_prefix="recall")
    pipeline = RecommendPipeline(
        features=UserFeatureHydrator(store),
        recall=CandidateRecall(
            AnnCandidateSource(executor), settings.candidate_count, settings.popular_candidates
        ),
        fetch=ItemFeatureHydrator(store),
        rank=Scorer(model),
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
    return Services(settings, metrics, store, model, artifacts, pipeline, executor)
