"""HTTP routes: /recommend, /healthz, /readyz, /metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import ServicesDep, WorldsDep
from app.api.errors import GATE_ERRORS, documented
from app.api.models import (
    BUDGET_HEADER,
    REQUEST_ID_HEADER,
    TRACE_HEADER,
    Liveness,
    Readiness,
    RecommendRequest,
    RecommendResponse,
)
from app.api.recommend import answer
from app.process.health import failing, readiness
from app.process.workers import exposition

router = APIRouter()


RECOMMEND_ERRORS: dict[int | str, dict[str, Any]] = {
    **GATE_ERRORS,
    422: documented("A field is invalid; `fields` names each one (at most 20)."),
    503: documented(
        "Overloaded: the worker is past its capacity (its adaptive limit is reached and its "
        "short line full, or its event loop stays behind). Nothing was done; retry after "
        "the delay, on another instance if possible.",
        headers={"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    ),
    500: documented("An unexpected error; the request id is in the body and the log."),
}
# Any path can answer these.
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    404: documented("No such path."),
    405: documented("The path exists, not with this method; `Allow` lists the methods."),
}


# Read from the raw headers (app.api.gate, app.api.recommend), so documented here by hand: a header
# is never null, which is what an optional header parameter would be documented as.
HEADERS = [
    {
        "name": BUDGET_HEADER,
        "in": "header",
        "required": False,
        "description": "a tighter budget for this request, in ms: raised to the configured "
        "minimum (RECSYS_MIN_BUDGET_MS) and capped at the configured budget",
        "schema": {"type": "integer", "minimum": 1},
    },
    {
        "name": TRACE_HEADER,
        "in": "header",
        "required": False,
        "description": "with the debug pages on, trace this request (any value but 0; only "
        "with the debug token, or from loopback where none is set): its trace is at "
        "/debug/trace/{answer_id}",
        "schema": {"type": "string"},
    },
    {
        "name": REQUEST_ID_HEADER,
        "in": "header",
        "required": False,
        "description": "echoed as `request_id` and in the response header when 1-64 "
        "printable ASCII characters; a new id is made otherwise",
        "schema": {"type": "string"},
    },
]


@router.post(
    "/recommend",
    response_model=RecommendResponse,
    responses=RECOMMEND_ERRORS,
    summary="The top N items for a user",
    openapi_extra={"parameters": HEADERS},
)
async def recommend(body: RecommendRequest, request: Request, worlds: WorldsDep) -> Response:
    # The gate answers every valid body itself (app.api.recommend.serve) and sends here only
    # the bodies it could not validate, which FastAPI's validation then refuses before this
    # runs: the route is what documents /recommend and answers its invalid bodies. Were the
    # app mounted without the gate, its answers would still be made in one place.
    status, content = await answer(worlds, body, request.scope)
    return Response(content, status_code=status, media_type="application/json")


@router.get("/healthz", response_model=Liveness, summary="The process is alive")
async def healthz() -> Liveness:
    return Liveness(status="alive")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready; `failing` says why."}},
    summary="Whether a load balancer should send this instance traffic",
)
async def readyz(services: ServicesDep) -> JSONResponse:
    checks = await readiness(services)
    failed = failing(checks)
    services.metrics.ready.set(0 if failed else 1)
    body = Readiness(
        status="not_ready" if failed else "ready",
        checks=checks,
        failing=failed,
        breakers={name: b.state.name.lower() for name, b in services.breakers.items()},
    )
    return JSONResponse(body.model_dump(), status_code=503 if failed else 200)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
    summary="Prometheus metrics",
)
async def metrics(services: ServicesDep) -> Response:
    return Response(exposition(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
