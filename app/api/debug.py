"""/debug: the traces of recent requests and "why not item X?", as pages and as JSON.

Mounted only with RECSYS_DEBUG_PAGES=true. It answers a caller holding RECSYS_DEBUG_TOKEN
(`Authorization: Bearer`; the HTML pages also take Basic with the token as the password,
which a browser asks for); where no token is set, only a caller on the loopback interface.
User ids appear in traces, so nothing here is for the public port. Every response carries
a Content-Security-Policy that allows no script, no frame and no other origin.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from app.api.access import bearer, bearer_or_basic_password, holds, loopback
from app.api.debug_pages import trace_list, trace_page, why_page
from app.api.deps import ServicesDep
from app.pipeline.explain import EXPLAIN_ITEMS, explain_item
from app.pipeline.trace import Trace, TraceRing
from app.pipeline.types import Moment
from app.process.services import Services

_BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="recsys debug"'}


def _check(request: Request, services: Services, sent: str, challenge: dict[str, str]) -> None:
    expected = services.settings.debug_token
    if expected is None:
        if not loopback(request.scope):
            raise HTTPException(
                status_code=403,
                detail="without RECSYS_DEBUG_TOKEN the debug pages answer on loopback only",
            )
        return
    if not holds(sent, expected):
        raise HTTPException(
            status_code=401,
            detail="send the debug token: Authorization: Bearer <RECSYS_DEBUG_TOKEN>"
            + (", or as the browser's sign-in password" if challenge is _BASIC_CHALLENGE else ""),
            headers=challenge,
        )


async def require_page_access(request: Request, services: ServicesDep) -> Services:
    """The pages: the token as a bearer, or as the password a browser's sign-in sends."""
    _check(request, services, bearer_or_basic_password(request.scope), _BASIC_CHALLENGE)
    return services


async def require_json_access(request: Request, services: ServicesDep) -> Services:
    """The JSON routes: a bearer only, which a browser never sends by itself, so no page
    elsewhere can spend an operator's cached sign-in on them."""
    _check(request, services, bearer(request.scope), {"WWW-Authenticate": "Bearer"})
    return services


DebugDep = Annotated[Services, Depends(require_page_access)]
JsonDep = Annotated[Services, Depends(require_json_access)]
router = APIRouter(prefix="/debug", tags=["debug"], include_in_schema=False)


def _ring(services: Services) -> TraceRing:
    ring = services.traces
    if ring is None:  # mounted only with a ring; said for the type checker
        raise HTTPException(status_code=404, detail="the debug pages are off")
    return ring


def _found(services: Services, request_id: str) -> Trace:
    trace = _ring(services).find(request_id)
    if trace is None:
        raise HTTPException(
            status_code=404,
            detail=f"no trace of {request_id!r} in this process (a worker keeps its own, "
            "the latest few hundred)",
        )
    return trace


def _summary(trace: Trace) -> dict[str, Any]:
    return {
        "request_id": trace.request_id,
        "at": trace.at,
        "user_id": trace.request.get("user_id"),
        "total_ms": trace.total_ms,
        "degraded": [d["flag"] for d in trace.degraded],
        "model": trace.model,
    }


@router.get("/", response_class=HTMLResponse)
async def recent_page(services: DebugDep) -> str:
    return trace_list(_ring(services).recent())


@router.get("/traces")
async def recent_traces(services: JsonDep) -> list[dict[str, Any]]:
    return [_summary(trace) for trace in _ring(services).recent()]


@router.get("/traces/{request_id}")
async def one_trace(request_id: str, services: JsonDep) -> dict[str, Any]:
    return dataclasses.asdict(_found(services, request_id))


@router.get("/trace/{request_id}", response_class=HTMLResponse)
async def one_trace_page(request_id: str, services: DebugDep) -> str:
    return trace_page(_found(services, request_id))


Required = Annotated[str, Query(min_length=1, max_length=128)]
Label = Annotated[str, Query(max_length=32)]
Hour = Annotated[int | None, Query(ge=0, le=23)]
Weekday = Annotated[int | None, Query(ge=0, le=6)]
Count = Annotated[int, Query(ge=1, le=200)]


@dataclasses.dataclass(frozen=True, slots=True)
class _Asked:
    """An explain request: the user, the item, and the request it explains."""

    user_id: str
    item_id: str
    moment: Moment
    num_items: int


async def _explained(services: Services, asked: _Asked) -> dict[str, Any]:
    # Outside /recommend's admission, and each one a whole answer plus a catalog scan:
    # a few at once, the rest refused.
    gate = services.explaining
    if gate.locked():
        raise HTTPException(
            status_code=503,
            detail="as many explanations are running as RECSYS_DEBUG_EXPLAIN_IN_FLIGHT allows",
            headers={"Retry-After": "1"},
        )
    async with gate:
        return await _explain(services, asked)


async def _explain(services: Services, asked: _Asked) -> dict[str, Any]:
    trace, explanation = await explain_item(
        services.served.pipeline,
        services.served.artifacts.current,
        services.metrics,
        (services.budget_s(None), services.settings.reserve_s),
        asked.user_id,
        asked.item_id,
        asked.moment,
        asked.num_items,
    )
    _ring(services).keep(trace)
    return explanation.as_dict(trace)


def _moment(device: str, page: str, locale: str, hour: int | None, weekday: int | None) -> Moment:
    return Moment(device or "other", page or "other", locale or "other", hour, weekday)


@router.get("/explain")
async def explain(
    services: JsonDep,
    user_id: Required,
    item_id: Required,
    device: Label = "",
    page: Label = "",
    locale: Label = "",
    hour: Hour = None,
    weekday: Weekday = None,
    num_items: Count = EXPLAIN_ITEMS,
) -> dict[str, Any]:
    moment = _moment(device, page, locale, hour, weekday)
    return await _explained(services, _Asked(user_id, item_id, moment, num_items))


@router.get("/why", response_class=HTMLResponse)
async def why(
    services: DebugDep,
    user_id: Annotated[str, Query(max_length=128)] = "",
    item_id: Annotated[str, Query(max_length=128)] = "",
    device: Label = "",
    page: Label = "",
    locale: Label = "",
) -> str:
    fields = {"user_id": user_id, "item_id": item_id, "device": device, "page": page}
    if not user_id or not item_id:
        error = None if not (user_id or item_id) else "give both a user and an item"
        return why_page(fields, None, error)
    moment = _moment(device, page, locale, None, None)
    answer = await _explained(services, _Asked(user_id, item_id, moment, EXPLAIN_ITEMS))
    return why_page(fields, answer, None)
