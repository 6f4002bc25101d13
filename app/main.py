"""The ASGI application: built by create_app, its clients owned by the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.api import router
from app.api_models import ErrorBody, ErrorField
from app.metrics import ServiceMetrics
from app.services import start_services
from app.settings import Settings

log = logging.getLogger(__name__)


def _field_name(location: tuple[int | str, ...]) -> str:
    parts = [str(part) for part in location]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; nothing connects until the lifespan starts."""
    resolved = settings or Settings()
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await start_services(resolved, metrics)
        app.state.services = services
        try:
            yield
        finally:
            await services.aclose()

    app = FastAPI(title="recsys-serving", version="0.1.0", lifespan=lifespan)
    app.include_router(router)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [
            ErrorField(field=_field_name(tuple(error.get("loc", ()))), message=error["msg"])
            for error in exc.errors()
        ]
        if request.url.path == "/recommend":
            metrics.request_count["invalid"].inc()
        body = ErrorBody(
            error="invalid_request",
            message="; ".join(f"{f.field}: {f.message}" for f in fields),
            fields=fields,
        )
        return JSONResponse(body.model_dump(exclude_none=True), status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        body = ErrorBody(error="internal_error", message="the request failed")
        return JSONResponse(body.model_dump(exclude_none=True), status_code=500)

    return app
