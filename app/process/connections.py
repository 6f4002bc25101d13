"""The service's connections to Redis and to each Triton, each behind its circuit breaker."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack

from app.clients.breaker import BreakerState, CircuitBreaker
from app.clients.feature_store import FeatureStore, redis_of
from app.clients.item_memory import LOAD_CALL_TIMEOUT_S
from app.clients.ranking_model import connect_triton
from app.clients.triton_pool import TritonPool
from app.core.metrics import ServiceMetrics
from app.core.settings import Settings
from app.pipeline.context import caller_shortened
from app.release.keyspace import keyspace_of
from app.world.schema import FeatureSchema

# The matrix is read by one task at a time (start-up, then a refresh now and then).
LOADING_CONNECTIONS = 2


def breakers_for(
    settings: Settings, metrics: ServiceMetrics, running_late: Callable[[], bool]
) -> dict[str, CircuitBreaker]:
    """A breaker for Redis and one for each Triton; `running_late` excuses the loop's
    own lateness, as a caller's shortened budget excuses its timeouts."""
    names = ["redis", *_triton_names(settings)]
    return {name: _breaker(name, settings, metrics, running_late) for name in names}


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


def _triton_names(settings: Settings) -> list[str]:
    urls = settings.triton_urls
    return ["triton"] if len(urls) == 1 else [f"triton-{n}" for n in range(len(urls))]


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


def open_clients(
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
