"""HTTP routes: /recommend, /healthz, /readyz, /metrics."""

from __future__ import annotations

import logging
import time
import uuid

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api_models import (
    ErrorBody,
    ModelInfo,
    RecommendedItem,
    RecommendRequest,
    RecommendResponse,
)
from app.context import RequestContext
from app.deps import ServicesDep
from app.health import readiness
from app.services import Services

log = logging.getLogger(__name__)
router = APIRouter()


def _request_id(supplied: str | None) -> str:
    if supplied and 0 < len(supplied) <= 64 and supplied.isprintable():
        return supplied
    return uuid.uuid4().hex


@router.post(
    "/recommend",
    response_model=RecommendResponse,
    response_model_exclude_none=True,
    responses={422: {"model": ErrorBody}, 500: {"model": ErrorBody}},
)
async def recommend(
    body: RecommendRequest,
    services: ServicesDep,
    x_request_id: str | None = Header(default=None),
) -> RecommendResponse | JSONResponse:
    started = time.perf_counter()
    artifacts = services.artifacts.current
    ctx = RequestContext(
        request_id=_request_id(x_request_id),
        deadline=time.monotonic() + services.settings.request_timeout_ms / 1000.0,
        artifacts=artifacts,
        metrics=services.metrics,
    )
    try:
        result = await services.pipeline.run(body, ctx)
    except Exception:
        log.exception("request %s failed", ctx.request_id)
        _observe(services, "error", started)
        error = ErrorBody(
            error="internal_error", message="the request failed", request_id=ctx.request_id
        )
        return JSONResponse(error.model_dump(), status_code=500)
    _observe(services, "degraded" if ctx.degraded else "ok", started)
    return RecommendResponse(
        request_id=ctx.request_id,
        user_id=body.user_id,
        items=[
            RecommendedItem(item_id=item.item_id, score=item.score, rank=rank)
            for rank, item in enumerate(result.items, start=1)
        ],
        model=ModelInfo(name=artifacts.model.name, version=artifacts.model.version),
        cold_start=result.cold_start,
        degraded=ctx.degraded,
        timings_ms=ctx.timings_ms if body.debug else None,
    )


def _observe(services: Services, outcome: str, started: float) -> None:
    services.metrics.request_count[outcome].inc()
    services.metrics.request_timer[outcome].observe(time.perf_counter() - started)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    checks = await readiness(services)
    failing = sorted(name for name, ok in checks.items() if not ok)
    services.metrics.ready.set(0 if failing else 1)
    body = {"status": "not_ready" if failing else "ready", "checks": checks, "failing": failing}
    return JSONResponse(body, status_code=503 if failing else 200)


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
