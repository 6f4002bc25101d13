"""Everything a running service holds, built and checked at start-up, closed at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol

import faiss

from app.clients.answer_log import AnswerLog
from app.clients.breaker import BreakerState, CircuitBreaker
from app.clients.catalog_log import CatalogLog
from app.clients.event_log import EventLog
from app.clients.exposure import Exposure
from app.clients.feature_store import FeatureStore, redis_of
from app.clients.item_memory import (
    LOAD_CALL_TIMEOUT_S,
    ItemMatrix,
    ItemMemory,
    read_item_matrix,
)
from app.clients.local_ranker import LocalRanker, load_local_ranker
from app.clients.ranking_model import connect_triton
from app.clients.shared_memory import InputSlots, remove_stale_regions
from app.clients.trending import TrendingItems
from app.clients.triton_pool import TritonPool
from app.core.cached import CachedCall
from app.core.errors import (
    ConfigError,
    RankingModelError,
)
from app.core.metrics import AnswerLogged, ServiceMetrics
from app.core.realtime_settings import seconds
from app.core.settings import Settings
from app.pipeline.context import caller_shortened
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
from app.process.reload import Reloader, model_routing
from app.process.startup_checks import (
    STARTUP_CALL_TIMEOUT_S,
    checked_redis,
    opened_catalog,
    opened_world,
)
from app.release.artifacts import ArtifactsRef, ServingArtifacts, serving_artifacts
from app.release.catalog import with_room
from app.release.keyspace import keyspace_of
from app.release.plan import read_plan
from app.release.rules import load_rules
from app.world.layout import MODEL_FILE
from app.world.schema import FeatureSchema, ModelSignature
from app.world.stamp import WorldStamp, files_identity

log = logging.getLogger(__name__)
READINESS_TTL_S = 1.0


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: ServiceMetrics
    store: FeatureStore
    model: TritonPool
    artifacts: ArtifactsRef
    pipeline: RecommendPipeline
    breakers: dict[str, CircuitBreaker]
    reloader: Reloader
    shadow: ShadowCalls
    # Closes what start-up opened, in the reverse order (shadow calls first, Redis last).
    closing: AsyncExitStack
    events: EventLog
    trending: TrendingItems
    # What answers showed, for the archive; None with RECSYS_ANSWER_LOG_SAMPLE=0.
    answers: AnswerLog | None = None
    world: WorldStamp | None = None
    item_memory: ItemMemory | None = None
    # Items put and withdrawn while serving (app.process.catalog_follower); None without room.
    catalog_log: CatalogLog | None = None
    catalog_follower: CatalogFollower | None = None
    # The showings and positives of items added while serving, for exploration.
    exposure: Exposure | None = None
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


class SharingEndpoint(Protocol):
    @property
    def url(self) -> str: ...

    async def use_shared_memory(self, slots: InputSlots, timeout_s: float) -> None: ...


class SharingPool(Protocol):
    @property
    def endpoints(self) -> Sequence[SharingEndpoint]: ...


async def share_memory(
    pool: SharingPool,
    schema: FeatureSchema,
    signature: ModelSignature,
    max_in_flight: int,
    required: bool,
) -> int:
    """A shared-memory region per endpoint that can map it: a slot per chunk the worker may
    have in flight. Returns how many endpoints use one; the others are sent plain gRPC,
    unless shared memory is `required`."""
    removed = remove_stale_regions()
    if removed:
        log.info("removed %d shared-memory regions of processes now gone", len(removed))
    slot_bytes = signature.max_batch_size * schema.width * 4
    sharing = 0
    for endpoint in pool.endpoints:
        slots = InputSlots(2 * max_in_flight, slot_bytes)
        try:
            await endpoint.use_shared_memory(slots, STARTUP_CALL_TIMEOUT_S)
        except RankingModelError as exc:
            slots.close()
            if required:
                raise ConfigError(
                    f"Triton at {endpoint.url} cannot use this host's shared memory ({exc}): "
                    "set RECSYS_TRITON_SHARED_MEMORY=auto or off unless Triton runs here, "
                    "sharing /dev/shm"
                ) from None
            log.info("Triton at %s gets model inputs by gRPC: %s", endpoint.url, exc)
            continue
        sharing += 1
        log.info("Triton at %s gets model inputs through shared memory", endpoint.url)
    return sharing


def _breaker(
    name: str, settings: Settings, metrics: ServiceMetrics, excused: Callable[[], bool]
) -> CircuitBreaker:
    # The names come from the configuration, fixed at start-up: a small, fixed label set.
    gauge = metrics.breaker.labels(name)
    gauge.set(BreakerState.CLOSED)

    def export(state: BreakerState) -> None:
        gauge.set(state)

    def timeouts_excused() -> bool:
        return excused() or caller_shortened.get()

    return CircuitBreaker(
        name,
        settings.breaker_failures,
        settings.breaker_open_s,
        on_change=export,
        excused=timeouts_excused,
    )


def _local_ranker(settings: Settings, schema: FeatureSchema) -> LocalRanker | None:
    if not settings.fallback_ranker:
        log.info("fallback ranking: recall order (RECSYS_FALLBACK_RANKER is off)")
        return None
    path = settings.fallback_model or settings.artifacts_dir / MODEL_FILE
    ranker = load_local_ranker(path, schema)
    log.info("fallback ranking: %s in process with onnxruntime", path)
    return ranker


def _breakers(
    settings: Settings, metrics: ServiceMetrics, running_late: Callable[[], bool]
) -> dict[str, CircuitBreaker]:
    names = ["redis", *_triton_names(settings)]
    return {name: _breaker(name, settings, metrics, running_late) for name in names}


def _triton_names(settings: Settings) -> list[str]:
    urls = settings.triton_urls
    return ["triton"] if len(urls) == 1 else [f"triton-{n}" for n in range(len(urls))]


# The matrix is read by one task at a time (start-up, then a refresh now and then).
LOADING_CONNECTIONS = 2


def _feature_store(
    settings: Settings,
    schema: FeatureSchema,
    breaker: CircuitBreaker,
    connections: int,
    timeout_s: float,
) -> FeatureStore:
    redis = redis_of(settings, connections, timeout_s)
    return FeatureStore(
        redis,
        schema,
        keyspace_of(settings.redis_key_prefix, settings.event_key_prefix),
        breaker,
        settings.recent_items,
    )


def _triton_pool(
    settings: Settings, schema: FeatureSchema, breakers: dict[str, CircuitBreaker]
) -> TritonPool:
    model_name = settings.model_name or schema.model_name
    names = _triton_names(settings)
    return TritonPool(
        [
            connect_triton(url, model_name, settings.model_version, breakers[name])
            for url, name in zip(settings.triton_urls, names, strict=True)
        ]
    )


def _search(settings: Settings, stack: AsyncExitStack) -> VectorSearch:
    if not settings.recall_threads:
        return InlineSearch()
    executor = ThreadPoolExecutor(settings.recall_threads, thread_name_prefix="recall")
    stack.callback(executor.shutdown, wait=False, cancel_futures=True)
    return PooledSearch(executor, settings.recall_queue)


def _clients(
    settings: Settings,
    schema: FeatureSchema,
    breakers: dict[str, CircuitBreaker],
    stack: AsyncExitStack,
) -> tuple[FeatureStore, FeatureStore, TritonPool]:
    """Redis and Triton's clients, each closed with the stack: Redis's for requests, and
    one for the item matrix read whole. A client's socket timeout bounds every read of a
    reply, so the requests' (tens of ms) would cut a read of megabytes that its own
    deadline allows seconds, whenever the host is busy for a moment (it refused start-ups)."""
    connections, timeout_s = settings.redis_max_connections, settings.redis_timeout_s
    store = _feature_store(settings, schema, breakers["redis"], connections, timeout_s)
    stack.push_async_callback(store.aclose)
    # The same breaker: a Redis that fails the matrix's reads fails the requests' too.
    loading = _feature_store(
        settings, schema, breakers["redis"], LOADING_CONNECTIONS, LOAD_CALL_TIMEOUT_S
    )
    stack.push_async_callback(loading.aclose)
    model = _triton_pool(settings, schema, breakers)
    stack.push_async_callback(model.close)
    return store, loading, model


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


async def _widest_with_memory(
    settings: Settings,
    model: TritonPool,
    schema: FeatureSchema,
    signatures: Sequence[ModelSignature],
) -> ModelSignature:
    """The routed version taking the largest batches, its inputs through shared memory
    where the setting asks for it."""
    signature = max(signatures, key=lambda each: each.max_batch_size)
    if settings.triton_shared_memory != "off":
        required = settings.triton_shared_memory == "on"
        await share_memory(model, schema, signature, settings.max_in_flight, required)
    return signature


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


async def start_services(
    settings: Settings, metrics: ServiceMetrics, running_late: Callable[[], bool] = lambda: False
) -> Services:
    """Build and check everything; `running_late` says when timeouts are the loop's fault.

    Whatever is opened is closed again if a later step fails (an exit stack), and by
    Services.aclose once the service stops.
    """
    stamp, schema = await asyncio.to_thread(opened_world, settings)
    rules = load_rules(settings.rules_file)
    plan = read_plan(settings.release_file, settings.model_version)
    # Requests already run concurrently; OpenMP threads inside one search only contend.
    faiss.omp_set_num_threads(1)
    catalog = await asyncio.to_thread(opened_catalog, settings, schema)
    # Copies the catalog's arrays (tens of MB): off the loop, which may be serving already
    # (a candidate world loaded beside the stable one).
    catalog = await asyncio.to_thread(
        with_room, catalog, settings.catalog_headroom, schema.item_blob_width
    )
    breakers = _breakers(settings, metrics, running_late)
    async with AsyncExitStack() as stack:
        store, loading, model = _clients(settings, schema, breakers, stack)
        await checked_redis(store, stamp, settings.startup_timeout_s)
        routing = await model_routing(plan, model, schema, stamp, settings.startup_timeout_s)
        signature = await _widest_with_memory(settings, model, schema, routing.signatures())
        local_ranker = await asyncio.to_thread(_local_ranker, settings, schema)
        stack.callback(lambda: local_ranker.close() if local_ranker is not None else None)
        identity = files_identity(settings.artifacts_dir, stamp)
        artifacts = ArtifactsRef(
            await asyncio.to_thread(
                serving_artifacts, schema, catalog, rules, routing, store.keys, identity
            )
        )
        item_memory = await held_item_features(settings, loading, artifacts.current, metrics, stamp)
        following = await replayed(
            store.client,
            store.keys,
            stamp.world_id if stamp else "",
            artifacts,
            item_memory,
            metrics,
            settings.startup_timeout_s,
        )
        if following is not None:
            store.catalog_seq_key = following[0].withdrawn_seq_key
        shadow = ShadowCalls(
            model, metrics, settings.triton_timeout_s, settings.shadow_max_in_flight
        )
        stack.push_async_callback(shadow.aclose)
        trending = _trending(settings, store, artifacts, metrics)
        events = EventLog(
            store.client, store.keys, settings.event_partitions, settings.event_stream_max
        )
        stack.push_async_callback(events.aclose)
        answers = _answer_log(settings, store, metrics)
        if answers is not None:
            stack.push_async_callback(answers.aclose)
        scorer = Scorer(model, local_ranker, settings.triton_timeout_s, shadow)
        follower = None if following is None else following[1]
        exposure = None
        if following is not None:
            world_id = stamp.world_id if stamp else ""
            exposure = Exposure(
                store.client, store.keys, world_id, lambda: artifacts.current.catalog.rows
            )
        pipeline = _pipeline(
            settings,
            store,
            _search(settings, stack),
            item_memory,
            scorer,
            trending,
            follower,
            exposure,
        )
        reloader = Reloader(settings, artifacts, model, store.keys, stamp, metrics, plan)
        log.info(
            "serving %s items with model %s (%d inputs wide, at most %d rows a batch); %s",
            *(f"{catalog.size:,}", signature.name, schema.width, signature.max_batch_size),
            reloader.report().said(),
        )
        return Services(
            settings=settings,
            metrics=metrics,
            store=store,
            model=model,
            artifacts=artifacts,
            pipeline=pipeline,
            breakers=breakers,
            reloader=reloader,
            shadow=shadow,
            closing=stack.pop_all(),
            events=events,
            trending=trending,
            answers=answers,
            world=stamp,
            item_memory=item_memory,
            catalog_log=None if following is None else following[0],
            catalog_follower=follower,
            exposure=exposure,
            traces=_trace_ring(settings),
            explaining=asyncio.Semaphore(settings.debug_explain_in_flight),
        )
    raise AssertionError("unreachable: the block returns or raises")  # for the type checker
