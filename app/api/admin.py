"""/admin: reload and roll back the release, and change the worlds served, for callers
holding RECSYS_ADMIN_TOKEN.

Mounted only when a token is configured. With several workers a call reaches one of them:
it applies the change there and answers, and signals the others (SIGUSR1 through the
supervisor), which reload from the same files; their results are in the logs and in
`recsys_reloads_total` and `recsys_release_generation`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.api.access import Refused, operator, refused
from app.api.deps import ServicesDep, WorldsDep
from app.api.errors import GATE_ERRORS, documented, error_body, request_id_of
from app.api.models import CandidateWorld, ErrorBody, Release, WorldsState
from app.core.errors import ConfigError
from app.process.reload import RELOAD_SIGNAL, ReleaseReport, ReloadRefusedError
from app.process.services import Services
from app.process.worlds import WorldsReport, change_worlds, current_plan
from app.release.worlds import WorldRef, WorldsPlan

log = logging.getLogger(__name__)


async def require_token(request: Request, services: ServicesDep) -> Services:
    caller = operator(request.scope, services.settings.admin_token, loopback_without_token=False)
    if isinstance(caller, Refused):
        raise refused(caller)
    return services


AdminDep = Annotated[Services, Depends(require_token)]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("No bearer token, or not RECSYS_ADMIN_TOKEN."),
}
router = APIRouter(prefix="/admin", tags=["admin"], responses=ADMIN_ERRORS)


def _release(report: ReleaseReport) -> Release:
    return Release(**asdict(report))


def _refused(request: Request, code: str, exc: Exception) -> JSONResponse:
    """409: a check refused the change; what served still does."""
    body = error_body(code, str(exc), request_id_of(request))
    return JSONResponse(body.model_dump(), status_code=409)


def _tell_other_workers(services: Services) -> None:
    if services.settings.workers > 1:
        os.kill(os.getppid(), RELOAD_SIGNAL)


@router.get("/release", response_model=Release, summary="What this worker serves")
async def release(services: AdminDep) -> Release:
    return _release(services.served.reloader.report())


@router.post(
    "/reload",
    response_model=Release,
    responses={409: _error("A check failed; the release that was serving still is.")},
    summary="Read the release file, the world's files and the rules again, and serve them",
)
async def reload(request: Request, services: AdminDep) -> Release | JSONResponse:
    try:
        report = await services.served.reloader.reload()
    except ReloadRefusedError as exc:
        return _refused(request, "reload_refused", exc)
    _tell_other_workers(services)
    return _release(report)


@router.post(
    "/rollback",
    response_model=Release,
    summary="Stop the canary and the shadow: the stable version answers everyone",
)
async def rollback(services: AdminDep) -> Release:
    report = await services.served.reloader.roll_back()
    _tell_other_workers(services)
    return _release(report)


def _worlds(report: WorldsReport) -> WorldsState:
    return WorldsState(**asdict(report))


async def _changed(
    request: Request, services: Services, worlds: WorldsDep, plan: WorldsPlan
) -> WorldsState | JSONResponse:
    try:
        report = await change_worlds(worlds, plan)
    except ConfigError as exc:
        return _refused(request, "world_refused", exc)
    _tell_other_workers(services)
    return _worlds(report)


WORLD_ERRORS: dict[int | str, dict[str, Any]] = {
    409: _error("Refused (a check failed, or nothing to promote); what served still does."),
}
# What the gate answers before the candidate route runs (it takes a body).
CANDIDATE_ERRORS: dict[int | str, dict[str, Any]] = {
    **WORLD_ERRORS,
    **GATE_ERRORS,
    503: documented("Too many of the operator's calls in flight: try again (Retry-After)."),
}


@router.get("/worlds", response_model=WorldsState, summary="The worlds this worker serves")
async def worlds_state(services: AdminDep, worlds: WorldsDep) -> WorldsState:
    return _worlds(worlds.report())


@router.post(
    "/worlds/candidate",
    response_model=WorldsState,
    responses=CANDIDATE_ERRORS,
    summary="Serve a candidate world beside the stable one to a share of users (or change "
    "the share of the one served)",
)
async def load_candidate(
    body: CandidateWorld, request: Request, services: AdminDep, worlds: WorldsDep
) -> WorldsState | JSONResponse:
    ref = WorldRef(Path(body.artifacts_dir), body.key_prefix, body.model_name)
    plan = current_plan(worlds).with_candidate(ref, body.percent)
    return await _changed(request, services, worlds, plan)


@router.post(
    "/worlds/promote",
    response_model=WorldsState,
    responses=WORLD_ERRORS,
    summary="Make the candidate world stable for every user",
)
async def promote_world(
    request: Request, services: AdminDep, worlds: WorldsDep
) -> WorldsState | JSONResponse:
    try:
        plan = current_plan(worlds).promoted()
    except ConfigError as exc:
        return _refused(request, "world_refused", exc)
    return await _changed(request, services, worlds, plan)


@router.post(
    "/worlds/rollback",
    response_model=WorldsState,
    responses=WORLD_ERRORS,
    summary="Drop the candidate world: the stable one answers every user at once",
)
async def roll_back_world(
    request: Request, services: AdminDep, worlds: WorldsDep
) -> WorldsState | JSONResponse:
    return await _changed(request, services, worlds, current_plan(worlds).with_candidate(None))
