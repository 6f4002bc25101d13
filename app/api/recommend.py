"""The answer to POST /recommend, made once for the gate's direct path and for the route.

A valid body is answered by the gate itself (`serve`): the body it already read is parsed
and validated once, and the answer is written as JSON straight from the pipeline's result,
without a response model per item or FastAPI's routing, dependencies and response
validation around it (together about 0.2 ms of CPU a request, a twentieth of the whole).
A body that fails validation goes on to the FastAPI route, whose validation and error
handlers answer it as they answer every route; the route makes its answers here too, so
both paths send the same bytes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from pydantic import ValidationError
from starlette.types import Scope, Send

from app.api.access import debug_allowed
from app.api.errors import error_body
from app.api.models import (
    BUDGET_HEADER,
    TRACE_HEADER,
    ErrorBody,
    ErrorField,
    RecommendRequest,
)
from app.clients.answer_log import Shown
from app.core.events import new_answer_id
from app.core.metrics import Outcome
from app.pipeline.context import RequestContext, caller_shortened
from app.pipeline.trace import Trace
from app.pipeline.types import Recommendation
from app.process.services import Services
from app.process.worlds import Worlds
from app.release.artifacts import ServingArtifacts
from app.release.attributes import AttributeName

log = logging.getLogger(__name__)
_BUDGET = BUDGET_HEADER.lower().encode("latin-1")
_TRACE = TRACE_HEADER.lower().encode("latin-1")
_JSON = (b"content-type", b"application/json")


def json_bytes(content: Any) -> bytes:
    """As FastAPI's JSONResponse renders it, so either path sends the same bytes."""
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def requested_budget_ms(raw: str | None) -> int | None:
    """The budget header's value; ValueError when it is not a positive integer."""
    if raw is None:
        return None
    text = raw.strip()
    value = int(text) if text.isascii() and text.isdigit() else 0
    if value < 1:
        raise ValueError(f"{BUDGET_HEADER} must be a positive integer of milliseconds")
    return value


def _traced_request(body: RecommendRequest, budget_s: float) -> dict[str, Any]:
    return {
        "user_id": body.user_id,
        "context": body.context.model_dump(exclude_none=True),
        "num_items": body.num_items,
        "excluded": len(body.exclude_item_ids),
        "budget_ms": round(budget_s * 1000.0),
    }


def _score(score: float | None) -> float | None:
    # What the response model's JSON mode makes of a number JSON cannot hold.
    return score if score is not None and math.isfinite(score) else None


def items(
    result: Recommendation, artifacts: ServingArtifacts, attributes: list[AttributeName]
) -> list[dict[str, Any]]:
    """The answer's items as RecommendedItem lists them, with the attributes asked for."""
    rows: list[dict[str, Any]] = [
        {"item_id": item.item_id, "score": _score(item.score), "rank": rank}
        for rank, item in enumerate(result.items, start=1)
    ]
    if attributes:
        positions = artifacts.lookup([row["item_id"] for row in rows])
        words = artifacts.catalog.attributes.of(positions, attributes)
        for row, said in zip(rows, words, strict=True):
            row["attributes"] = said
    return rows


def _error(status: int, error: ErrorBody) -> tuple[int, bytes]:
    return status, json_bytes(error.model_dump())


async def answer(worlds: Worlds, body: RecommendRequest, scope: Scope) -> tuple[int, bytes]:
    """The status and JSON body of the answer to a valid request."""
    state: dict[str, Any] = scope["state"]
    # The user's world, chosen once: every stage below runs in it.
    services, role = worlds.serving(body.user_id)
    try:
        budget_ms = requested_budget_ms(_header(scope, _BUDGET))
    except ValueError as exc:
        field = ErrorField(field=f"header.{BUDGET_HEADER}", message=str(exc))
        return _error(422, error_body("invalid_request", str(exc), state["request_id"], [field]))
    arrived: float = state.get("arrived", time.monotonic())
    artifacts = services.artifacts.current
    budget_s = services.budget_s(budget_ms)
    caller_shortened.set(services.shortened(budget_s))  # this request's task only
    ctx = RequestContext.on_budget(
        state["request_id"],
        arrived=arrived,
        budget_s=budget_s,
        reserve_s=services.settings.reserve_s,
        artifacts=artifacts,
        metrics=services.metrics,
        user_id=body.user_id,
    )
    answer_id = new_answer_id()
    traces = services.traces
    asked = body.debug or (_header(scope, _TRACE) or "") not in ("", "0")
    # Forcing a trace fills the operators' ring: only for who may read it.
    if traces is not None and traces.chosen(
        asked and debug_allowed(scope, services.settings.debug_token)
    ):
        # Only a chosen request pays for its trace: the others, one random draw.
        ctx.trace = Trace(answer_id, time.time(), _traced_request(body, budget_s))
    try:
        result = await services.pipeline.run(body.query(), ctx)
    except Exception:
        log.exception("request %s failed", ctx.request_id)
        return _error(500, error_body("internal_error", "the request failed", ctx.request_id))
    if traces is not None and ctx.trace is not None:
        traces.keep(ctx.trace)
    state["outcome"] = Outcome.DEGRADED if ctx.degraded else Outcome.OK
    services.metrics.world_answer_count[role].inc()
    # Out of budget on the service's own budget (not one its caller shortened): the gate
    # lets this answer's service time teach the admission limit (app/api/gate.py).
    state["exhausted"] = ctx.time_for() <= 0.0 and not caller_shortened.get()
    _remember(services, body, ctx, answer_id, result)
    world = services.world
    content: dict[str, Any] = {
        "request_id": ctx.request_id,
        "answer_id": answer_id,
        "user_id": body.user_id,
        "items": items(result, artifacts, body.attributes),
        "model": {
            "name": artifacts.model.name,
            "version": result.model.version or None,
            "variant": result.model.variant.value,
        },
        "artifacts": artifacts.label,
        "world": {"id": world.world_id if world is not None else "", "role": role.value},
        "cold_start": result.cold_start,
        "degraded": list(ctx.degraded),
    }
    if body.debug:
        content["timings_ms"] = ctx.timings_ms
    return 200, json_bytes(content)


def _remember(
    services: Services,
    body: RecommendRequest,
    ctx: RequestContext,
    answer_id: str,
    result: Recommendation,
) -> None:
    """The answer's variant for the events that credit it, and what was shown, for the log."""
    services.events.remember_answer(
        answer_id, result.model.variant.value, services.settings.answer_ttl_s
    )
    answers = services.answers
    if answers is not None and answers.wanted():
        world = services.world
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


async def serve(scope: Scope, raw: bytes, send: Send) -> int | None:
    """Answer a /recommend whose body is valid and return its status; None, having sent
    nothing, for a body the route must answer (its validation names what is wrong)."""
    try:
        body = RecommendRequest.model_validate(json.loads(raw))
    except (ValueError, RecursionError, ValidationError):
        return None
    worlds: Worlds = scope["app"].state.worlds
    status, content = await answer(worlds, body, scope)
    headers = [_JSON, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
    return status
