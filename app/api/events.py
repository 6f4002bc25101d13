"""POST /events: what users did, made durable in the event log for the ingest consumer."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.access import EventAccess, retry_after
from app.api.deps import ServicesDep
from app.api.errors import GATE_ERRORS, documented, error_body
from app.api.models import EventIn, EventsAccepted, EventsRequest
from app.core.errors import FeatureStoreError
from app.core.events import Event, EventOutcome, is_answer_id
from app.core.throttled_log import ThrottledLog
from app.core.vocabulary import Positions
from app.process.services import Services

router = APIRouter()
unavailable = ThrottledLog(logging.getLogger("recsys.events"))
RETRY_AFTER_S = "1"


EVENTS_ERRORS: dict[int | str, dict[str, Any]] = {
    **GATE_ERRORS,
    401: documented(
        "No bearer token, or not one of RECSYS_EVENT_CALLERS.",
        headers={"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    ),
    403: documented("No event callers are configured and the client is not on loopback."),
    429: documented(
        "The caller posted more events than its quota (RECSYS_EVENT_CALLER_RATE a second, "
        "RECSYS_EVENT_CALLER_BURST at once): nothing was written; send again after the delay.",
        headers={"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    ),
    422: documented(
        "An event is invalid; the batch is refused whole and `fields` names each bad field "
        "(at most 20) as events.N.field."
    ),
    503: documented(
        "The event log (Redis) did not take the batch, or this worker has as many batches "
        "in flight as it takes: nothing was written; send the batch again after the delay.",
        headers={"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    ),
}


def _event(given: EventIn, now_ms: int) -> Event:
    answer = given.answer
    return Event(
        event_id=given.event_id,
        user_id=given.user_id,
        item_id=given.item_id,
        type=given.type,
        ts_ms=now_ms if given.ts is None else given.ts,
        value=given.value,
        answer_id=answer if answer is not None and is_answer_id(answer) else None,
    )


def _uncredited(given: EventIn) -> bool:
    answer = given.answer
    return answer is not None and not is_answer_id(answer)


async def _positions(services: Services, ids: list[str]) -> Positions:
    """Each item's position; an item put a moment ago is known too (the log is read again)."""
    positions = services.served.artifacts.current.lookup(ids)
    follower = services.served.catalog_follower
    if follower is None or (positions >= 0).all():
        return positions
    try:
        await follower.catch_up(services.settings.event_append_timeout_s)
    except FeatureStoreError:
        return positions
    return services.served.artifacts.current.lookup(ids)


@router.post(
    "/events",
    status_code=202,
    response_model=EventsAccepted,
    responses=EVENTS_ERRORS,
    summary="Record what users did; their next answers reflect it within about a second",
)
async def post_events(
    body: EventsRequest, request: Request, services: ServicesDep
) -> EventsAccepted | JSONResponse:
    rid: str = request.state.request_id
    access: EventAccess = request.app.state.event_access
    wait_s = access.admit(request.state.caller, len(body.events))
    if wait_s > 0.0:
        message = f"over this caller's quota: nothing was written; retry in {wait_s:.1f} s"
        error = error_body("over_quota", message, rid)
        headers = {"Retry-After": retry_after(wait_s)}
        return JSONResponse(error.model_dump(), status_code=429, headers=headers)
    settings = services.settings
    now_ms = int(time.time() * 1000)
    latest_ms = now_ms + int(settings.event_max_future_ms)
    earliest_ms = now_ms - int(settings.event_max_age_ms)
    positions = await _positions(services, [event.item_id for event in body.events])
    unknown: list[int] = []
    future: list[int] = []
    stale: list[int] = []
    known: list[Event] = []
    for n, (given, position) in enumerate(zip(body.events, positions.tolist(), strict=True)):
        if position < 0:
            unknown.append(n)
        elif given.ts is not None and given.ts > latest_ms:
            future.append(n)
        elif given.ts is not None and given.ts < earliest_ms:
            stale.append(n)
        else:
            known.append(_event(given, now_ms))
    uncredited = sum(1 for given in body.events if _uncredited(given))
    try:
        if known:
            await services.events.append(known, settings.event_append_timeout_s)
    except FeatureStoreError as exc:
        unavailable.warning(exc.kind, "events not appended (%s): %s", exc.kind, exc)
        error = error_body("event_log_unavailable", f"nothing was written: {exc}", rid)
        headers = {"Retry-After": RETRY_AFTER_S}
        return JSONResponse(error.model_dump(), status_code=503, headers=headers)
    counted = services.metrics.event_count
    counted[EventOutcome.ACCEPTED].inc(len(known))
    counted[EventOutcome.UNKNOWN_ITEM].inc(len(unknown))
    counted[EventOutcome.FUTURE].inc(len(future))
    counted[EventOutcome.STALE].inc(len(stale))
    services.metrics.uncredited.inc(uncredited)
    return EventsAccepted(
        request_id=rid,
        accepted=len(known),
        unknown_items=unknown,
        future=future,
        stale=stale,
        uncredited=uncredited,
    )
