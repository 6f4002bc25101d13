"""The ASGI application: built by create_app, its clients owned by the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from app.admission import Admission, LoopLag
from app.api.errors import install_error_handlers
from app.api.gate import Gate
from app.api.routes import COMMON_ERRORS, router
from app.drain import drain_on_sigterm
from app.metrics import ServiceMetrics
from app.services import start_services
from app.settings import Settings

DESCRIPTION = """Recommendations ranked by a DNN on Triton, with FAISS recall and Redis features.

Every error, whatever its status, has the same JSON body (`ErrorBody`) carrying the request
id. A failing dependency degrades the answer instead of failing it: `degraded` lists
`stage:reason` for each stage that fell back.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; nothing connects until the lifespan starts."""
    resolved = settings or Settings()
    metrics = ServiceMetrics()
    lag = LoopLag()
    admission = Admission(
        resolved.max_in_flight,
        resolved.max_queue_ms / 1000.0,
        lag,
        on_change=metrics.in_flight.set,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Half the shedding threshold: late enough that a reply may have sat unread.
        late_s = resolved.max_queue_ms / 2000.0
        services = await start_services(resolved, metrics, lambda: lag.lag_s > late_s)
        app.state.services = services

        def mark_draining() -> None:
            services.draining = True

        restore = drain_on_sigterm(resolved.drain_s, mark_draining)
        # What start-up made lives as long as the process: keep it out of every later
        # collection, whose full passes would otherwise pause requests for tens of ms.
        gc.collect()
        gc.freeze()
        sampling = asyncio.create_task(lag.run(), name="loop-lag")
        try:
            yield
        finally:
            restore()
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            await services.aclose()

    # Swagger UI's assets are served from the package, never fetched from a CDN.
    make = FastAPIOffline if resolved.docs else FastAPI
    app = make(
        title="recsys-serving",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        responses=COMMON_ERRORS,
        docs_url="/docs" if resolved.docs else None,
        redoc_url=None,
    )
    app.include_router(router)
    install_error_handlers(app)
    app.add_middleware(
        Gate, admission=admission, metrics=metrics, max_body_bytes=resolved.max_body_bytes
    )
    return app
