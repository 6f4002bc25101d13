"""POST /events: what users did, made durable in the event log for the ingest consumer."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.deps import ServicesDep
from app.api.errors import GATE_ERRORS, documented, error_body
from app.api.models import EventIn, EventsAccepted, EventsRequest
from app.core.errors import FeatureStoreError
from app.core.events import Event, EventOutcome
from app.core.throttled_log import ThrottledLog

router = APIRouter()
unavailable = ThrottledLog(logging.getLogger("recsys.events"))
RETRY_AFTER_S = "1"


EVENTS_ERRORS: dict[int | str, dict[str, Any]] = {
    **GATE_ERRORS,
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
    return Event(
        event_id=given.event_id,
        user_id=given.user_id,
        item_id=given.item_id,
        type=given.type,
        ts_ms=now_ms if given.ts is None else given.ts,
        value=given.value,
        request_id=given.request_id,
    )


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
    settings = services.settings
    now_ms = int(time.time() * 1000)
    latest_ms = now_ms + int(settings.event_max_future_ms)
    positions = services.artifacts.current.lookup([event.item_id for event in body.events])
    unknown: list[int] = []
    future: list[int] = []
    known: list[Event] = []
    for n, (given, position) in enumerate(zip(body.events, positions.tolist(), strict=True)):
        if position < 0:
            unknown.append(n)
        elif given.ts is not None and given.ts > latest_ms:
            future.append(n)
        else:
            known.append(_event(given, now_ms))
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
    return EventsAccepted(request_id=rid, accepted=len(known), unknown_items=unknown, future=future)
