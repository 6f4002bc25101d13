"""HTTP routes: /recommend, /healthz, /readyz, /metrics."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.access import debug_allowed
from app.api.deps import ServicesDep, WorldsDep
from app.api.errors import GATE_ERRORS, documented, error_body
from app.api.models import (
    BUDGET_HEADER,
    REQUEST_ID_HEADER,
    TRACE_HEADER,
    ErrorField,
    Liveness,
    ModelInfo,
    Readiness,
    RecommendedItem,
    RecommendRequest,
    RecommendResponse,
    WorldInfo,
)
from app.clients.answer_log import Shown
from app.core.events import new_answer_id
from app.core.metrics import Outcome
from app.pipeline.context import RequestContext, caller_shortened
from app.pipeline.trace import Trace
from app.pipeline.types import Recommendation
from app.process.health import failing, readiness
from app.process.workers import exposition
from app.release.artifacts import ServingArtifacts
from app.release.attributes import AttributeName

log = logging.getLogger(__name__)
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


# Read by the gate and the route from the raw headers, so documented here by hand: a header
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


def _traced_request(body: RecommendRequest, budget_s: float) -> dict[str, Any]:
    return {
        "user_id": body.user_id,
        "context": body.context.model_dump(exclude_none=True),
        "num_items": body.num_items,
        "excluded": len(body.exclude_item_ids),
        "budget_ms": round(budget_s * 1000.0),
    }


def _items(
    result: Recommendation, artifacts: ServingArtifacts, attributes: list[AttributeName]
) -> list[RecommendedItem]:
    """The answer's items, with the attributes asked for."""
    items = [
        RecommendedItem(item_id=item.item_id, score=item.score, rank=rank)
        for rank, item in enumerate(result.items, start=1)
    ]
    if attributes:
        positions = artifacts.lookup([item.item_id for item in items])
        words = artifacts.catalog.attributes.of(positions, attributes)
        for item, said in zip(items, words, strict=True):
            item.attributes = said
    return items


def requested_budget_ms(raw: str | None) -> int | None:
    """The budget header's value; ValueError when it is not a positive integer."""
    if raw is None:
        return None
    text = raw.strip()
    value = int(text) if text.isascii() and text.isdigit() else 0
    if value < 1:
        raise ValueError(f"{BUDGET_HEADER} must be a positive integer of milliseconds")
    return value


@router.post(
    "/recommend",
    response_model=RecommendResponse,
    # Unset, not None, is what is left out: `timings_ms` without debug. A null that means
    # something (`model.version` when Triton did not answer, an unscored item's `score`)
    # is always sent, as the schema requires.
    response_model_exclude_unset=True,
    responses=RECOMMEND_ERRORS,
    summary="The top N items for a user",
    openapi_extra={"parameters": HEADERS},
)
async def recommend(
    body: RecommendRequest, request: Request, worlds: WorldsDep
) -> RecommendResponse | JSONResponse:
    state = request.state
    # The user's world, chosen once: every stage below runs in it.
    services, role = worlds.serving(body.user_id)
    try:
        budget_ms = requested_budget_ms(request.headers.get(BUDGET_HEADER))
    except ValueError as exc:
        field = ErrorField(field=f"header.{BUDGET_HEADER}", message=str(exc))
        error = error_body("invalid_request", str(exc), state.request_id, [field])
        return JSONResponse(error.model_dump(), status_code=422)
    arrived: float = getattr(state, "arrived", time.monotonic())
    artifacts = services.artifacts.current
    budget_s = services.budget_s(budget_ms)
    caller_shortened.set(services.shortened(budget_s))  # this request's task only
    ctx = RequestContext.on_budget(
        state.request_id,
        arrived=arrived,
        budget_s=budget_s,
        reserve_s=services.settings.reserve_s,
        artifacts=artifacts,
        metrics=services.metrics,
        user_id=body.user_id,
    )
    answer_id = new_answer_id()
    traces = services.traces
    asked = body.debug or request.headers.get(TRACE_HEADER, "") not in ("", "0")
    # Forcing a trace fills the operators' ring: only for who may read it.
    if traces is not None and traces.chosen(
        asked and debug_allowed(request.scope, services.settings.debug_token)
    ):
        # Only a chosen request pays for its trace: the others, one random draw.
        ctx.trace = Trace(answer_id, time.time(), _traced_request(body, budget_s))
    try:
        result = await services.pipeline.run(body.query(), ctx)
    except Exception:
        log.exception("request %s failed", ctx.request_id)
        error = error_body("internal_error", "the request failed", ctx.request_id)
        return JSONResponse(error.model_dump(), status_code=500)
    if traces is not None and ctx.trace is not None:
        traces.keep(ctx.trace)
    state.outcome = Outcome.DEGRADED if ctx.degraded else Outcome.OK
    services.metrics.world_answer_count[role].inc()
    # Out of budget on the service's own budget (not one its caller shortened): the gate
    # lets this answer's service time teach the admission limit (app/api/gate.py).
    state.exhausted = ctx.time_for() <= 0.0 and not caller_shortened.get()
    services.events.remember_answer(
        answer_id, result.model.variant.value, services.settings.answer_ttl_s
    )
    world = services.world
    answers = services.answers
    if answers is not None and answers.wanted():
        answers.shown(
            Shown(
                answer_id,
                int(time.time() * 1000),
                body.user_id,
                body.context.page,
                result.model.variant.value,
                result.model.version,
                world.world_id if world is not None else "",
                bool(ctx.degraded),
                result.items,
            )
        )
    debug = {"timings_ms": ctx.timings_ms} if body.debug else {}
    items = _items(result, artifacts, body.attributes)
    return RecommendResponse(
        request_id=ctx.request_id,
        answer_id=answer_id,
        user_id=body.user_id,
        items=items,
        model=ModelInfo(
            name=artifacts.model.name,
            version=result.model.version or None,
            variant=result.model.variant,
        ),
        artifacts=artifacts.label,
        world=WorldInfo(id=world.world_id if world is not None else "", role=role),
        cold_start=result.cold_start,
        degraded=ctx.degraded,
        **debug,
    )


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
