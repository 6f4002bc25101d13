"""The ASGI application: built by create_app, its clients owned by the lifespan."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import Scope

from app.api.access import EventAccess, Refused, operator
from app.api.admin import router as admin_router
from app.api.catalog import router as catalog_router
from app.api.catalog_models import ItemsIn, WithdrawalsIn
from app.api.debug import router as debug_router
from app.api.errors import install_error_handlers
from app.api.events import router as events_router
from app.api.gate import Gate, Gated
from app.api.models import CandidateWorld, EventsRequest, RecommendRequest
from app.api.recommend import serve
from app.api.routes import COMMON_ERRORS, router
from app.core.errors import RecsysError
from app.core.log_setup import configure_logging
from app.core.metrics import ServiceMetrics
from app.core.settings import Settings, load_settings
from app.core.token_bucket import TokenBuckets
from app.process.admission import Admission
from app.process.concurrency_limit import AdaptiveLimit
from app.process.drain import cancel_on_stop_signals, drain_on_sigterm
from app.process.loop_lag import LoopLag
from app.process.reload import hold_reload_signals, reload_on_signal
from app.process.services import Services, start_services
from app.process.workers import forget_dead_workers, metrics_dir, retire_this_worker
from app.process.world_tasks import stop_tasks
from app.process.worlds import Worlds, open_worlds, worlds_reload

log = logging.getLogger("recsys")
INITIAL_IN_FLIGHT = 16
# The operator's calls in flight at once per worker; more wait in line up to the queue's
# time (a catalog call takes milliseconds, a candidate world seconds), then get a 503.
OPERATOR_IN_FLIGHT = 4
OPERATOR_QUEUE_S = 5.0
OPERATOR_BYTES_PER_S = 2**20

DESCRIPTION = """Recommendations ranked by a DNN on Triton, with FAISS recall and Redis features.

Every error, whatever its status, has the same JSON body (`ErrorBody`) carrying the request
id. A failing dependency degrades the answer instead of failing it: `degraded` lists
`stage:reason` for each stage that fell back.
"""


class StartupInterruptedError(RecsysError):
    """A signal stopped the start-up."""


class _QuietRefusal(logging.Filter):
    """Drops the server's traceback of a start-up refused on purpose: one line said why."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.refused and str(record.msg).startswith("Traceback"))


async def _start(
    settings: Settings, metrics: ServiceMetrics, lag: LoopLag, refusal: _QuietRefusal
) -> Worlds:
    """The worlds started, stoppable by a signal, their expected failures told in one line."""
    # Half the shedding threshold: late enough that a reply may have sat unread.
    late_s = settings.max_queue_ms / 2000.0

    def start(world: Settings) -> Awaitable[Services]:
        return start_services(world, metrics, lambda: lag.lag_s > late_s)

    startup = asyncio.ensure_future(open_worlds(settings, metrics, start))
    restore = cancel_on_stop_signals(startup)
    try:
        return await startup
    except RecsysError as exc:
        refusal.refused = True
        log.error("start-up refused: %s", exc)
        raise
    except asyncio.CancelledError:
        refusal.refused = True
        log.error("start-up interrupted by a signal; nothing was left running")
        raise StartupInterruptedError("start-up interrupted") from None
    finally:
        restore()


def admission_limit(settings: Settings, metrics: ServiceMetrics) -> AdaptiveLimit:
    """The in-flight limit; admitted answers are kept to a quarter of the budget at most,
    well clear of their deadlines. It starts generous: a limit grows only while demand
    reaches it, so one that started low would refuse the first bursts of a healthy service
    (a stall's backlog, a GC pause), and one too high for an overload halves within half a
    second."""
    limit = AdaptiveLimit(
        initial=INITIAL_IN_FLIGHT,
        floor=settings.min_in_flight,
        ceiling=settings.max_in_flight,
        max_latency_s=settings.request_budget_ms / 4000.0,
        on_change=metrics.admission_limit.set,
    )
    metrics.admission_limit.set(limit.current)
    return limit


def _lifespan(
    settings: Settings, metrics: ServiceMetrics, lag: LoopLag
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start-up, the process's life, and shutdown, in that order."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        shared = metrics_dir()
        if shared is not None:
            forget_dead_workers(shared)
        server_log = logging.getLogger("uvicorn.error")
        refusal = _QuietRefusal()
        server_log.addFilter(refusal)
        worlds = await _start(settings, metrics, lag, refusal)
        server_log.removeFilter(refusal)
        app.state.worlds = worlds

        def mark_draining() -> None:
            worlds.stable.services.draining = True

        restore = drain_on_sigterm(settings.drain_s, mark_draining)
        stop_reloading = reload_on_signal(worlds_reload(worlds))
        # What start-up made lives as long as the process: keep it out of every later
        # collection, whose full passes would otherwise pause requests for tens of ms.
        gc.collect()
        gc.freeze()
        metrics.workers.set(1)
        background = [asyncio.create_task(lag.run(), name="loop-lag")]
        try:
            yield
        finally:
            stop_reloading()
            restore()
            await stop_tasks(background)
            await worlds.aclose()
            if shared is not None:
                retire_this_worker(shared)

    return lifespan


def _gated_routes(
    settings: Settings, metrics: ServiceMetrics, lag: LoopLag, event_access: EventAccess
) -> dict[str, Gated]:
    """Each gated POST route with its own admission."""
    admission = Admission(
        admission_limit(settings, metrics),
        lag,
        settings.max_queue_s,
        on_change=metrics.in_flight.set,
    )
    # A fixed limit, no line: a batch of events can wait for its sender's retry, and a
    # burst of them must not take the worker from /recommend.
    most = settings.events_max_in_flight
    events_admission = Admission(
        AdaptiveLimit(most, most, most, max_latency_s=settings.event_append_timeout_s),
        lag,
        max_queue_s=settings.max_queue_s,
    )
    routes = {
        "/recommend": Gated(admission, RecommendRequest, metrics.observe_request, serve=serve),
        "/events": Gated(events_admission, EventsRequest, authorize=event_access.caller),
    }
    return routes | _operator_routes(settings, lag)


def _operator_routes(settings: Settings, lag: LoopLag) -> dict[str, Gated]:
    """The operator's routes that take a body: the caller known before any of it is read,
    a limit of their own, and a few at a time (a catalog batch guesses vectors, a candidate
    world loads a world)."""
    most = OPERATOR_IN_FLIGHT
    admission = Admission(AdaptiveLimit(most, most, most, 1.0), lag, OPERATOR_QUEUE_S)
    token = settings.admin_token

    def catalog_caller(scope: Scope) -> str | Refused:
        return operator(scope, token, loopback_without_token=True)

    def admin_caller(scope: Scope) -> str | Refused:
        return operator(scope, token, loopback_without_token=False)

    largest = settings.catalog_max_body_bytes
    # A body of the largest size over a slow uplink (1 MB/s), or the usual deadline.
    deadline = max(settings.body_timeout_s, largest / OPERATOR_BYTES_PER_S)
    routes = {
        path: Gated(
            admission,
            model,
            authorize=catalog_caller,
            max_body_bytes=largest,
            body_timeout_s=deadline,
        )
        for path, model in (("/catalog/items", ItemsIn), ("/catalog/withdrawals", WithdrawalsIn))
    }
    if token is not None:  # the admin routes are mounted only then
        routes["/admin/worlds/candidate"] = Gated(admission, CandidateWorld, authorize=admin_caller)
    return routes


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; nothing connects until the lifespan starts."""
    hold_reload_signals()
    configure_logging()
    resolved = settings or load_settings()
    metrics = ServiceMetrics()
    lag = LoopLag()
    quotas = TokenBuckets(resolved.event_caller_rate, resolved.event_caller_burst)
    event_access = EventAccess(resolved.callers, quotas, metrics)
    metrics.know_callers(event_access.names)
    # Swagger UI's assets are served from the package, never fetched from a CDN.
    make = FastAPIOffline if resolved.docs else FastAPI
    app = make(
        title="recsys-serving",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=_lifespan(resolved, metrics, lag),
        responses=COMMON_ERRORS,
        docs_url="/docs" if resolved.docs else None,
        redoc_url=None,
    )
    app.state.event_access = event_access
    app.include_router(router)
    app.include_router(events_router)
    app.include_router(catalog_router)
    if resolved.admin_token is not None:
        app.include_router(admin_router)
    if resolved.debug_pages:
        app.include_router(debug_router)
    install_error_handlers(app)
    app.add_middleware(
        Gate,
        routes=_gated_routes(resolved, metrics, lag, event_access),
        metrics=metrics,
        max_body_bytes=resolved.max_body_bytes,
        body_timeout_s=resolved.body_timeout_s,
    )
    return app
