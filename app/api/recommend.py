"""The answer to POST /recommend, made once for the gate's direct path and for the route.

A valid body is answered by the gate itself (`serve`): the body it already read is parsed
and validated once, and the answer is written as JSON straight from the pipeline's result,
without a response model per item or FastAPI's routing, dependencies and response
validation around it (together about 0.2 ms of CPU a request, a twentieth of the whole).
The answer is rendered by pydantic's JSON writer, as FastAPI renders a response model, so
the bytes are those the route sent. A body that fails validation goes on to the FastAPI
route, whose validation and error handlers answer it as they answer every route.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import pydantic_core
from pydantic import ValidationError
from starlette.types import Scope, Send

from app.api.access import debug_allowed
from app.api.errors import error_body
from app.api.gate import header, send_json
from app.api.models import (
    BUDGET_HEADER,
    TRACE_HEADER,
    ErrorBody,
    ErrorField,
    RecommendRequest,
)
from app.core.outcomes import Outcome
from app.core.vocabulary import WorldRole
from app.pipeline.context import RequestContext, caller_shortened
from app.pipeline.types import Recommendation
from app.process import answering
from app.process.answering import Asking
from app.process.worlds import Worlds
from app.release.artifacts import ServingArtifacts
from app.world.attributes import AttributeName
from app.world.stamp import WorldStamp

log = logging.getLogger(__name__)
_BUDGET = BUDGET_HEADER.lower().encode("latin-1")
_TRACE = TRACE_HEADER.lower().encode("latin-1")
# More digits than a budget needs (the configured one caps it): no number past them is read,
# so a header of a thousand digits can neither overflow a float nor cost a conversion.
_BUDGET_DIGITS = 9


def _error_bytes(error: ErrorBody) -> bytes:
    """As JSONResponse renders an error body, the way every error of the API is sent."""
    content = error.model_dump()
    return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _header(scope: Scope, name: bytes) -> str | None:
    value = header(scope["headers"], name)
    return None if value is None else value.decode("latin-1")


def requested_budget_ms(raw: str | None) -> int | None:
    """The budget header's value; ValueError when it is not a positive integer."""
    if raw is None:
        return None
    text = raw.strip()
    digits = text.lstrip("0") if text.isascii() and text.isdigit() else ""
    if not digits:
        raise ValueError(f"{BUDGET_HEADER} must be a positive integer of milliseconds")
    return int(digits) if len(digits) <= _BUDGET_DIGITS else 10**_BUDGET_DIGITS


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
    return status, _error_bytes(error)


def content(
    ctx: RequestContext,
    answer_id: str,
    body: RecommendRequest,
    result: Recommendation,
    artifacts: ServingArtifacts,
    world: tuple[WorldStamp | None, WorldRole],
) -> dict[str, Any]:
    """The answer as RecommendResponse documents it: a field left unset there (the timings
    without debug) is left out here; a null that means something (`model.version` when
    Triton did not answer, an unscored item's `score`) is always sent."""
    stamp, role = world
    answer: dict[str, Any] = {
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
        "world": {"id": stamp.world_id if stamp is not None else "", "role": role.value},
        "cold_start": result.cold_start,
        "degraded": list(ctx.degraded),
    }
    if body.debug:
        answer["timings_ms"] = ctx.timings_ms
    return answer


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
    # Who may force a trace is asked only where traces are kept and one is asked for.
    wanted = services.traces is not None and (
        body.debug or (_header(scope, _TRACE) or "") not in ("", "0")
    )
    asking = Asking(
        state["request_id"],
        arrived=state.get("arrived", time.monotonic()),
        budget_ms=budget_ms,
        trace_wanted=wanted and debug_allowed(scope, services.settings.debug_token),
        described=lambda budget_s: _traced_request(body, budget_s),
    )
    try:
        answered = await answering.answer(services, body.query(), asking)
    except Exception:
        log.exception("request %s failed", asking.request_id)
        return _error(500, error_body("internal_error", "the request failed", asking.request_id))
    ctx = answered.ctx
    made = content(
        ctx,
        answered.answer_id,
        body,
        answered.result,
        answered.artifacts,
        (services.served.stamp, role),
    )
    sent = pydantic_core.to_json(made)
    # Counted once the answer is made: one that failed on the way is a 500, not an answer.
    state["outcome"] = Outcome.DEGRADED if ctx.degraded else Outcome.OK
    services.metrics.world_answer_count[role].inc()
    # Out of budget on the service's own budget (not one its caller shortened): the gate
    # lets this answer's service time teach the admission limit (app/api/gate.py).
    state["exhausted"] = ctx.time_for() <= 0.0 and not caller_shortened.get()
    return 200, sent


async def serve(scope: Scope, raw: bytes, send: Send) -> int | None:
    """Answer a /recommend whose body is valid and return its status; None, having sent
    nothing, for a body the route must answer (its validation names what is wrong)."""
    try:
        body = RecommendRequest.model_validate(json.loads(raw))
    except (ValueError, RecursionError, ValidationError):
        return None
    worlds: Worlds = scope["app"].state.worlds
    status, sent = await answer(worlds, body, scope)
    await send_json(send, status, sent)
    return status
