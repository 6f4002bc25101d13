"""Everything a running service of one world holds, built and checked at start-up, closed at
shutdown: its settings, metrics, clients behind their breakers, logs and exit stack, around
what its answers are made from (app.process.served_world). Two worlds served side by side
are two of these (app.process.worlds)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import faiss

from app.clients.answer_log import AnswerLog
from app.clients.breaker import CircuitBreaker
from app.clients.catalog_log import CatalogLog
from app.clients.event_log import EventLog
from app.clients.exposure import Exposure
from app.clients.feature_store import FeatureStore
from app.clients.item_memory import (
    ItemMatrix,
    ItemMemory,
    read_item_matrix,
)
from app.clients.local_ranker import LocalRanker, load_local_ranker
from app.clients.trending import TrendingItems
from app.clients.triton_pool import TritonPool
from app.core.cached import CachedCall
from app.core.metrics import ServiceMetrics
from app.core.outcomes import AnswerLogged
from app.core.realtime_settings import seconds
from app.core.settings import Settings
from app.pipeline.recommend import RecommendPipeline, build_pipeline, candidate_stages
from app.pipeline.shadow import ShadowCalls
from app.pipeline.sources.ann import InlineSearch, PooledSearch, VectorSearch
from app.pipeline.stages.features import UserFeatureHydrator
from app.pipeline.stages.fetch import HeldItemHydrator, ItemFeatureHydrator
from app.pipeline.stages.rank import Scorer
from app.pipeline.stages.rerank import Reranker
from app.pipeline.step import Step
from app.pipeline.trace import TraceRing
from app.pipeline.types import Hydrated, Pool
from app.process.catalog_follower import CatalogFollower, replayed
from app.process.connections import breakers_for, open_clients
from app.process.model_inputs import widest_with_memory
from app.process.reload import Reloader, model_routing
from app.process.served_world import ServedWorld
from app.process.startup_checks import (
    STARTUP_CALL_TIMEOUT_S,
    checked_redis,
    opened_catalog,
    opened_world,
)
from app.release.artifacts import ArtifactsRef, ServingArtifacts, serving_artifacts
from app.release.catalog import Catalog, with_room
from app.release.plan import ReleasePlan, read_plan
from app.release.rules import RerankRules, load_rules
from app.release.world_match import files_identity
from app.world.layout import MODEL_FILE
from app.world.schema import FeatureSchema
from app.world.stamp import WorldStamp

log = logging.getLogger(__name__)
READINESS_TTL_S = 1.0


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: ServiceMetrics
    store: FeatureStore
    model: TritonPool
    breakers: dict[str, CircuitBreaker]
    shadow: ShadowCalls
    # Closes what start-up opened, in the reverse order (shadow calls first, Redis last).
    closing: AsyncExitStack
    events: EventLog
    served: ServedWorld
    # What answers showed, for the archive; None with RECSYS_ANSWER_LOG_SAMPLE=0.
    answers: AnswerLog | None = None
    # The recent requests' traces, with the debug pages on (app/pipeline/trace.py).
    traces: TraceRing | None = None
    draining: bool = field(default=False)
    # "Why not item X" runs at once (app/api/debug.py): a few, outside /recommend's admission.
    explaining: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    # What readiness last learnt from Redis and Triton (app.process.health), reused for a second.
    readiness_checks: CachedCall[dict[str, bool]] = field(
        default_factory=lambda: CachedCall(READINESS_TTL_S)
    )

    def budget_s(self, requested_ms: int | None) -> float:
        """The request's budget: the configured one, or less when the caller asks for less."""
        settings = self.settings
        budget_ms = settings.request_budget_ms
        if requested_ms is not None:
            budget_ms = min(budget_ms, max(settings.min_budget_ms, float(requested_ms)))
        return seconds(budget_ms)

    def shortened(self, budget_s: float) -> bool:
        """Whether a budget is below the configured one (its caller asked for less)."""
        return budget_s < self.settings.request_budget_s

    async def aclose(self) -> None:
        await self.closing.aclose()


async def held_item_features(
    settings: Settings,
    store: FeatureStore,
    artifacts: ServingArtifacts,
    metrics: ServiceMetrics,
    world: WorldStamp | None,
) -> ItemMemory | None:
    """Every item's features read into memory (RECSYS_ITEM_FEATURES=full), or None."""
    if settings.item_features == "off":
        return None
    started = time.perf_counter()
    version = await store.items_version(STARTUP_CALL_TIMEOUT_S) or ""
    width = artifacts.schema.item_blob_width
    matrix = await read_item_matrix(store, artifacts.item_keys, width, version)
    metrics.items_without_features.set(matrix.missing)

    def counted(swapped: ItemMatrix | None) -> None:
        metrics.refresh_count[swapped is not None].inc()
        if swapped is not None:
            metrics.items_without_features.set(swapped.missing)

    world_id = world.world_id if world else ""
    memory = ItemMemory(store, artifacts.item_keys, width, matrix, counted, world_id)
    log.info(
        "item features held in memory: %d items (%.0f MB, %d without features) in %.1f s",
        len(matrix.usable),
        matrix.blobs.nbytes / 2**20,
        matrix.missing,
        time.perf_counter() - started,
    )
    return memory


def _local_ranker(settings: Settings, schema: FeatureSchema) -> LocalRanker | None:
    if not settings.fallback_ranker:
        log.info("fallback ranking: recall order (RECSYS_FALLBACK_RANKER is off)")
        return None
    path = settings.fallback_model or settings.artifacts_dir / MODEL_FILE
    ranker = load_local_ranker(path, schema)
    log.info("fallback ranking: %s in process with onnxruntime", path)
    return ranker


def _search(settings: Settings, stack: AsyncExitStack) -> VectorSearch:
    if not settings.recall_threads:
        return InlineSearch()
    executor = ThreadPoolExecutor(settings.recall_threads, thread_name_prefix="recall")
    stack.callback(executor.shutdown, wait=False, cancel_futures=True)
    return PooledSearch(executor, settings.recall_queue)


def _trending(
    settings: Settings, store: FeatureStore, artifacts: ArtifactsRef, metrics: ServiceMetrics
) -> TrendingItems:
    """The trending items, read for the catalog being served (it may grow at a reload)."""
    return TrendingItems(
        store.client,
        store.keys,
        settings.trending_candidates,
        lambda: artifacts.current.catalog.size,
        lambda read: metrics.trending_count[read].inc(),
    )


def _answer_log(
    settings: Settings, store: FeatureStore, metrics: ServiceMetrics
) -> AnswerLog | None:
    if settings.answer_log_sample <= 0.0:
        return None

    def counted(result: AnswerLogged, n: int) -> None:
        metrics.answer_log_count[result].inc(n)

    return AnswerLog(
        store.client, store.keys, settings.answer_log_sample, settings.answer_log_max, counted
    )


def _trace_ring(settings: Settings) -> TraceRing | None:
    """The recent requests' traces, with the debug pages on."""
    if not settings.debug_pages:
        return None
    return TraceRing(settings.trace_ring_size, settings.trace_sample_percent)


def _pipeline(
    settings: Settings,
    store: FeatureStore,
    search: VectorSearch,
    item_memory: ItemMemory | None,
    scorer: Scorer,
    trending: TrendingItems,
    follower: CatalogFollower | None,
    exposure: Exposure | None = None,
) -> RecommendPipeline:
    """The stages, each with the clients it calls, in the order recommend.py writes."""
    fetch: Step[Pool, Hydrated] = (
        HeldItemHydrator(item_memory)
        if item_memory is not None
        else ItemFeatureHydrator(store, settings.redis_timeout_s)
    )
    candidates = candidate_stages(
        search=search,
        candidate_count=settings.candidate_count,
        popular_count=settings.popular_candidates,
        trending=lambda: trending.current,
        trending_count=settings.trending_candidates,
        similar_count=settings.similar_candidates,
        recent_decay=settings.recent_decay,
        prerank_keep=settings.prerank_keep,
        arrival_count=settings.arrival_candidates,
        viewed_count=settings.viewed_candidates,
        prerank_newcomers=settings.prerank_newcomers,
    )
    return build_pipeline(
        features=UserFeatureHydrator(
            store, settings.redis_timeout_s, decay=settings.recent_decay, catalog=follower
        ),
        candidates=candidates,
        fetch=fetch,
        rank=scorer,
        rerank=Reranker(exposure=exposure),
        recent_decay=settings.recent_decay,
    )


@dataclass(frozen=True, slots=True)
class _Opened:
    """What start-up reads from the world's directory and the configuration's files."""

    stamp: WorldStamp | None
    schema: FeatureSchema
    rules: RerankRules
    plan: ReleasePlan
    catalog: Catalog


async def _opened(settings: Settings) -> _Opened:
    stamp, schema = await asyncio.to_thread(opened_world, settings)
    rules = load_rules(settings.rules_file)
    plan = read_plan(settings.release_file, settings.model_version)
    catalog = await asyncio.to_thread(opened_catalog, settings, schema)
    # Copies the catalog's arrays (tens of MB): off the loop, which may be serving already
    # (a candidate world loaded beside the stable one).
    catalog = await asyncio.to_thread(
        with_room, catalog, settings.catalog_headroom, schema.item_blob_width
    )
    return _Opened(stamp, schema, rules, plan, catalog)


@dataclass(frozen=True, slots=True)
class _Logs:
    """The streams the service writes beside its answers, each closed with the stack."""

    events: EventLog
    answers: AnswerLog | None


def _logs(
    settings: Settings, store: FeatureStore, metrics: ServiceMetrics, stack: AsyncExitStack
) -> _Logs:
    events = EventLog(
        store.client, store.keys, settings.event_partitions, settings.event_stream_max
    )
    stack.push_async_callback(events.aclose)
    answers = _answer_log(settings, store, metrics)
    if answers is not None:
        stack.push_async_callback(answers.aclose)
    return _Logs(events, answers)


@dataclass(frozen=True, slots=True)
class _Following:
    """The world's catalog changes while serving and what follows them; None without room."""

    changes: CatalogLog | None = None
    follower: CatalogFollower | None = None
    # Items added while serving are explored: their showings and positives, counted.
    exposure: Exposure | None = None


async def _following(
    settings: Settings,
    store: FeatureStore,
    stamp: WorldStamp | None,
    artifacts: ArtifactsRef,
    item_memory: ItemMemory | None,
    metrics: ServiceMetrics,
) -> _Following:
    world_id = stamp.world_id if stamp else ""
    timeout_s = settings.startup_timeout_s
    following = await replayed(
        store.client, store.keys, world_id, artifacts, item_memory, metrics, timeout_s
    )
    if following is None:
        return _Following()
    changes, follower = following
    store.catalog_seq_key = changes.withdrawn_seq_key
    exposure = Exposure(store.client, store.keys, world_id, lambda: artifacts.current.catalog.rows)
    return _Following(changes, follower, exposure)


async def _scorer(
    settings: Settings,
    model: TritonPool,
    schema: FeatureSchema,
    metrics: ServiceMetrics,
    stack: AsyncExitStack,
) -> tuple[Scorer, ShadowCalls]:
    """Triton's scorer, with its in-process fallback and the shadow calls beside it."""
    local_ranker = await asyncio.to_thread(_local_ranker, settings, schema)
    stack.callback(lambda: local_ranker.close() if local_ranker is not None else None)
    shadow = ShadowCalls(model, metrics, settings.triton_timeout_s, settings.shadow_max_in_flight)
    stack.push_async_callback(shadow.aclose)
    return Scorer(model, local_ranker, settings.triton_timeout_s, shadow), shadow


async def start_services(
    settings: Settings, metrics: ServiceMetrics, running_late: Callable[[], bool] = lambda: False
) -> Services:
    """Build and check everything; `running_late` says when timeouts are the loop's fault.

    Whatever is opened is closed again if a later step fails (an exit stack), and by
    Services.aclose once the service stops.
    """
    # Requests already run concurrently; OpenMP threads inside one search only contend.
    faiss.omp_set_num_threads(1)
    opened = await _opened(settings)
    stamp, schema = opened.stamp, opened.schema
    breakers = breakers_for(settings, metrics, running_late)
    async with AsyncExitStack() as stack:
        store, loading, model = open_clients(settings, schema, breakers, stack)
        await checked_redis(store, stamp, settings.startup_timeout_s)
        routing = await model_routing(opened.plan, model, schema, stamp, settings.startup_timeout_s)
        signature = await widest_with_memory(settings, model, schema, routing.signatures())
        scorer, shadow = await _scorer(settings, model, schema, metrics, stack)
        identity = files_identity(settings.artifacts_dir, stamp)
        artifacts = ArtifactsRef(
            await asyncio.to_thread(
                serving_artifacts,
                *(schema, opened.catalog, opened.rules, routing, store.keys, identity),
            )
        )
        item_memory = await held_item_features(settings, loading, artifacts.current, metrics, stamp)
        following = await _following(settings, store, stamp, artifacts, item_memory, metrics)
        trending = _trending(settings, store, artifacts, metrics)
        logs = _logs(settings, store, metrics, stack)
        pipeline = _pipeline(
            settings,
            store,
            _search(settings, stack),
            item_memory,
            scorer,
            trending,
            following.follower,
            following.exposure,
        )
        reloader = Reloader(settings, artifacts, model, store.keys, stamp, metrics, opened.plan)
        log.info(
            "serving %s items with model %s (%d inputs wide, at most %d rows a batch); %s",
            *(f"{opened.catalog.size:,}", signature.name, schema.width, signature.max_batch_size),
            reloader.report().said(),
        )
        served = ServedWorld(
            *(stamp, artifacts, pipeline, reloader, trending, item_memory),
            *(following.changes, following.follower, following.exposure),
        )
        return Services(
            settings=settings,
            metrics=metrics,
            store=store,
            model=model,
            breakers=breakers,
            shadow=shadow,
            closing=stack.pop_all(),
            events=logs.events,
            served=served,
            answers=logs.answers,
            traces=_trace_ring(settings),
            explaining=asyncio.Semaphore(settings.debug_explain_in_flight),
        )
    raise AssertionError("unreachable: the block returns or raises")  # for the type checker
