"""/catalog: items put into the catalog while serving, and withdrawn from it.

Callers hold RECSYS_ADMIN_TOKEN (with none configured, loopback only). A change is
acknowledged once the catalog's change log holds it and this process applied it: every
other process applies it within RECSYS_CATALOG_FOLLOW_MS, and any request that begins after
a withdrawal's acknowledgement reads the number of the last batch that withdrew with the
user's features and applies what it lacks first, so a withdrawn item is in no answer from
then on (app.clients.catalog_log, app.process.catalog_follower).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse

from app.api.access import Refused, operator, refused
from app.api.catalog_models import (
    CatalogChanged,
    CatalogState,
    ItemIn,
    ItemPut,
    ItemsIn,
    WithdrawalsIn,
)
from app.api.deps import ServicesDep
from app.api.errors import GATE_ERRORS, documented, error_body, request_id_of
from app.api.models import ErrorField
from app.clients.catalog_log import Accepted
from app.core.errors import CatalogChangeRefusedError, FeatureStoreError
from app.process.services import Services
from app.release.arrivals import CatalogRoom, ItemChange, Withdrawal
from app.release.artifacts import ServingArtifacts

CHANGE_TIMEOUT_S = 2.0
SEND_AGAIN = "send it again (the same change twice changes nothing more)"


async def allowed(request: Request, services: ServicesDep) -> Services:
    caller = operator(request.scope, services.settings.admin_token, loopback_without_token=True)
    if isinstance(caller, Refused):
        raise refused(caller)
    return services


CatalogDep = Annotated[Services, Depends(allowed)]
CATALOG_ERRORS: dict[int | str, dict[str, Any]] = {
    **GATE_ERRORS,
    413: documented("The body is larger than RECSYS_CATALOG_MAX_BODY_BYTES."),
    401: documented("No bearer token, or not RECSYS_ADMIN_TOKEN."),
    404: documented("An item to withdraw is not in the catalog, or changes are off."),
    409: documented("No room for more added items until the next world takes them in."),
    422: documented("A field is invalid (named in `fields`): nothing was applied."),
    503: documented(
        "Redis did not confirm the change (`catalog_unavailable`: it may or may not be in "
        "the log), the change is in the log but was not confirmed applied "
        "(`catalog_unconfirmed`, the message names its batch), or too many of the "
        "operator's calls are in flight (`overloaded`, with Retry-After): send it again."
    ),
}
router = APIRouter(prefix="/catalog", tags=["catalog"], responses=CATALOG_ERRORS)


class InvalidChangeError(Exception):
    def __init__(self, fields: list[ErrorField]) -> None:
        self.fields = fields


def _refusal(
    status: int, code: str, message: str, rid: str, fields: list[ErrorField]
) -> JSONResponse:
    body = error_body(code, message, rid, fields)
    return JSONResponse(body.model_dump(), status_code=status)


def _change(
    n: int, given: ItemIn, artifacts: ServingArtifacts, position: int, now: int
) -> ItemChange:
    """The change the log will carry, or InvalidChangeError naming each field at fault."""
    schema, catalog = artifacts.schema, artifacts.catalog
    where = f"items.{n}"
    problems: list[ErrorField] = []
    prior = catalog.prior
    codes = [] if prior is None else [prior.code(name) for name in given.categories]
    if prior is None:
        problems.append(
            ErrorField(
                field=f"{where}.categories", message="this world has no category names (rebuild it)"
            )
        )
    for k, code in enumerate(codes):
        if code is None:
            problems.append(
                ErrorField(field=f"{where}.categories.{k}", message="not a category of this world")
            )
    unknown = sorted(set(given.dense) - set(schema.item_dense))
    for name in unknown:
        problems.append(
            ErrorField(
                field=f"{where}.dense.{name}",
                message=f"not an item dense feature ({', '.join(schema.item_dense)})",
            )
        )
    if problems:
        raise InvalidChangeError(problems)
    known = [code for code in codes if code is not None]
    dense = np.asarray([given.dense.get(name, 0.0) for name in schema.item_dense], np.float32)
    guessed = given.embedding is None
    if given.embedding is not None:
        embedding = [float(v) for v in given.embedding]
    else:
        assert prior is not None
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below
            embedding = prior.vector(known, given.title, dense).tolist()
    change = ItemChange(
        item_id=given.item_id,
        position=position,
        title=given.title,
        categories=tuple(given.categories),
        category=known[0],
        published_at=now if given.published_at is None else given.published_at,
        dense=tuple(float(v) for v in dense.tolist()),
        embedding=tuple(embedding),
        guessed=guessed,
    )
    _check_fits(change, catalog.room, where)
    return change


def _check_fits(change: ItemChange, room: CatalogRoom | None, where: str) -> None:
    """InvalidChangeError unless every process's room can store `change`, as each checks
    it before applying (a guessed vector included: it comes from the dense values)."""
    problem = None if room is None else room.change_problem(change)
    if problem is None:
        return
    name, message = problem
    if name == "embedding" and change.guessed:
        name, message = "dense", f"the world's guess of the vector from these: {message}"
    raise InvalidChangeError([ErrorField(field=f"{where}.{name}", message=message)])


def _changes(body: ItemsIn, artifacts: ServingArtifacts) -> list[ItemChange]:
    """One change per item id; the same id twice with other attributes is refused."""
    world = artifacts.catalog.world_size
    found = artifacts.lookup([given.item_id for given in body.items])
    now = int(time.time())
    first: dict[str, ItemIn] = {}
    changes: list[ItemChange] = []
    problems: list[ErrorField] = []
    for n, (given, position) in enumerate(zip(body.items, found.tolist(), strict=True)):
        earlier = first.setdefault(given.item_id, given)
        if earlier is not given:
            if earlier != given:
                problems.append(
                    ErrorField(
                        field=f"items.{n}.item_id", message="given twice, with other attributes"
                    )
                )
            continue
        try:
            changes.append(
                _change(n, given, artifacts, position if 0 <= position < world else -1, now)
            )
        except InvalidChangeError as exc:
            problems += exc.fields
    if problems:
        raise InvalidChangeError(problems)
    return changes


async def _accepted(
    services: Services, puts: list[ItemChange], withdrawals: list[Withdrawal], rid: str
) -> Accepted | JSONResponse:
    changes, follower = services.served.catalog_log, services.served.catalog_follower
    assert changes is not None
    assert follower is not None
    catalog = services.served.artifacts.current.catalog
    room = catalog.room
    assert room is not None
    try:
        accepted = await changes.append(
            puts, withdrawals, room.base, room.capacity, CHANGE_TIMEOUT_S
        )
    except CatalogChangeRefusedError as exc:
        status = 409 if exc.field == "items" else 404
        field = ErrorField(field=exc.field, message=str(exc))
        return _refusal(
            status, "catalog_full" if status == 409 else "unknown_item", str(exc), rid, [field]
        )
    except FeatureStoreError as exc:
        message = f"Redis did not confirm the change, which may or may not be in the log: {exc}"
        return _refusal(503, "catalog_unavailable", f"{message}; {SEND_AGAIN}", rid, [])
    try:
        if puts:
            await changes.write_features(puts, CHANGE_TIMEOUT_S)
        await follower.at_least(accepted.seq, CHANGE_TIMEOUT_S)
    except FeatureStoreError as exc:
        message = (
            f"the change is in the log as batch {accepted.seq} and every process applies it, "
            f"but it was not confirmed here ({exc}); {SEND_AGAIN}"
        )
        return _refusal(503, "catalog_unconfirmed", message, rid, [])
    return accepted


async def _current(services: Services) -> ServingArtifacts:
    """The artifacts with every change the log holds: ids put earlier are known."""
    follower = services.served.catalog_follower
    if follower is None:
        raise HTTPException(
            status_code=404, detail="catalog changes are off (RECSYS_CATALOG_HEADROOM=0)"
        )
    await follower.catch_up(CHANGE_TIMEOUT_S)
    return services.served.artifacts.current


@router.get("", response_model=CatalogState, summary="What this process holds of the log")
async def catalog_state(services: CatalogDep) -> CatalogState:
    await _current(services)
    room = services.served.artifacts.current.catalog.room
    assert room is not None  # _current answered 404 otherwise
    return CatalogState(
        batch=room.seq,
        world_items=room.base,
        added=room.added,
        withdrawn=room.withdrawals,
        room=room.capacity - room.added,
        digest=room.digest(),
    )


@router.post(
    "/items", response_model=CatalogChanged, summary="Add items, or replace their attributes"
)
async def put_items(
    body: ItemsIn, request: Request, services: CatalogDep
) -> CatalogChanged | JSONResponse:
    rid = request_id_of(request)
    try:
        artifacts = await _current(services)
        puts = _changes(body, artifacts)
    except InvalidChangeError as exc:
        return _refusal(422, "invalid_request", "nothing was applied", rid, exc.fields)
    except FeatureStoreError as exc:
        return _refusal(503, "catalog_unavailable", f"nothing was applied: {exc}", rid, [])
    accepted = await _accepted(services, puts, [], rid)
    if isinstance(accepted, JSONResponse):
        return accepted
    items = [
        ItemPut(item_id=change.item_id, position=position, guessed=change.guessed)
        for change, position in zip(puts, accepted.positions, strict=False)
    ]
    return CatalogChanged(request_id=rid, batch=accepted.seq, items=items)


@router.post(
    "/withdrawals",
    response_model=CatalogChanged,
    summary="Withdraw items: in no answer from the acknowledgement on",
)
async def withdraw(
    body: WithdrawalsIn, request: Request, services: CatalogDep
) -> CatalogChanged | JSONResponse:
    rid = request_id_of(request)
    try:
        artifacts = await _current(services)
    except FeatureStoreError as exc:
        return _refusal(503, "catalog_unavailable", f"nothing was applied: {exc}", rid, [])
    ids = list(dict.fromkeys(body.item_ids))
    world = artifacts.catalog.world_size
    found = artifacts.lookup(ids).tolist()
    withdrawals = [
        Withdrawal(i, p if 0 <= p < world else -1) for i, p in zip(ids, found, strict=True)
    ]
    accepted = await _accepted(services, [], withdrawals, rid)
    if isinstance(accepted, JSONResponse):
        return accepted
    return CatalogChanged(request_id=rid, batch=accepted.seq, withdrawn=ids)
